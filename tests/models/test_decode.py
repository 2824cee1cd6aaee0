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
from marljax.models.attention import attend
from marljax.models.decode import (
    DENSE_LAYOUTS,
    decode_weights,
    extend_step,
    init_decode_cache,
    init_page_pool,
)
from marljax.testing import random_model


@pytest.mark.parametrize("layout", DENSE_LAYOUTS)
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


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_steps_equal_the_dense_cache_on_scattered_pages(page_size):
    """The "paged" layout: each row's positions on pages of a shared pool, in a scrambled order
    and interleaved with the other rows' (rows read only their own pages), with a prompt in two
    pieces and then one-token steps (row 1 idle every other step): logits equal the "split"
    cache's, and every page a row does not own is left as it was (zero)."""
    cfg = ModelConfig.preset("tiny-qwen3")
    params = get_params(random_model(cfg))
    weights = decode_weights(params, cfg, False)
    rng = np.random.RandomState(1)
    B, S = 3, 16
    M = -(-S // page_size)
    P = B * M + 3  # three pages no row owns
    table = rng.permutation(P)[: B * M].reshape(B, M).astype(np.int32)
    pool = init_page_pool(cfg, P, page_size)
    K, H = cfg.num_kv_heads, cfg.head_dim
    assert pool[0].shape == pool[1].shape == (K, P, page_size, H) and len(pool) == 2 * cfg.num_layers
    dense = init_decode_cache(cfg, B, M * page_size, layout="split")
    step = jax.jit(functools.partial(extend_step, config=cfg), static_argnames="layout")
    ids = rng.randint(3, cfg.vocab_size, (B, S))
    prompt = np.array([5, 2, 7])
    calls = [(ids[:, :2], np.zeros(B, np.int32), np.full(B, 2, np.int32))]
    rest = np.zeros((B, 5), np.int64)
    for b in range(B):
        rest[b, : prompt[b] - 2] = ids[b, 2 : prompt[b]]
    calls.append((rest, np.full(B, 2, np.int32), (prompt - 2).astype(np.int32)))
    pos = prompt.copy()
    for j in range(8):
        lengths = np.ones(B, np.int32)
        lengths[1] = j % 2
        calls.append((ids[np.arange(B), pos][:, None], pos.copy(), lengths))
        pos = pos + lengths
    for toks, starts, lengths in calls:
        args = (weights, jnp.asarray(toks), jnp.asarray(starts), jnp.asarray(lengths))
        want, dense = step(*args, dense, layout="split")
        got, pool = step(*args, pool, layout="paged", pages=jnp.asarray(table))
        moved = lengths > 0
        np.testing.assert_allclose(np.asarray(got)[moved], np.asarray(want)[moved], atol=1e-5, rtol=0)
    owned = np.zeros(P, bool)
    owned[table.ravel()] = True
    assert float(jnp.abs(pool[0][:, ~owned]).max()) == 0.0
    # the written positions sit where the table says: row b's position s on page table[b, s // ps]
    written = pool[0][:, table].transpose(1, 0, 4, 2, 3).reshape(B, K, H, M * page_size)
    for b in range(B):
        np.testing.assert_allclose(written[b, ..., : pos[b]], dense[0][b, ..., : pos[b]], atol=1e-6)


def test_paged_attention_reads_only_the_rows_own_pages():
    """`attend(layout="paged")` against attention over each row's keys laid out densely: the
    pool's other pages hold large values that would change any row that read them."""
    rng = np.random.RandomState(2)
    B, T, N, K, H, ps, M = 2, 1, 4, 2, 8, 4, 3
    P = 10
    table = np.array([[7, 2, 5], [0, 9, 3]], np.int32)
    k_pages = rng.normal(size=(K, P, ps, H)).astype(np.float32)
    v_pages = rng.normal(size=(K, P, ps, H)).astype(np.float32)
    others = np.setdiff1d(np.arange(P), table.ravel())
    k_pages[:, others] = 1e3
    v_pages[:, others] = 1e3
    q = rng.normal(size=(B, T, N, H)).astype(np.float32)
    length = np.array([9, 12])  # row 0 reads 9 positions: masks the rest of its last page
    mask = np.arange(M * ps)[None, None, None, :] < length[:, None, None, None]
    got = attend(
        jnp.asarray(q),
        jnp.asarray(k_pages),
        jnp.asarray(v_pages),
        mask=jnp.asarray(mask),
        layout="paged",
        page_table=jnp.asarray(table),
    )
    for b in range(B):
        keys = k_pages[:, table[b]].reshape(K, M * ps, H)[:, : length[b]]  # [K, S, H]
        values = v_pages[:, table[b]].reshape(K, M * ps, H)[:, : length[b]]
        for n in range(N):
            s = keys[n // (N // K)] @ q[b, 0, n] / np.sqrt(H)
            w = np.exp(s - s.max())
            w /= w.sum()
            np.testing.assert_allclose(np.asarray(got)[b, 0, n], w @ values[n // (N // K)], atol=1e-5)
