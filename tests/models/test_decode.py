"""`extend_step` (`marljax.models.decode`): prompts run into per-row cache positions, then
one-token steps, in the decode cache layout with separate or fused weights, give the logits
of the full forward."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax.models import ModelConfig, forward, get_params
from marljax.models.decode import LAYOUTS, decode_weights, extend_step, init_decode_cache
from marljax.testing import random_model


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-qwen3"])  # untied + biases; tied + q/k norm
def test_extend_then_decode_steps_equal_the_full_forward(preset, fuse, layout):
    cfg = ModelConfig.preset(preset)
    params = get_params(random_model(cfg))
    rng = np.random.RandomState(0)
    B, T, S = 3, 10, 16  # rows, tokens, cache positions
    prompt = np.array([6, 3, 4])  # each row's prompt length: rows sit at different positions
    ids = jnp.asarray(rng.randint(3, cfg.vocab_size, (B, T)))
    full, _ = jax.jit(forward, static_argnames="config")(params, ids, config=cfg)

    weights = decode_weights(params, cfg, fuse)
    assert ("wqkv" in weights["layers"][0]) == fuse
    step = jax.jit(functools.partial(extend_step, config=cfg, layout=layout))
    kv = init_decode_cache(cfg, B, S, layout=layout)
    K, H = cfg.num_kv_heads, cfg.head_dim
    if layout == "split":
        assert kv[0].shape == (B, K, H, S) and kv[1].shape == (B, K, S, H)
    else:
        assert kv[0].shape == kv[1].shape == (B, S, K, H)
    # the prompts in two pieces: 2 tokens, then the rest (a cached prefix and its suffix)
    logits, kv = step(weights, ids[:, :2], jnp.zeros(B, jnp.int32), jnp.full(B, 2, jnp.int32), kv)
    np.testing.assert_allclose(logits, full[:, 1], atol=1e-5, rtol=0)
    rest = np.full((B, 4), 0)
    for b in range(B):
        rest[b, : prompt[b] - 2] = np.asarray(ids[b, 2 : prompt[b]])
    logits, kv = step(weights, jnp.asarray(rest), jnp.full(B, 2, jnp.int32), jnp.asarray(prompt - 2), kv)
    np.testing.assert_allclose(logits, full[np.arange(B), prompt - 1], atol=1e-5, rtol=0)
    pos = prompt.copy()
    for _ in range(T - prompt.max()):  # one token per step; row 1 idles (length 0) every other step
        for idle in (False, True):
            lengths = np.ones(B, np.int32)
            lengths[1] = 0 if idle else 1
            toks = ids[np.arange(B), pos][:, None]
            logits, kv = step(weights, toks, jnp.asarray(pos), jnp.asarray(lengths), kv)
            moved = lengths == 1
            np.testing.assert_allclose(
                np.asarray(logits)[moved], np.asarray(full)[np.arange(B), pos][moved], atol=1e-5, rtol=0
            )
            pos = pos + lengths
            if pos.max() >= T:
                break
        if pos.max() >= T:
            break
    assert float(jnp.abs(full).std()) > 0.5
