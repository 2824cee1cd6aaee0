"""LoRA in the layer maths (`marljax.models.lora`): a new adapter computes the base exactly; a
trained one equals the base with `W + scale A B` merged in (an independent computation of the
same function); rows of different adapters in one batch equal each adapter run alone, in the
full forward and in the sampler's `extend_step`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax.models import ModelConfig, forward, get_params
from marljax.models.decode import decode_weights, extend_step, init_decode_cache
from marljax.models.lora import LoraSpec, init_adapter, merge, stack_adapters
from marljax.testing import random_model

fwd = jax.jit(forward, static_argnames="config")


def _trained(cfg, spec, seed):
    """An adapter with random (non-zero) `b`, as after some training."""
    ad = init_adapter(cfg, spec, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 100), len(ad)))
    return {n: {"a": w["a"], "b": 0.05 * jax.random.normal(next(keys), w["b"].shape)} for n, w in ad.items()}


@pytest.fixture(scope="module")
def base():
    cfg = ModelConfig.preset("tiny-qwen2")  # untied head, q/k/v biases
    params = get_params(random_model(cfg))
    ids = jnp.asarray(np.random.RandomState(0).randint(3, cfg.vocab_size, (3, 9)))
    return cfg, params, ids


def test_new_adapter_computes_the_base_exactly(base):
    cfg, params, ids = base
    spec = LoraSpec(rank=4, alpha=8.0)
    ad = init_adapter(cfg, spec, jax.random.key(1))
    assert all(float(jnp.abs(w["a"]).max()) > 0 for w in ad.values())  # A is random, B is zero
    assert all(float(jnp.abs(w["b"]).max()) == 0 for w in ad.values())
    plain, _ = fwd(params, ids, config=cfg)
    with_lora, _ = fwd({**params, "lora": stack_adapters([(spec, ad)])}, ids, config=cfg)
    np.testing.assert_array_equal(np.asarray(with_lora), np.asarray(plain))


@pytest.mark.parametrize("targets", [("q", "k", "v", "o", "gate", "up", "down"), ("v", "down")])
def test_adapter_equals_merged_weights(base, targets):
    cfg, params, ids = base
    spec = LoraSpec(rank=3, alpha=6.0, targets=targets)
    ad = _trained(cfg, spec, 2)
    got, _ = fwd({**params, "lora": stack_adapters([(spec, ad)])}, ids, config=cfg)
    want, _ = fwd(merge(params, spec, ad), ids, config=cfg)
    plain, _ = fwd(params, ids, config=cfg)
    assert float(jnp.abs(want - plain).max()) > 1e-2  # the adapter does change the model
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def _three_adapters(cfg):
    """Adapters of different ranks, scales and targets on one base."""
    specs = [
        LoraSpec(rank=2, alpha=4.0),
        LoraSpec(rank=5, alpha=5.0, targets=("q", "v")),
        LoraSpec(rank=3, alpha=1.0, targets=("o", "gate", "up", "down")),
    ]
    return [(s, _trained(cfg, s, 10 + i)) for i, s in enumerate(specs)]


def test_rows_of_different_adapters_equal_each_adapter_alone(base):
    cfg, params, ids = base
    adapters = _three_adapters(cfg)
    stacked = {**params, "lora": stack_adapters(adapters)}
    rows = jnp.asarray([2, 0, 1])  # row b uses adapter rows[b]
    got, _ = fwd(stacked, ids, config=cfg, adapter_ids=rows)
    for b, a in enumerate(np.asarray(rows)):
        alone, _ = fwd({**params, "lora": stack_adapters([adapters[a]])}, ids[b : b + 1], config=cfg)
        np.testing.assert_allclose(got[b], alone[0], atol=2e-5, rtol=0)


@pytest.mark.parametrize("fuse", [False, True])
def test_extend_step_with_per_row_adapters_equals_the_forward(base, fuse):
    cfg, params, ids = base
    adapters = _three_adapters(cfg)
    stacked = {**params, "lora": stack_adapters(adapters)}
    rows = jnp.asarray([1, 2, 0])
    full, _ = fwd(stacked, ids, config=cfg, adapter_ids=rows)
    B, T = ids.shape
    step = jax.jit(functools.partial(extend_step, config=cfg))
    weights = decode_weights(stacked, cfg, fuse)
    kv = init_decode_cache(cfg, B, 16)
    logits, kv = step(
        weights, ids[:, :5], jnp.zeros(B, jnp.int32), jnp.full(B, 5, jnp.int32), kv, adapter=rows
    )
    np.testing.assert_allclose(logits, full[:, 4], atol=2e-5, rtol=0)
    for t in range(5, T):  # one-token decode steps
        logits, kv = step(
            weights, ids[:, t : t + 1], jnp.full(B, t, jnp.int32), jnp.ones(B, jnp.int32), kv, adapter=rows
        )
        np.testing.assert_allclose(logits, full[:, t], atol=2e-5, rtol=0)


def test_bad_spec_names_the_problem():
    with pytest.raises(ValueError, match="targets"):
        LoraSpec(rank=4, alpha=8, targets=("q", "mlp"))
    with pytest.raises(ValueError, match="rank"):
        LoraSpec(rank=0, alpha=8)


def test_dropout_acts_on_the_adapter_path_only(base):
    from marljax.models.decoder import hidden_states

    cfg, params, ids = base
    spec = LoraSpec(rank=3, alpha=6.0)
    hs = jax.jit(hidden_states, static_argnames="config")
    key = jax.random.key(7)
    fresh = {**params, "lora": stack_adapters([(spec, init_adapter(cfg, spec, jax.random.key(1)))])}
    plain, _ = hs(params, ids, config=cfg)
    dropped, _ = hs(fresh, ids, config=cfg, lora_dropout=(0.5, key))
    np.testing.assert_array_equal(np.asarray(dropped), np.asarray(plain))  # b = 0: nothing to drop
    trained = {**params, "lora": stack_adapters([(spec, _trained(cfg, spec, 3))])}
    full, _ = hs(trained, ids, config=cfg)
    one, _ = hs(trained, ids, config=cfg, lora_dropout=(0.5, key))
    again, _ = hs(trained, ids, config=cfg, lora_dropout=(0.5, key))
    other, _ = hs(trained, ids, config=cfg, lora_dropout=(0.5, jax.random.key(8)))
    np.testing.assert_array_equal(np.asarray(one), np.asarray(again))  # the key decides the mask
    assert float(jnp.abs(one - full).max()) > 1e-3 and float(jnp.abs(one - other).max()) > 1e-3
