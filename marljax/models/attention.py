"""Attention: one entry point, `attend`, for training, prefill and the sampler's cached steps.

`attend` dispatches on what it is given:

- no cache (training, log-probs, prefill): causal self-attention over the tokens themselves,
  `causal_attention`, by `ModelConfig.attention_impl`:
  - None / "xla": `jax.nn.dot_product_attention` over a dense `[B, 1, T, T]` mask (causal, real
    keys, same segment). Any padding and packed sequences; float32 `[B, N, T, T]` scores.
  - "cudnn": cuDNN's fused flash attention (GPU), causal with per-row lengths
    (`length_attention`). Rows must be right-padded (`valid` a prefix of ones); no packing.
  - "splash": Pallas splash attention (TPU; `splash_attention`). Padding on either side and
    packing, through segment ids; no `[T, T]` array is materialised.

  All three agree on the real (valid) query positions; what they put at pad positions differs
  and is never read (pad keys are masked for every real query).
- a cache in one of `CACHE_LAYOUTS` (the decoder's `KVCache`, the sampler's decode caches):
  queries over cached keys and values where a `[B, 1, T, S]` mask is set, or, for a one-token
  step, over each row's first `kv_lengths` slots (the fused kernels' padding mask). The "paged"
  layout's keys and values are page pools shared by all rows, read through each row's page
  table (`page_table`): a row reads only its own pages.

A change to the attention maths itself (a sliding window, a logit soft cap) goes here, once.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from marljax.models import sharding as _sharding

IMPLEMENTATIONS = (None, "xla", "cudnn", "splash")
# Cache layouts: "bskh" keys and values `[B, S, K, H]` (what `jax.nn.dot_product_attention` takes);
# "split" keys `[B, K, H, S]` and values `[B, K, S, H]`, so that both products are plain batched
# matmuls (the CPU sampler's layout, see `marljax.models.decode`); "paged" one pool of fixed-size
# pages per layer, keys and values `[K, P, page_size, H]` (P pages shared by all rows, the layout
# of the Pallas TPU paged-attention kernel), each row's positions on the pages of its page table
# `[B, M]` (position s of row b at offset s % page_size of page `page_table[b, s // page_size]`).
CACHE_LAYOUTS = ("split", "bskh", "paged")


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    valid: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    mask: jax.Array | None = None,
    kv_lengths: jax.Array | None = None,
    layout: str | None = None,
    implementation: str | None = None,
    page_table: jax.Array | None = None,
) -> jax.Array:
    """Grouped-query attention `[B, T, N, H]` of queries `[B, T, N, H]` (query head n reads kv head
    n // (N / K)), scaled by `1 / sqrt(H)`; scores and softmax in float32; keys and values in the
    queries' dtype.

    Without a cache (`layout` None): `k`, `v` `[B, T, K, H]` are the queries' own tokens, `valid`
    `[B, T]` the real ones, `segment_ids` `[B, T]` the packing: `causal_attention` by
    `implementation` (one of `IMPLEMENTATIONS`).

    With a cache (`layout` one of `CACHE_LAYOUTS`, S slots): either `mask` `[B, 1, T, S]`, set
    where a query reads a slot (XLA's attention: a cache's offset masks are not causal from slot
    0), or, for a one-token step in the "bskh" layout, `kv_lengths` `[B]`: each row reads its
    first `kv_lengths[b]` slots, through the fused kernel `implementation` (None: XLA's; "cudnn").
    In the "paged" layout `k`, `v` are page pools `[K, P, page_size, H]` and `page_table` `[B, M]`
    int32 each row's pages, so S = M * page_size; `mask` as above.
    """
    if layout is None:
        return causal_attention(q, k, v, valid=valid, segment_ids=segment_ids, implementation=implementation)
    if layout == "split":
        return _attend_split(q, k, v, mask)
    if layout == "paged":
        return _attend_paged(q, k, v, page_table, mask)
    if layout != "bskh":
        raise ValueError(f"cache layout must be one of {CACHE_LAYOUTS}, got {layout!r}")
    if kv_lengths is not None:
        return jax.nn.dot_product_attention(
            q, k, v, key_value_seq_lengths=kv_lengths, implementation=implementation
        )
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, scale=1.0 / math.sqrt(q.shape[-1]), implementation="xla"
    )


def _attend_split(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """`attend` over keys `[B, K, H, S]` and values `[B, K, S, H]` as two batched matmuls."""
    B, T, N, H = q.shape
    K = keys.shape[1]
    # [B, K, G, T, H]: query head n = k G + g reads kv head k = n // G
    qg = jnp.transpose(q.reshape(B, T, K, N // K, H), (0, 2, 3, 1, 4))
    s = jnp.einsum("bkgth,bkhs->bkgts", qg, keys, preferred_element_type=jnp.float32) * (1.0 / math.sqrt(H))
    s = jnp.where(mask[:, :, None], s, jnp.finfo(jnp.float32).min)
    a = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bksh->bkgth", a, values)  # [B, K, G, T, H]
    return jnp.moveaxis(out, 3, 1).reshape(B, T, N, H)


def gather_pages(
    k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Each row's own pages of the pools `[K, P, page_size, H]`, in the "split" layout: keys
    `[B, K, H, S]` and values `[B, K, S, H]`, S = M * page_size for a page table `[B, M]`.
    Table entries outside the pool (unallocated pages) read the last page: the caller masks
    positions a row has not written."""
    K, _, ps, H = k_pages.shape
    B, M = page_table.shape
    k = jnp.take(k_pages, page_table, axis=1, mode="clip")  # [K, B, M, ps, H]
    v = jnp.take(v_pages, page_table, axis=1, mode="clip")
    keys = jnp.transpose(k, (1, 0, 4, 2, 3)).reshape(B, K, H, M * ps)
    values = jnp.transpose(v, (1, 0, 2, 3, 4)).reshape(B, K, M * ps, H)
    return keys, values


def _attend_paged(
    q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array, mask: jax.Array
) -> jax.Array:
    """`attend` over page pools: a gather of each row's pages, then the "split" layout's two
    batched matmuls (XLA on every backend; the gather is a copy of the rows' windows).

    Where a fused kernel plugs in: on TPU, `jax.experimental.pallas.ops.tpu.paged_attention`
    takes this pool layout (`[K, P, page_size, H]`) and page table as they are, for one-token
    steps (queries `[B, N, H]`, per-row lengths `pos + 1` instead of `mask`), and reads pages
    in place with no gathered copy. It is not wired in: the kernel is TPU-only (no interpret
    mode on CPU), so nothing here could test it."""
    if page_table is None or mask is None:
        raise ValueError("the paged layout needs page_table and mask")
    keys, values = gather_pages(k_pages, v_pages, page_table)
    return _attend_split(q, keys.astype(q.dtype), values.astype(q.dtype), mask)


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
    """`attend` without a cache: grouped-query causal attention `[B, T, N, H]` of queries
    `[B, T, N, H]` over keys and values `[B, T, K, H]` of the same tokens (query head n reads kv
    head n // (N / K)), scaled by `1 / sqrt(H)`. valid: `[B, T]` bool, the real tokens; segment_ids: `[B, T]` (packing).
    implementation: one of `IMPLEMENTATIONS` (see the module docstring)."""
    if implementation in (None, "xla"):
        return jax.nn.dot_product_attention(
            q,
            k,
            v,
            mask=dense_mask(valid, segment_ids),
            scale=1.0 / math.sqrt(q.shape[-1]),
            implementation="xla",
        )
    if implementation == "cudnn":
        return length_attention(q, k, v, valid=valid, segment_ids=segment_ids, implementation="cudnn")
    if implementation == "splash":
        return splash_attention(q, k, v, valid=valid, segment_ids=segment_ids)
    raise ValueError(f"unknown attention implementation {implementation!r}; known: {IMPLEMENTATIONS}")


# ------------------------------------------------------------------ cuDNN (GPU)
def length_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    valid: jax.Array,
    segment_ids: jax.Array | None = None,
    implementation: str = "cudnn",
) -> jax.Array:
    """`causal_attention` for right-padded rows, as cuDNN's fused attention takes it: `is_causal`
    plus per-row lengths `valid.sum(-1)` for both queries and keys (query t of row b reads keys
    `s <= t` with `s < length_b`, which is the dense mask when `valid[b]` is a prefix of ones).

    implementation: "cudnn" on a GPU; "xla" runs the same arguments through XLA (what a CPU test
    checks). Queries and keys share their lengths, so cuDNN's top-left and bottom-right causal
    alignments coincide.

    Output at pad query positions is 0. A row whose `valid` is not a prefix of ones (left
    padding, holes) cannot be expressed by a length: its output is NaN, loudly, rather than
    silently wrong. Refused (ValueError): `segment_ids` (packing); for "cudnn" also a dtype other
    than bfloat16/float16 and a head dim that is not a multiple of 8 up to 256 (cuDNN's flash
    limits; 128 before Hopper, which JAX checks when it compiles for the GPU).
    """
    if segment_ids is not None:
        raise ValueError(
            "cuDNN attention takes per-row lengths, not segment ids: packed rows need "
            "attention_impl None/'xla' (dense mask) or 'splash'"
        )
    if implementation not in ("cudnn", "xla"):
        raise ValueError(f"length_attention implementation must be 'cudnn' or 'xla', got {implementation!r}")
    H = q.shape[-1]
    if implementation == "cudnn":
        if q.dtype not in (jnp.bfloat16, jnp.float16):
            raise ValueError(
                f"cuDNN flash attention takes bfloat16 or float16 (ModelConfig.dtype), got {q.dtype}"
            )
        if H % 8 or H > 256:
            raise ValueError(
                f"cuDNN flash attention needs a head dim that is a multiple of 8, <= 256; got {H}"
            )
    T = q.shape[1]
    lengths = valid.sum(-1, dtype=jnp.int32)
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        scale=1.0 / math.sqrt(H),
        is_causal=True,
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        implementation=implementation,
    )
    is_prefix = jnp.all(valid == (jnp.arange(T) < lengths[:, None]), axis=-1)
    out = jnp.where(valid[:, :, None, None], out, jnp.zeros((), out.dtype))
    return jnp.where(is_prefix[:, None, None, None], out, jnp.full((), jnp.nan, out.dtype))


# ------------------------------------------------------------------ splash (TPU)
SPLASH_BLOCKS = (512, 256, 128)  # tile sizes tried, largest first; the kernel needs multiples of 128

_SPLASH_INTERPRET: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "splash_interpret", default=None
)


@contextlib.contextmanager
def splash_interpret(interpret: bool | None) -> Iterator[None]:
    """While tracing inside this block, `splash_attention` (and so `causal_attention` with
    "splash", as the decoder calls it) runs in Pallas interpret mode (True), as the TPU kernel
    (False), or by the platform (None). For an ahead-of-time TPU compile on a CPU host without a
    multi-device mesh (nothing then says the program is for a TPU), and for tests."""
    token = _SPLASH_INTERPRET.set(interpret)
    try:
        yield
    finally:
        _SPLASH_INTERPRET.reset(token)


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    valid: jax.Array,
    segment_ids: jax.Array | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """`causal_attention` `[B, T, N, H]` by Pallas splash attention (a TPU flash-attention kernel).

    Masking: a static causal mask and_ed with segment ids, pad tokens (`~valid`) in one segment
    of their own, so left padding, right padding and packing are all exact on real queries (a
    pad query reads only pad keys; every row keeps at least its diagonal, so no softmax is
    empty). `segment_ids` are any int32 values; the pad segment is one below their minimum.

    Shapes: the kernel takes one row `[N, T, H]` with keys `[K, T, H]` and is vmapped over the
    batch. Grouped-query attention is the kernel's own: query head n reads kv head
    n // (N / K) (the MHA kernel indexes kv blocks by that head and sums dk/dv over the group),
    so k/v are neither repeated in memory nor the kernel split per kv head. q is scaled by
    `1 / sqrt(H)` here (the kernel does not scale). T is padded with pad tokens to a multiple
    of 128 and tiled by the largest of `SPLASH_BLOCKS` dividing it.

    Sharding: inside `marljax.models.sharding.activation_sharding(mesh)` the kernel runs under
    `shard_map`, rows over the batch axes and heads over `tensor` (by the rule table). If the
    kv heads do not divide `tensor` but the query heads do, k/v are repeated to N heads so the
    heads still split; if neither does, heads stay whole on every device.

    interpret: run the kernel in Pallas interpret mode (plain XLA ops; for CPU tests). Default:
    that of an enclosing `splash_interpret`, else by the platform the program is for (the
    activation mesh's devices, else the default backend): False on TPU, True on CPU; refused on
    GPU (use "cudnn").
    """
    # imported here: Pallas takes half a second to import, and only splash runs need it
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    B, T, N, H = q.shape
    K = k.shape[2]
    seg = jnp.zeros((B, T), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    pad_id = seg.min() - 1
    seg = jnp.where(valid, seg, pad_id)
    Tp = -(-T // 128) * 128
    if Tp != T:
        grow = ((0, 0), (0, Tp - T), (0, 0), (0, 0))
        q, k, v = (jnp.pad(x, grow) for x in (q, k, v))
        seg = jnp.pad(seg, ((0, 0), (0, Tp - T)), constant_values=pad_id)
    block = next(b for b in SPLASH_BLOCKS if Tp % b == 0)
    q = (q * (1.0 / math.sqrt(H))).astype(q.dtype)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [B, heads, T, H]

    current = _sharding.current_activation_mesh()
    mesh, rules = current if current is not None else (None, None)
    if interpret is None:
        interpret = _SPLASH_INTERPRET.get()
    if interpret is None:
        platform = _sharding.mesh_platform(mesh)
        if platform not in ("tpu", "cpu"):
            raise ValueError(
                f"splash attention is a TPU kernel; on {platform} use attention_impl 'cudnn' or 'xla'"
            )
        interpret = platform != "tpu"

    def rows(q, k, v, seg):
        mask = splash.MultiHeadMask([splash.CausalMask((Tp, Tp)) for _ in range(q.shape[1])])
        sizes = splash.BlockSizes(
            block_q=block,
            block_kv=block,
            block_kv_compute=block,
            block_q_dkv=block,
            block_kv_dkv=block,
            block_kv_dkv_compute=block,
            block_q_dq=block,
            block_kv_dq=block,
        )
        kernel = splash.make_splash_mha(
            mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
        )
        return jax.vmap(lambda q, k, v, s: kernel(q, k, v, splash.SegmentIds(q=s, kv=s)))(q, k, v, seg)

    if mesh is None:
        out = rows(q, k, v, seg)
    else:
        batch, q_heads, kv_heads = (
            (*_sharding.logical_to_spec((name,), (size,), mesh, rules), None)[0]
            for name, size in (("batch", B), ("act_heads", N), ("act_kv_heads", K))
        )
        if q_heads is not None and kv_heads != q_heads:  # kv heads do not split so: one per query head
            k, v = (jnp.repeat(x, N // K, axis=1) for x in (k, v))
        spec = P(batch, q_heads, None, None)
        out = jax.shard_map(
            rows, mesh=mesh, in_specs=(spec, spec, spec, P(batch, None)), out_specs=spec, check_vma=False
        )(q, k, v, seg)
    return out[:, :, :T].transpose(0, 2, 1, 3)
