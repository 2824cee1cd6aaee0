"""One-token decode step of the decoder, in the cache layout the sampler's loop needs.

The maths is the decoder's own layer (`project_qkv`, then attention, then
`out_and_mlp`, from `marljax.models.decoder`); only the data layout differs, for
speed when generating one token per row:

- the KV cache is one `(keys, values)` pair per layer, keys `[B, K, H, S]` and
  values `[B, K, S, H]`, so that both attention products are plain batched
  matmuls (keys stored slot-major make the score product several times slower
  on CPU), carried separately in the decode loop so each step writes one slot
  in place;
- the layers are unrolled, each reading its own weights (`decode_weights`,
  sliced once per call) instead of slicing stacked weights inside a scan;
- optionally (`fuse=True`), the weights take the fused layout of
  `fuse_projections` and a tied embedding is transposed once into a `[D, V]`
  head: fewer, larger, plainer matmuls, which matters when steps are short.

The prefill runs `marljax.models.hidden_states`; `split_cache` converts its
`KVCache` to this layout.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from marljax.models.config import ModelConfig
from marljax.models.decoder import (
    KVCache,
    Params,
    fuse_projections,
    out_and_mlp,
    project_qkv,
    rms_norm,
    unembed,
)
from marljax.models.rope import inverse_frequencies

# Per-layer caches, flat: (keys_0, values_0, keys_1, values_1, ...), keys [B, K, H, S] and
# values [B, K, S, H]. Flat arrays (not a cache object) so the loop updates each one in place.
DecodeCache = tuple[jax.Array, ...]


def split_cache(cache: KVCache, slots: int | None = None) -> DecodeCache:
    """The decode layout of the first `slots` (default all) slots of a `KVCache` `[L, B, S, K, H]`."""
    L, W = cache.k.shape[0], slots or cache.k.shape[2]
    return tuple(
        x
        for layer in range(L)
        for x in (
            jnp.transpose(cache.k[layer, :, :W], (0, 2, 3, 1)),  # keys [B, K, H, W]
            jnp.swapaxes(cache.v[layer, :, :W], 1, 2),
        )
    )  # values [B, K, W, H]


def grow_cache(kv: DecodeCache, slots: int) -> DecodeCache:
    """`split_cache` arrays widened to `slots` slots (new slots zero)."""

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, slots - x.shape[axis])
        return jnp.pad(x, widths)

    return tuple(pad(x, 3 if i % 2 == 0 else 2) for i, x in enumerate(kv))


def decode_weights(params: Params, config: ModelConfig, fuse: bool) -> Params:
    """`params` for `decode_step`: `layers` becomes a list of per-layer weight dicts (fused
    projections when `fuse`); with `fuse`, a tied embedding also gets a transposed `lm_head`
    copy, since a plain `[B, D] @ [D, V]` step is measurably faster for small models."""
    layers = []
    for layer in range(config.num_layers):
        p = {name: w[layer] for name, w in params["layers"].items()}
        p["wo"] = p["wo"].reshape(-1, p["wo"].shape[-1])  # [N*H, D]: no per-step relayout copy
        layers.append(fuse_projections(p) if fuse else p)
    out = {**params, "layers": layers}
    if fuse and "lm_head" not in params:
        out["lm_head"] = params["embed"].T
    return out


def _attend_cached(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention `[B, N, H]` of one query per row `[B, N, H]` over keys
    `[B, K, H, S]` and values `[B, K, S, H]` where `mask` `[B, 1, 1, S]` is set; scores and
    softmax in float32, as `jax.nn.dot_product_attention`."""
    B, N, H = q.shape
    K = keys.shape[1]
    qg = q.reshape(B, K, N // K, H)  # query head n reads kv head n // (N / K)
    s = jnp.einsum("bkgh,bkhs->bkgs", qg, keys.astype(q.dtype), preferred_element_type=jnp.float32) * (
        1.0 / math.sqrt(H)
    )
    s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
    a = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgs,bksh->bkgh", a, values.astype(q.dtype)).reshape(B, N, H)


def decode_step(
    weights: Params,
    tokens: jax.Array,
    positions: jax.Array,
    kv: DecodeCache,
    valid: jax.Array,
    index: jax.Array,
    *,
    config: ModelConfig,
):
    """Logits `[B, V]` (float32) of the next token after `tokens` `[B]` and the updated caches.

    weights: from `decode_weights`; positions: `[B]` rotary positions of `tokens`; kv: from
    `split_cache`; valid: `[B, S]` slots holding real tokens (any slot >= index may be True:
    the causal limit `slot <= index` is applied here); index: the slot `tokens` are written to.
    """
    c = config
    S = kv[1].shape[2]
    x = jnp.take(weights["embed"], tokens, axis=0).astype(jnp.dtype(c.dtype))
    mask = ((jnp.arange(S) <= index)[None, :] & valid)[:, None, None, :]  # [B, 1, 1, S]
    inv_freq = inverse_frequencies(c)
    new = []
    for i, p in enumerate(weights["layers"]):
        q, k, v = project_qkv(p, x, positions, config=c, inv_freq=inv_freq)
        keys = lax.dynamic_update_slice(kv[2 * i], k[..., None].astype(kv[2 * i].dtype), (0, 0, 0, index))
        values = lax.dynamic_update_slice(
            kv[2 * i + 1], v[:, :, None].astype(kv[2 * i + 1].dtype), (0, 0, index, 0)
        )
        x = out_and_mlp(p, x, _attend_cached(q, keys, values, mask), config=c)
        new += [keys, values]
    return unembed(weights, rms_norm(x, weights["final_norm"], c.rms_norm_eps)), tuple(new)
