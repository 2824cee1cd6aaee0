"""The sampler's step of the decoder: tokens run against per-row KV caches in the decode layout.

The maths is the decoder's own layer (`project_qkv`, then attention, then
`out_and_mlp`, from `marljax.models.decoder`); only the data layout differs, for
speed when generating a token per row:

- the KV cache is one `(keys, values)` pair per layer, carried separately in the
  decode loop so each step writes in place, in one of two layouts: "split" (the
  CPU's), keys `[B, K, H, S]` and values `[B, K, S, H]`, so that both attention
  products are plain batched matmuls (keys stored slot-major make the score
  product several times slower on CPU); "bskh" (accelerators'), keys and values
  `[B, S, K, H]`, the layout `jax.nn.dot_product_attention` takes, so that a
  one-token step runs its fused kernel (cuDNN on GPU with
  `ModelConfig.attention_impl="cudnn"`) over each row's own cache length;
  "paged", one pool of fixed-size pages per layer, keys and values
  `[K, P, page_size, H]` (`init_page_pool`), shared by all rows: row b's
  position s lives at offset `s % page_size` of page `pages[b, s // page_size]`
  of its page table (`extend_step`'s `pages`), so a row holds pages for its own
  length only and rows can share a prefix's pages by reference (the sampler
  engine manages the tables, `marljax.sampler.pages`);
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

import jax
import jax.numpy as jnp

from marljax.models.attention import CACHE_LAYOUTS, attend
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

# Per-layer caches, flat: (keys_0, values_0, keys_1, values_1, ...), in a layout of LAYOUTS.
# Flat arrays (not a cache object) so the loop updates each one in place.
DecodeCache = tuple[jax.Array, ...]
LAYOUTS = CACHE_LAYOUTS
DENSE_LAYOUTS = ("split", "bskh")  # a `[B, ..., S, ...]` cache per layer (`init_decode_cache`)


def default_layout() -> str:
    """The cache layout for the default backend: "split" on CPU, "bskh" on accelerators."""
    return "split" if jax.default_backend() == "cpu" else "bskh"


def position_axis(layout: str, i: int) -> int:
    """The axis of cache positions of cache array `i` (keys at even `i`, values at odd)."""
    if layout == "paged":
        raise ValueError("a paged cache has no position axis: positions are on each row's pages")
    if layout == "bskh":
        return 1
    return 3 if i % 2 == 0 else 2


def heads_axis(layout: str) -> int:
    """The kv-head axis of every cache array."""
    return {"bskh": 2, "paged": 0}.get(layout, 1)


def init_decode_cache(
    config: ModelConfig, rows: int, slots: int, dtype=None, layout: str = "split"
) -> DecodeCache:
    """Zero caches of `rows` rows and `slots` slots per row, in `layout` (one of DENSE_LAYOUTS;
    the paged layout's pool is `init_page_pool`)."""
    if layout not in DENSE_LAYOUTS:
        raise ValueError(f"dense cache layout must be one of {DENSE_LAYOUTS}, got {layout!r}")
    dtype = jnp.dtype(config.dtype) if dtype is None else dtype
    K, H = config.num_kv_heads, config.head_dim
    if layout == "bskh":
        return tuple(jnp.zeros((rows, slots, K, H), dtype) for _ in range(2 * config.num_layers))
    return tuple(
        jnp.zeros((rows, K, H, slots) if i % 2 == 0 else (rows, K, slots, H), dtype)
        for i in range(2 * config.num_layers)
    )


def init_page_pool(config: ModelConfig, num_pages: int, page_size: int, dtype=None) -> DecodeCache:
    """Zero page pools of the "paged" layout: keys and values `[K, num_pages, page_size, H]` per
    layer (the layout `jax.experimental.pallas.ops.tpu.paged_attention` takes)."""
    dtype = jnp.dtype(config.dtype) if dtype is None else dtype
    shape = (config.num_kv_heads, num_pages, page_size, config.head_dim)
    return tuple(jnp.zeros(shape, dtype) for _ in range(2 * config.num_layers))


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


def extend_step(
    weights: Params,
    tokens: jax.Array,
    starts: jax.Array,
    lengths: jax.Array,
    kv: DecodeCache,
    *,
    config: ModelConfig,
    adapter: jax.Array | None = None,
    layout: str = "split",
    pages: jax.Array | None = None,
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
    adapters (default: adapter 0 for every row). layout: the caches' (see LAYOUTS).
    pages: the "paged" layout's page tables `[B, M]` int32 (rows read and write only these
    pages; S = M * page_size positions): every position a row writes must be on an allocated
    page (entries outside the pool drop the write), positions it reads but has not written are
    masked.
    """
    c = config
    B, T = tokens.shape
    if layout == "paged":
        K, P, page_size, H = kv[0].shape
        S = pages.shape[1] * page_size
    else:
        S = kv[1].shape[position_axis(layout, 1)]
    x = jnp.take(weights["embed"], tokens, axis=0).astype(jnp.dtype(c.dtype))
    t = jnp.arange(T, dtype=jnp.int32)
    positions = starts[:, None] + t[None, :]  # [B, T]
    slots = jnp.where(t[None, :] < lengths[:, None], positions, S)  # S: out of range, dropped
    rows = jnp.arange(B)[:, None]
    if layout == "paged":  # each written position's index in a pool flattened to [K, P * page_size, H]
        page = jnp.take_along_axis(pages, jnp.minimum(slots // page_size, pages.shape[1] - 1), axis=1)
        flat = jnp.where(slots < S, page * page_size + slots % page_size, P * page_size)  # [B, T]
    mask = (jnp.arange(S)[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, S]
    inv_freq = inverse_frequencies(c)
    step_kw = {}
    if layout == "paged":
        step_kw = dict(page_table=pages)
    elif layout == "bskh" and T == 1:
        # a one-token step reads each row's first `starts + 1` slots, as lengths the fused kernels
        # take: cuDNN's where asked (the training-only kernels, splash, have no decode form)
        impl = "cudnn" if c.attention_impl == "cudnn" else None
        step_kw = dict(kv_lengths=(starts + 1).astype(jnp.int32), implementation=impl)
    new = []
    for i, p in enumerate(weights["layers"]):
        lora = LayerLora(weights["lora"][i], adapter) if "lora" in weights else None
        q, k, v = project_qkv(p, x, positions, config=c, inv_freq=inv_freq, lora=lora)  # k, v [B, T, K, H]
        k, v = k.astype(kv[2 * i].dtype), v.astype(kv[2 * i + 1].dtype)
        if layout == "paged":
            keys, values = (
                pool.reshape(K, P * page_size, H)
                .at[:, flat]
                .set(jnp.moveaxis(written, 2, 0), mode="drop")
                .reshape(K, P, page_size, H)
                for pool, written in ((kv[2 * i], k), (kv[2 * i + 1], v))
            )
        elif layout == "bskh":
            keys = kv[2 * i].at[rows, slots].set(k, mode="drop")
            values = kv[2 * i + 1].at[rows, slots].set(v, mode="drop")
        else:  # split
            keys = kv[2 * i].at[rows, :, :, slots].set(k, mode="drop")
            values = kv[2 * i + 1].at[rows, :, slots, :].set(v, mode="drop")
        attn = attend(q, keys.astype(q.dtype), values.astype(q.dtype), mask=mask, layout=layout, **step_kw)
        x = out_and_mlp(p, x, attn, config=c, lora=lora)
        new += [keys, values]
    last = x[jnp.arange(B), jnp.maximum(lengths - 1, 0)] if T > 1 else x[:, 0]
    return unembed(weights, rms_norm(last, weights["final_norm"], c.rms_norm_eps)), tuple(new)
