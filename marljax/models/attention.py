"""Causal self-attention over a whole sequence (training, log-probs, prefill without a cache).

One entry point, `causal_attention`, dispatching on `ModelConfig.attention_impl`:

- None / "xla": `jax.nn.dot_product_attention` over a dense `[B, 1, T, T]` mask (causal, real
  keys, same segment). Any padding and packed sequences; float32 `[B, N, T, T]` scores.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def dense_mask(valid: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """`[B, 1, T, T]` bool: query t reads key s when `s <= t`, key s is real (`valid [B, T]`) and,
    with `segment_ids [B, T]`, both are in one segment."""
    T = valid.shape[1]
    t = jnp.arange(T)
    mask = (t[:, None] >= t[None, :])[None] & valid[:, None, :]
    if segment_ids is not None:
        mask &= segment_ids[:, :, None] == segment_ids[:, None, :]
    return mask[:, None]


def causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    valid: jax.Array,
    segment_ids: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """Grouped-query causal attention `[B, T, N, H]` of queries `[B, T, N, H]` over keys and values
    `[B, T, K, H]` of the same tokens (query head n reads kv head n // (N / K)), scaled by
    `1 / sqrt(H)`. valid: `[B, T]` bool, the real tokens; segment_ids: `[B, T]` (packing)."""
    if implementation not in (None, "xla"):
        raise ValueError(f"unknown attention implementation {implementation!r}")
    return jax.nn.dot_product_attention(
        q, k, v, mask=dense_mask(valid, segment_ids), scale=1.0 / math.sqrt(q.shape[-1]), implementation="xla"
    )
