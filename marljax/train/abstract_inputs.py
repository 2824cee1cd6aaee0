"""A policy's program inputs as abstract arrays: `jax.ShapeDtypeStruct`s with their shardings,
shaped and laid out as the trainer and the sampler make the real ones, so that a program can be
lowered and compiled for a device topology without loading or allocating anything
(`marljax.train.aot`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from marljax.models.config import ModelConfig
from marljax.models.decoder import abstract_model, param_dict_shardings


def model_config(spec: Any) -> ModelConfig:
    """The `ModelConfig` of a policy's model spec: a preset, or a checkpoint's `config.json` only."""
    runtime = dict(
        dtype=spec.dtype,
        param_dtype=spec.param_dtype,
        remat=spec.remat,
        attention_impl=spec.attention_impl,
        scan_layers=spec.scan_layers,
    )
    if spec.path is None:
        return ModelConfig.preset(spec.preset, **runtime)
    from marljax.models.hf_io import _read_config

    return _read_config(Path(spec.path), **runtime)


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_params(config: ModelConfig, mesh: Mesh) -> dict:
    """The parameter dict (`get_params` layout) as abstract arrays laid out by the rule table."""
    shapes = nnx.to_pure_dict(nnx.state(abstract_model(config), nnx.Param))
    return _abstract(shapes, param_dict_shardings(config, mesh))


def replicated(tree: Any, mesh: Mesh) -> Any:
    """`tree`'s arrays as abstract arrays whole on every device of `mesh`."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())), tree
    )


def abstract_opt_state(optimizer: optax.GradientTransformation, params: dict, mesh: Mesh) -> Any:
    """`optimizer.init(params)` as abstract arrays: each moment laid out like its parameter (the
    state leaf whose key path ends with the parameter's), counters replicated (as `Policy` commits
    them)."""
    state = jax.eval_shape(optimizer.init, params)
    by_path = {tuple(path): x for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    whole = NamedSharding(mesh, P())

    def place(path, s):
        for n in range(len(path)):
            p = by_path.get(tuple(path[n:]))
            if p is not None and p.shape == s.shape:
                return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p.sharding)
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=whole)

    return jax.tree_util.tree_map_with_path(place, state)


def abstract_batch(
    micro_batches: int, micro_batch_size: int, seq_len: int, mesh: Mesh, extra: Sequence[str] = ()
) -> dict:
    """`collate`'s batch `[M, mb, T]` (and `[M, mb]` per-row values) as abstract arrays, rows over
    `("data", "fsdp")` as `Policy._collate` places them; `extra`: `old_logp`, `ref_logp`,
    `lora_seed` where the policy's update adds them."""
    rows = NamedSharding(mesh, P(None, ("data", "fsdp")))
    M, mb, T = micro_batches, micro_batch_size, seq_len
    kinds = {
        "tokens": ((M, mb, T), jnp.int32),
        "labels": ((M, mb, T), jnp.int32),
        "positions": ((M, mb, T), jnp.int32),
        "attention_mask": ((M, mb, T), jnp.bool_),
        "loss_mask": ((M, mb, T), jnp.bool_),
        "sampling_logp": ((M, mb, T), jnp.float32),
        "advantages": ((M, mb), jnp.float32),
        "temperature": ((M, mb), jnp.float32),
        **{k: ((M, mb, T), jnp.float32) for k in ("old_logp", "ref_logp") if k in extra},
    }
    out = {k: jax.ShapeDtypeStruct(s, d, sharding=rows) for k, (s, d) in kinds.items()}
    if "lora_seed" in extra:
        out["lora_seed"] = jax.ShapeDtypeStruct((M,), jnp.uint32, sharding=NamedSharding(mesh, P()))
    return out


def abstract_tables(buckets) -> Any:
    """The sampler's `Tables` (EOS ids, stop sequences, seed) at the sizes `buckets` gives their
    shortest buckets."""
    from marljax.sampler.schedule import Tables, next_bucket

    E, NS, Ls = buckets.min_eos, next_bucket(1, buckets.min_stop), next_bucket(1, buckets.min_stop_len)
    return Tables(
        eos=jax.ShapeDtypeStruct((E,), jnp.int32),
        stop_seqs=jax.ShapeDtypeStruct((NS, Ls), jnp.int32),
        stop_valid=jax.ShapeDtypeStruct((NS, Ls), jnp.bool_),
        stop_active=jax.ShapeDtypeStruct((NS,), jnp.bool_),
        seed=jax.ShapeDtypeStruct((), jnp.uint32),
    )
