"""The one-token decode step (`marljax.models.decode`), in its own cache layout and with
separate or fused weights, gives the logits of the full forward."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax.models import ModelConfig, forward, get_params, hidden_states, init_cache, positions_from_mask
from marljax.models.decode import decode_step, decode_weights, grow_cache, split_cache
from marljax.models.testing import random_model


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-qwen3"])  # untied + biases; tied + q/k norm
def test_decode_steps_after_a_prefill_equal_the_full_forward(preset, fuse):
    cfg = ModelConfig.preset(preset)
    params = get_params(random_model(cfg))
    rng = np.random.RandomState(0)
    B, T, P, S = 3, 10, 6, 12  # rows, tokens, prompt slots, cache slots
    ids = jnp.asarray(rng.randint(3, cfg.vocab_size, (B, T)))
    mask = jnp.asarray(np.arange(T)[None] >= np.array([[0], [2], [5]]))  # left padding
    pos = positions_from_mask(mask)
    full, _ = jax.jit(forward, static_argnames="config")(
        params, ids, config=cfg, positions=pos, attention_mask=mask
    )

    _, cache = jax.jit(hidden_states, static_argnames="config")(
        params,
        ids[:, :P],
        config=cfg,
        positions=pos[:, :P],
        attention_mask=mask[:, :P],
        cache=init_cache(cfg, B, S),
    )
    kv = grow_cache(split_cache(cache, P), S)  # the prompt's slots, widened to the whole cache
    assert kv[0].shape == (B, cfg.num_kv_heads, cfg.head_dim, S)
    assert kv[1].shape == (B, cfg.num_kv_heads, S, cfg.head_dim)
    valid = cache.mask | (jnp.arange(S) >= P)[None]  # decode slots hold real tokens
    weights = decode_weights(params, cfg, fuse)
    assert ("wqkv" in weights["layers"][0]) == fuse
    step = jax.jit(functools.partial(decode_step, config=cfg))
    for t in range(P, T):
        logits, kv = step(weights, ids[:, t], pos[:, t], kv, valid, jnp.int32(t))
        np.testing.assert_allclose(logits, full[:, t], atol=1e-5, rtol=0, err_msg=f"token {t}")
    assert float(jnp.abs(full).std()) > 0.5
