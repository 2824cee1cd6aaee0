"""One-token decode step of the decoder, specialised for the sampler's loop.

The maths is the decoder layer of `marljax.models.decoder` (RMSNorm, q/k/v
projections with optional biases and Qwen3 q/k norm, rotary embeddings from
`marljax.models.rope`, grouped-query attention over the cache, SwiGLU MLP);
only the data layout differs, for speed when generating one token per row:

- the KV cache is one `(k, v)` pair per layer, keys `[B, K, H, S]` and values
  `[B, K, S, H]`, so that both attention products are plain batched matmuls
  (keys stored slot-major make the score product several times slower on CPU),
  carried separately in the decode loop so each step writes one slot in place;
- the layers are unrolled, reading each layer's weights directly instead of
  slicing stacked weights inside a scan;
- optionally (`fuse=True`), the q/k/v projections and the gate/up projections
  are each one matmul over concatenated weights (built once per call, before
  the loop): fewer, larger matmuls, which matters when steps are short.

The prefill still runs `marljax.models.hidden_states`; `split_cache` converts
its `KVCache`. Equality with the model is tested end to end (greedy tokens equal
transformers, returned log-probs equal teacher-forced log-probs to 1e-5).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from marljax.models import KVCache, ModelConfig, apply_rope, inverse_frequencies, rms_norm


def split_cache(cache: KVCache, slots: int | None = None) -> tuple[jax.Array, ...]:
    """`(k_0, v_0, k_1, v_1, ...)`, keys `[B, K, H, W]` and values `[B, K, W, H]`, from the first
    `W = slots` (default all) slots of a `KVCache` `[L, B, S, K, H]`."""
    L, W = cache.k.shape[0], slots or cache.k.shape[2]
    return tuple(x for l in range(L)
                 for x in (jnp.transpose(cache.k[l, :, :W], (0, 2, 3, 1)), jnp.swapaxes(cache.v[l, :, :W], 1, 2)))


def grow_cache(kv: tuple[jax.Array, ...], slots: int) -> tuple[jax.Array, ...]:
    """`split_cache` arrays widened to `slots` slots (new slots zero)."""
    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, slots - x.shape[axis])
        return jnp.pad(x, widths)
    return tuple(pad(x, 3 if i % 2 == 0 else 2) for i, x in enumerate(kv))


def kv_windows(prompt_slots: int, new_slots: int, phases: int) -> list[int]:
    """Cache widths of the decode phases: phase j attends over the first `P + (j + 1) M / n` slots
    (the last phase over all `P + M`), so early steps do not read the empty tail of the cache."""
    phases = max(1, min(int(phases), new_slots))
    return [prompt_slots + (new_slots * (j + 1)) // phases for j in range(phases)]


def decode_weights(params, config: ModelConfig, fuse: bool) -> list[dict]:
    """Per-layer weight dicts for `decode_step` (fused projections when `fuse`)."""
    c = config
    out = []
    for l in range(c.num_layers):
        p = {k: v[l] for k, v in params["layers"].items()}
        p["wo"] = p["wo"].reshape(-1, p["wo"].shape[-1])  # [N*H, D]: no per-step relayout copy
        if fuse:
            D = p["wq"].shape[0]
            p["wqkv"] = jnp.concatenate([p.pop(n).reshape(D, -1) for n in ("wq", "wk", "wv")], axis=1)
            if c.qkv_bias:
                p["bqkv"] = jnp.concatenate([p.pop(n).reshape(-1) for n in ("bq", "bk", "bv")])
            p["wgu"] = jnp.concatenate([p.pop("w_gate"), p.pop("w_up")], axis=1)
        out.append(p)
    return out


def _layer(p, x, k_cache, v_cache, *, config: ModelConfig, positions, mask, index, inv_freq,
           fuse: bool):
    c = config
    cd = x.dtype
    B = x.shape[0]
    N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
    w = lambda name: p[name].astype(cd)  # noqa: E731

    h = rms_norm(x, p["attn_norm"], c.rms_norm_eps)
    if fuse:
        qkv = h @ w("wqkv")
        if c.qkv_bias:
            qkv = qkv + w("bqkv")
        q = qkv[:, :N * H].reshape(B, N, H)
        k = qkv[:, N * H:(N + K) * H].reshape(B, K, H)
        v = qkv[:, (N + K) * H:].reshape(B, K, H)
    else:
        q = jnp.einsum("bd,dnh->bnh", h, w("wq"))
        k = jnp.einsum("bd,dkh->bkh", h, w("wk"))
        v = jnp.einsum("bd,dkh->bkh", h, w("wv"))
        if c.qkv_bias:
            q, k, v = q + w("bq"), k + w("bk"), v + w("bv")
    if c.qk_norm:
        q = rms_norm(q, p["q_norm"], c.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], c.rms_norm_eps)
    q = apply_rope(q[:, None], positions[:, None], inv_freq)[:, 0]
    k = apply_rope(k[:, None], positions[:, None], inv_freq)[:, 0]
    k_cache = lax.dynamic_update_slice(k_cache, k[:, :, :, None].astype(k_cache.dtype), (0, 0, 0, index))
    v_cache = lax.dynamic_update_slice(v_cache, v[:, :, None, :].astype(v_cache.dtype), (0, 0, index, 0))

    qg = q.reshape(B, K, N // K, H)  # query head n = kv head n // G, as in grouped-query attention
    s = jnp.einsum("bkgh,bkhs->bkgs", qg, k_cache.astype(cd),
                   preferred_element_type=jnp.float32) * (1.0 / math.sqrt(H))
    s = jnp.where(mask, s, jnp.finfo(jnp.float32).min)
    a = jax.nn.softmax(s, axis=-1).astype(cd)
    o = jnp.einsum("bkgs,bksh->bkgh", a, v_cache.astype(cd)).reshape(B, N * H)
    out = o @ w("wo")
    if c.o_bias:
        out = out + w("bo")
    x = x + out

    h = rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
    if fuse:
        gu = h @ w("wgu")
        F = gu.shape[-1] // 2
        gate, up = gu[:, :F], gu[:, F:]
    else:
        gate = h @ w("w_gate")
        up = h @ w("w_up")
    x = x + (jax.nn.silu(gate) * up) @ w("w_down")
    return x, k_cache, v_cache


def output_head(params, config: ModelConfig, fuse: bool) -> jax.Array:
    """The vocabulary projection: `lm_head` `[D, V]`, or for tied embeddings the embedding
    `[V, D]` -- transposed once per call to `[D, V]` when `fuse` (small models, where each
    step's plain `[B, D] @ [D, V]` matmul is measurably faster)."""
    if not config.tie_word_embeddings:
        return params["lm_head"]
    return params["embed"].T if fuse else params["embed"]


def decode_step(params, weights: list[dict], head: jax.Array, tokens: jax.Array,
                positions: jax.Array, kv: tuple[jax.Array, ...], valid: jax.Array,
                index: jax.Array, *, config: ModelConfig, fuse: bool):
    """Logits `[B, V]` (float32) of the next token after `tokens` `[B]` and the updated caches.

    head: from `output_head`; positions: `[B]` rotary positions of `tokens`; kv: from `split_cache`; valid:
    `[B, S]` slots holding real tokens (any slot >= index may be True: the causal
    limit `slot <= index` is applied here); index: the slot `tokens` are written to.
    """
    c = config
    cd = jnp.dtype(c.dtype)
    S = kv[1].shape[2]
    x = jnp.take(params["embed"], tokens, axis=0).astype(cd)
    mask = ((jnp.arange(S) <= index)[None, :] & valid)[:, None, None, :]  # [B, 1, 1, S]
    inv_freq = inverse_frequencies(c)
    new = []
    for l in range(c.num_layers):
        x, k, v = _layer(weights[l], x, kv[2 * l], kv[2 * l + 1], config=c, positions=positions,
                         mask=mask, index=index, inv_freq=inv_freq, fuse=fuse)
        new += [k, v]
    h = rms_norm(x, params["final_norm"], c.rms_norm_eps)
    vd = c.tie_word_embeddings and not fuse  # head is the [V, D] embedding itself
    logits = jnp.einsum("bd,vd->bv" if vd else "bd,dv->bv", h, head.astype(cd),
                        preferred_element_type=jnp.float32)
    return logits, tuple(new)
