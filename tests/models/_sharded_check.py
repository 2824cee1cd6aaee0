"""Run by test_sharding.py in a fresh process with 8 simulated CPU devices:
sharded (fsdp x tensor) logits and gradients must equal the single-device ones."""

from __future__ import annotations

import os
import sys
import tempfile

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marljax.models import (  # noqa: E402
    ModelConfig,
    batch_sharding,
    forward,
    from_pretrained,
    get_params,
    make_mesh,
    param_dict_shardings,
    positions_from_mask,
    save_pretrained,
    shard_model,
    token_logprobs,
)
from marljax.testing import random_model  # noqa: E402

assert jax.device_count() == 8, jax.devices()
TOL = 1e-5


def loss_and_logits(params, ids, pos, mask, config):
    logits, _ = forward(params, ids, config=config, positions=pos, attention_mask=mask)
    lp = token_logprobs(
        params, ids, jnp.roll(ids, -1, 1), config=config, positions=pos, attention_mask=mask, chunk_size=4
    )
    return -(lp * mask).sum() / mask.sum() + 1e-3 * (logits**2).mean(), logits


def check(preset: str, fsdp: int, tensor: int, **changes):
    cfg = ModelConfig.preset(preset, **changes)
    rng = np.random.RandomState(0)
    ids = jnp.asarray(rng.randint(3, cfg.vocab_size, (8, 12)))
    mask = jnp.asarray(np.arange(12)[None] >= rng.randint(0, 5, (8, 1)))  # left padding
    pos = positions_from_mask(mask)
    step = jax.jit(jax.value_and_grad(loss_and_logits, has_aux=True), static_argnames="config")

    model = random_model(cfg, seed=1)
    (loss1, logits1), grads1 = step(get_params(model), ids, pos, mask, config=cfg)

    mesh = make_mesh(fsdp=fsdp, tensor=tensor)
    sharded = shard_model(random_model(cfg, seed=1), mesh)
    params = get_params(sharded)
    # parameters really are split: q heads over tensor, hidden over fsdp
    assert params["layers"]["wq"].sharding.spec == P(None, "fsdp", "tensor"), params["layers"]["wq"].sharding
    assert len(params["layers"]["wq"].addressable_shards) == 8
    # the shardings computed from the config alone (the abstract model) are the placed ones
    for (path, a), s in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(param_dict_shardings(cfg, mesh))
    ):
        assert a.sharding.is_equivalent_to(s, a.ndim), (jax.tree_util.keystr(path), s)
    bs = batch_sharding(mesh)
    (loss2, logits2), grads2 = step(params, *(jax.device_put(x, bs) for x in (ids, pos, mask)), config=cfg)
    assert len(logits2.sharding.device_set) == 8
    np.testing.assert_allclose(logits2, logits1, atol=TOL, rtol=0)
    np.testing.assert_allclose(loss2, loss1, atol=TOL, rtol=0)
    for (path, g1), g2 in zip(jax.tree_util.tree_leaves_with_path(grads1), jax.tree.leaves(grads2)):
        np.testing.assert_allclose(g2, g1, atol=TOL, rtol=0, err_msg=jax.tree_util.keystr(path))
    assert (
        float(jnp.abs(logits1).std()) > 0.5
        and max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads1)) > 1e-3
    )

    # from_pretrained with a mesh places every tensor with its sharding and the same values
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d)
        loaded, _ = from_pretrained(d, mesh=mesh)
    lp = get_params(loaded)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(lp), jax.tree.leaves(params)):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (jax.tree_util.keystr(path), a.sharding)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    print(f"{preset} fsdp={fsdp} tensor={tensor}: OK")


if __name__ == "__main__":
    # one compile-heavy case covering the most switches: q/k norm, head_dim != hidden/heads,
    # q/k/v/o biases, untied lm_head (vocab over tensor), GQA 2
    check("tiny-qwen3", fsdp=4, tensor=2, tie_word_embeddings=False, qkv_bias=True, o_bias=True)
    sys.exit(0)
