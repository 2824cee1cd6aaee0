"""The sampler's step of the decoder: tokens run against per-row KV caches in the decode layout.

The maths is the decoder's own layer (`project_qkv`, then attention, then
`out_and_mlp`, from `marljax.models.decoder`); only the data layout differs, for
speed when generating a token per row:

- the KV cache is one `(keys, values)` pair per layer, keys `[B, K, H, S]` and
  values `[B, K, S, H]`, so that both attention products are plain batched
  matmuls (keys stored slot-major make the score product several times slower
  on CPU), carried separately in the decode loop so each step writes in place;
- every row has its own positions: its tokens fill its cache from position 0, so
  a token's cache position is its rotary position, and rows of different lengths
  (continuous batching) need no padding inside the cache;
- the layers are unrolled, each reading its own weights (`decode_weights`)
  instead of slicing stacked weights inside a scan;
- optionally (`fuse=True`), the weights take the fused layout of
  `fuse_projections` and a tied embedding is transposed once into a `[D, V]`
  head: fewer, larger, plainer matmuls, which matters when steps are short.

`extend_step` runs any number of tokens per row from any position: a prompt (or
its part after a prefix copied from another row's cache) or one decode token.

LoRA: parameters with adapters (`params["lora"]`, see `marljax.models.lora`) get them sliced
per layer too, and `extend_step`'s `adapter` `[B]` picks each row's adapter: rows of different
adapters of one base decode in one batch, sharing the base matmuls.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from marljax.models.config import ModelConfig
from marljax.models.decoder import (
    LayerLora,
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


def init_decode_cache(config: ModelConfig, rows: int, slots: int, dtype=None) -> DecodeCache:
    """Zero caches of `rows` rows and `slots` slots per row, in the decode layout."""
    dtype = jnp.dtype(config.dtype) if dtype is None else dtype
    K, H = config.num_kv_heads, config.head_dim
    return tuple(
        jnp.zeros((rows, K, H, slots) if i % 2 == 0 else (rows, K, slots, H), dtype)
        for i in range(2 * config.num_layers)
    )


def decode_weights(params: Params, config: ModelConfig, fuse: bool) -> Params:
    """`params` for `extend_step`: `layers` becomes a list of per-layer weight dicts (fused
    projections when `fuse`); with `fuse`, a tied embedding also gets a transposed `lm_head`
    copy, since a plain `[B, D] @ [D, V]` step is measurably faster for small models."""
    layers = []
    for layer in range(config.num_layers):
        p = {name: w[layer] for name, w in params["layers"].items()}
        p["wo"] = p["wo"].reshape(-1, p["wo"].shape[-1])  # [N*H, D]: no per-step relayout copy
        layers.append(fuse_projections(p) if fuse else p)
    out = {**params, "layers": layers}
    if "lora" in params:  # per-layer adapter weights, like the base's
        out["lora"] = [
            jax.tree.map(lambda w, i=layer: w[i], params["lora"]) for layer in range(config.num_layers)
        ]
    if fuse and "lm_head" not in params:
        out["lm_head"] = params["embed"].T
    return out


def _attend_cached(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention `[B, T, N, H]` of queries `[B, T, N, H]` over keys `[B, K, H, S]`
    and values `[B, K, S, H]` where `mask` `[B, 1, 1, T, S]` is set; scores and softmax in
    float32, as `jax.nn.dot_product_attention`."""
    B, T, N, H = q.shape
    K = keys.shape[1]
    # [B, K, G, T, H]: query head n = k G + g reads kv head k = n // G
    qg = jnp.transpose(q.reshape(B, T, K, N // K, H), (0, 2, 3, 1, 4))
    s = jnp.einsum("bkgth,bkhs->bkgts", qg, keys.astype(q.dtype), preferred_element_type=jnp.float32) * (
        1.0 / math.sqrt(H)
    )
    s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
    a = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bksh->bkgth", a, values.astype(q.dtype))  # [B, K, G, T, H]
    return jnp.moveaxis(out, 3, 1).reshape(B, T, N, H)


def extend_step(
    weights: Params,
    tokens: jax.Array,
    starts: jax.Array,
    lengths: jax.Array,
    kv: DecodeCache,
    *,
    config: ModelConfig,
    adapter: jax.Array | None = None,
):
    """Run `tokens` `[B, T]` through the decoder against each row's own cache: row b's token t
    sits in slot `starts[b] + t` (also its rotary position) and attends to the row's slots up to
    its own. Only the first `lengths[b]` tokens of row b are written to the cache (the rest are
    padding; a row with length 0 is left unchanged, and writes past the cache are dropped).

    Returns the float32 logits `[B, V]` after token `lengths[b] - 1` of each row and the updated
    caches. One call prefills prompts (or their suffixes after a cached prefix) into decode
    slots; with T = 1 it is the one-token decode step. weights: from `decode_weights`; kv: from
    `init_decode_cache` (each row's slots hold its tokens from slot 0 on, so a row's rotary
    position equals its slot). adapter: `[B]` int, each row's LoRA adapter where `weights` has
    adapters (default: adapter 0 for every row).
    """
    c = config
    B, T = tokens.shape
    S = kv[1].shape[2]
    x = jnp.take(weights["embed"], tokens, axis=0).astype(jnp.dtype(c.dtype))
    t = jnp.arange(T, dtype=jnp.int32)
    positions = starts[:, None] + t[None, :]  # [B, T]
    slots = jnp.where(t[None, :] < lengths[:, None], positions, S)  # S: out of range, dropped
    rows = jnp.arange(B)[:, None]
    mask = (jnp.arange(S)[None, None, :] <= positions[:, :, None])[:, None, None]  # [B, 1, 1, T, S]
    inv_freq = inverse_frequencies(c)
    new = []
    for i, p in enumerate(weights["layers"]):
        lora = LayerLora(weights["lora"][i], adapter) if "lora" in weights else None
        q, k, v = project_qkv(p, x, positions, config=c, inv_freq=inv_freq, lora=lora)  # k, v [B, T, K, H]
        keys = kv[2 * i].at[rows, :, :, slots].set(k.astype(kv[2 * i].dtype), mode="drop")
        values = kv[2 * i + 1].at[rows, :, slots, :].set(v.astype(kv[2 * i + 1].dtype), mode="drop")
        x = out_and_mlp(p, x, _attend_cached(q, keys, values, mask), config=c, lora=lora)
        new += [keys, values]
    last = x[jnp.arange(B), jnp.maximum(lengths - 1, 0)] if T > 1 else x[:, 0]
    return unembed(weights, rms_norm(last, weights["final_norm"], c.rms_norm_eps)), tuple(new)
