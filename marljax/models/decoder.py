"""One decoder for Qwen2/2.5, Qwen3 and Llama 3.x, as config switches.

Layout. The NNX module `Decoder` only owns parameters; the maths lives in pure
functions over a plain nested dict of arrays (`get_params(model)`), so hot
paths can `jax.jit` over plain pytrees with the hashable `ModelConfig` as a
static argument:

    params = get_params(model)                       # {'embed': [V, D], 'layers': {...}, ...}
    logits, _ = forward(params, ids, config=model.config, positions=pos, attention_mask=m)

Layer parameters are stacked on a leading `layers` axis and the layers run
under `lax.scan`, so compile time does not grow with depth (or unrolled, with
`ModelConfig.scan_layers` False: faster steps on CPU), and `remat` wraps one
layer. Parameter shapes (L layers, D hidden, N query heads, K kv heads,
H head_dim, F mlp, V vocab):

    embed [V, D]              lm_head [D, V] (absent when tied)   final_norm [D]
    layers/attn_norm [L, D]   layers/mlp_norm [L, D]
    layers/wq [L, D, N, H]    layers/wk, wv [L, D, K, H]          layers/wo [L, N, H, D]
    layers/bq [L, N, H]       layers/bk, bv [L, K, H]             layers/bo [L, D]   (biases: optional)
    layers/q_norm, k_norm [L, H] (Qwen3)
    layers/w_gate, w_up [L, D, F]   layers/w_down [L, F, D]

Masks. Without a cache, token t attends to token s when `s <= t`,
`attention_mask[b, s]` is set and (if given) `segment_ids[b, s] ==
segment_ids[b, t]` -- so left padding, right padding and packed sequences all
work, given explicit `positions` (rotary positions, `[B, T]`).

KV cache. `init_cache` preallocates `[L, B, S, K, H]` keys and values; a call
with `cache=` writes the T new tokens at slots `[index, index + T)` with
`lax.dynamic_update_slice` (static shapes for every decode step) and the new
tokens attend to every filled, unmasked slot at or before their own.

One layer is three pure pieces, shared with the sampler's one-token decode
step (`marljax.models.decode`, which keeps its own cache layout):
`project_qkv` (RMSNorm, q/k/v projections and biases, Qwen3 q/k norm, RoPE),
attention (`marljax.models.attention.attend`, one entry point for every cache layout) and
`out_and_mlp` (output projection, residual, SwiGLU MLP). They accept either
parameter layout: the module's separate projections, or the fused ones of
`fuse_projections` (q/k/v in one matrix, gate/up in one), a layout choice for
short steps where fewer, larger matmuls pay off.
"""

from __future__ import annotations

import dataclasses
import functools
from operator import itemgetter
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from marljax.kernels.losses_terms import entropy_from_logits, logprobs_from_logits
from marljax.models.attention import attend
from marljax.models.config import ModelConfig
from marljax.models.lora import LayerLora, lora_delta
from marljax.models.rope import apply_rope, inverse_frequencies
from marljax.models.sharding import (
    LogicalRules,
    batch_sharding,
    constrain,
    logical_to_spec,
    param_shardings,
)

Params = dict[str, Any]


def _dtype(name: str):
    return jnp.dtype(name)


def _pin(x: jax.Array, *feature_axes: str | None) -> jax.Array:
    """An activation `[B, T, *features]` (or `[B, *features]`) pinned to the mesh of the enclosing
    `activation_sharding`: rows over the data axes, features by their logical names."""
    return constrain(x, ("batch", "seq")[: x.ndim - len(feature_axes)] + feature_axes)


# --------------------------------------------------------------------- module
def _param(rngs: nnx.Rngs, shape, axes, dtype, init: str = "normal", std: float = 0.02) -> nnx.Param:
    if init == "normal":
        value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(shape, jnp.float32)
    else:
        value = jnp.ones(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=tuple(axes))


class DecoderLayers(nnx.Module):
    """Parameters of all decoder layers, stacked on a leading `layers` axis."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c = config
        L, D, F, N, K, H = (
            c.num_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
        )
        pd = _dtype(c.param_dtype)
        p = functools.partial(_param, rngs, dtype=pd)
        self.attn_norm = p((L, D), ("layers", "norm"), init="ones")
        self.wq = p((L, D, N, H), ("layers", "embed", "q_heads", "head_dim"))
        self.wk = p((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"))
        self.wv = p((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"))
        self.wo = p((L, N, H, D), ("layers", "q_heads", "head_dim", "embed"))
        if c.qkv_bias:
            self.bq = p((L, N, H), ("layers", "q_heads", "head_dim"), init="zeros")
            self.bk = p((L, K, H), ("layers", "kv_heads", "head_dim"), init="zeros")
            self.bv = p((L, K, H), ("layers", "kv_heads", "head_dim"), init="zeros")
        if c.o_bias:
            self.bo = p((L, D), ("layers", "norm"), init="zeros")
        if c.qk_norm:
            self.q_norm = p((L, H), ("layers", "head_dim"), init="ones")
            self.k_norm = p((L, H), ("layers", "head_dim"), init="ones")
        self.mlp_norm = p((L, D), ("layers", "norm"), init="ones")
        self.w_gate = p((L, D, F), ("layers", "embed", "mlp"))
        self.w_up = p((L, D, F), ("layers", "embed", "mlp"))
        self.w_down = p((L, F, D), ("layers", "mlp", "embed"))


class Decoder(nnx.Module):
    """A Qwen2/Qwen3/Llama causal LM. Build with random weights (`Decoder(config,
    rngs=nnx.Rngs(0))`), or load one with `marljax.models.from_pretrained`.

    Calling it is `forward(get_params(self), ..., config=self.config)`.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        pd = _dtype(config.param_dtype)
        V, D = config.vocab_size, config.hidden_size
        self.embed = _param(rngs, (V, D), ("vocab", "embed"), pd)
        self.layers = DecoderLayers(config, rngs)
        self.final_norm = _param(rngs, (D,), ("norm",), pd, init="ones")
        if not config.tie_word_embeddings:
            self.lm_head = _param(rngs, (D, V), ("embed", "vocab"), pd)

    def __call__(
        self, input_ids, positions=None, attention_mask=None, segment_ids=None, cache: KVCache | None = None
    ):
        """Logits `[B, T, V]` float32 and the updated cache (None without one)."""
        return forward(
            get_params(self),
            input_ids,
            config=self.config,
            positions=positions,
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            cache=cache,
        )

    def token_logprobs(
        self,
        input_ids,
        labels,
        positions=None,
        attention_mask=None,
        segment_ids=None,
        temperature=1.0,
        chunk_size: int = 256,
    ):
        """Per-token log-probs `[B, T]` of `labels`; see `token_logprobs`."""
        return token_logprobs(
            get_params(self),
            input_ids,
            labels,
            config=self.config,
            positions=positions,
            attention_mask=attention_mask,
            segment_ids=segment_ids,
            temperature=temperature,
            chunk_size=chunk_size,
        )

    def init_cache(self, batch_size: int, max_len: int) -> KVCache:
        return init_cache(self.config, batch_size, max_len)


def abstract_model(config: ModelConfig) -> Decoder:
    """A `Decoder` whose parameters are `jax.ShapeDtypeStruct`s (with their `logical_axes`):
    the model's structure, shapes, dtypes and sharding metadata, without allocating anything.

    The starting point for loading (`from_pretrained`), shardings (`param_dict_shardings`) and
    memory estimates; `set_params` fills it with real arrays.
    """
    return nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))


def init_model(config: ModelConfig, *, seed: int = 0, mesh=None, rules=None) -> Decoder:
    """A randomly initialised `Decoder`, built in one compiled step.

    With `mesh`, every parameter is created directly with its `NamedSharding`
    from the rule table (never whole on one device) -- for benchmarks and
    training from scratch.
    """
    graphdef, abstract = nnx.split(abstract_model(config))
    out_shardings = None if mesh is None else param_shardings(abstract, mesh, rules)

    @functools.partial(jax.jit, out_shardings=out_shardings)
    def make():
        return nnx.split(Decoder(config, rngs=nnx.Rngs(seed)))[1]

    return nnx.merge(graphdef, make())


def get_params(model: Decoder) -> Params:
    """The model's parameters as a plain nested dict of arrays (shapes in the module doc)."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def set_params(model: Decoder, params: Params) -> Decoder:
    """Write a nested dict from `get_params` (e.g. after an optimiser step) back into `model`."""
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    return model


# ---------------------------------------------------------------------- cache
@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Preallocated keys/values of every layer.

    k, v: `[L, B, S, K, H]` (compute dtype); mask: `[B, S]` bool, True for filled
    slots that are real tokens; index: `[]` int32, the next slot to write
    (the same for every row: left-pad prompts so they end together).
    The caller keeps `index + T <= S`: under jit the write position cannot be
    checked, and `lax.dynamic_update_slice` clamps instead of failing.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    index: jax.Array


def init_cache(config: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty `KVCache` for `batch_size` rows and `max_len` slots."""
    dtype = _dtype(config.dtype) if dtype is None else dtype
    shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        mask=jnp.zeros((batch_size, max_len), bool),
        index=jnp.zeros((), jnp.int32),
    )


def param_dict_shardings(config: ModelConfig, mesh: Mesh, rules: LogicalRules | None = None) -> dict:
    """`NamedSharding`s for the plain parameter dict of `get_params(model)` (same keys), by the rules.

    Built from the abstract model, so it allocates nothing.
    """
    abstract = nnx.state(abstract_model(config), nnx.Param)
    return nnx.to_pure_dict(param_shardings(abstract, mesh, rules))


def cache_sharding(mesh: Mesh, cache: KVCache | None = None, rules: LogicalRules | None = None) -> KVCache:
    """Shardings for a `KVCache`: k/v `[L, B, S, K, H]`, mask `[B, S]`, index `[]`.

    Pass the (possibly abstract) `cache` so that dimensions the mesh does not
    divide (e.g. fewer kv heads than `tensor`) are replicated.
    """
    shape = None if cache is None else cache.k.shape
    kv = NamedSharding(
        mesh, logical_to_spec(("layers", "batch", "cache_seq", "kv_heads", "head_dim"), shape, mesh, rules)
    )
    return KVCache(
        k=kv, v=kv, mask=batch_sharding(mesh, 2, rules), index=NamedSharding(mesh, PartitionSpec())
    )


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """Rotary positions `[B, T]` for a left- or right-padded `attention_mask` `[B, T]`:
    0, 1, 2, ... over real tokens (pads get the neighbouring value; they are masked)."""
    m = attention_mask.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0)


# ------------------------------------------------------------------------ maths
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """`weight * x / rms(x)` over the last axis, normalised in float32 (as transformers)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * xf.astype(x.dtype)


def _matmul(x: jax.Array, w: jax.Array, **kw) -> jax.Array:
    """`x [..., I] @ w [I, *out]` as one 2-D matmul. XLA:CPU runs dots that
    contract several axes at once (the weight gradients of batched einsums)
    much slower than the same FLOPs as a plain matrix product (benchmarks/RESULTS.md,
    "Train step after the matmul and host-memory changes")."""
    y = jnp.matmul(x.reshape(-1, x.shape[-1]), w.reshape(w.shape[0], -1), **kw)
    return y.reshape(*x.shape[:-1], *w.shape[1:])


def fuse_projections(layer: Params) -> Params:
    """The same layer weights in the fused layout: q/k/v as one `wqkv` `[..., D, (N + 2K) H]`
    (biases as one `bqkv`) and gate/up as one `w_gate_up` `[..., D, 2F]`; other entries unchanged.

    `layer`: one layer's weights or the stacked `params["layers"]` (leading axes are kept).
    Fewer, larger matmuls: worth it where a step is short (one decode token on CPU), at the
    cost of a copy of those weights.
    """
    p = dict(layer)
    *lead, D, _, _ = p["wq"].shape
    p["wqkv"] = jnp.concatenate([p.pop(n).reshape(*lead, D, -1) for n in ("wq", "wk", "wv")], axis=-1)
    if "bq" in p:
        p["bqkv"] = jnp.concatenate([p.pop(n).reshape(*lead, -1) for n in ("bq", "bk", "bv")], axis=-1)
    p["w_gate_up"] = jnp.concatenate([p.pop("w_gate"), p.pop("w_up")], axis=-1)
    return p


def _plus_lora(y: jax.Array, lora: LayerLora | None, name: str, h: jax.Array) -> jax.Array:
    """`y` (the base projection of `h`) plus its LoRA update, if weight `name` has one."""
    delta = lora_delta(lora, name, h)
    return y if delta is None else y + delta.reshape(y.shape).astype(y.dtype)


def project_qkv(
    p: Params,
    x: jax.Array,
    positions: jax.Array,
    *,
    config: ModelConfig,
    inv_freq,
    lora: LayerLora | None = None,
):
    """A layer's attention inputs from its residual stream `x` `[..., D]` at rotary `positions`
    `[...]`: queries `[..., N, H]`, keys and values `[..., K, H]`, in `x.dtype`.

    RMSNorm, the q/k/v projections (+ biases, + the rows' LoRA updates), Qwen3's q/k RMSNorm,
    then RoPE on q and k. `p`: one layer's weights, separate or fused (`fuse_projections`).
    """
    c = config
    N, K, H = c.num_heads, c.num_kv_heads, c.head_dim

    def w(name):
        return p[name].astype(x.dtype)

    h = rms_norm(x, p["attn_norm"], c.rms_norm_eps)
    if "wqkv" in p:
        qkv = _matmul(h, w("wqkv"))
        if c.qkv_bias:
            qkv = qkv + w("bqkv")
        lead = qkv.shape[:-1]
        q = qkv[..., : N * H].reshape(*lead, N, H)
        k = qkv[..., N * H : (N + K) * H].reshape(*lead, K, H)
        v = qkv[..., (N + K) * H :].reshape(*lead, K, H)
    else:
        q, k, v = _matmul(h, w("wq")), _matmul(h, w("wk")), _matmul(h, w("wv"))
        if c.qkv_bias:
            q, k, v = q + w("bq"), k + w("bk"), v + w("bv")
    q, k, v = (_plus_lora(y, lora, name, h) for y, name in ((q, "wq"), (k, "wk"), (v, "wv")))
    q, k, v = _pin(q, "act_heads", None), _pin(k, "act_kv_heads", None), _pin(v, "act_kv_heads", None)
    if c.qk_norm:
        q = rms_norm(q, p["q_norm"], c.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], c.rms_norm_eps)
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v


def out_and_mlp(
    p: Params, x: jax.Array, attn: jax.Array, *, config: ModelConfig, lora: LayerLora | None = None
) -> jax.Array:
    """The rest of the layer: `x` `[..., D]` plus the output projection of `attn` `[..., N, H]`
    (+ bias), then plus the SwiGLU MLP of its RMSNorm; each projection plus the rows' LoRA
    updates. `p` as in `project_qkv`."""
    c = config

    def w(name):
        return p[name].astype(x.dtype)

    flat = _pin(attn, "act_heads", None).reshape(*attn.shape[:-2], -1)
    out = _plus_lora(_matmul(flat, w("wo").reshape(-1, c.hidden_size)), lora, "wo", flat)
    if c.o_bias:
        out = out + w("bo")
    x = _pin(x + out, "act_embed")

    h = rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
    if "w_gate_up" in p:
        gate, up = jnp.split(_matmul(h, w("w_gate_up")), 2, axis=-1)
    else:
        gate, up = _matmul(h, w("w_gate")), _matmul(h, w("w_up"))
    gate, up = _plus_lora(gate, lora, "w_gate", h), _plus_lora(up, lora, "w_up", h)
    act = _pin(jax.nn.silu(_pin(gate, "act_mlp")) * _pin(up, "act_mlp"), "act_mlp")
    return _pin(x + _plus_lora(_matmul(act, w("w_down")), lora, "w_down", act), "act_embed")


def _layer(p: Params, x: jax.Array, kv, lora, *, config: ModelConfig, positions, mask, inv_freq):
    """One decoder layer. Without a cache `mask` is `(valid [B, T], segment_ids or None)` for
    causal `attend`; with one, `kv` is `(k_cache, v_cache, index)` and `mask` `[B, 1, T, S]`."""
    q, k, v = project_qkv(p, x, positions, config=config, inv_freq=inv_freq, lora=lora)
    q, k, v = (checkpoint_name(y, name) for y, name in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj")))
    new_kv = None
    if kv is None:
        valid, segment_ids = mask
        attn = attend(q, k, v, valid=valid, segment_ids=segment_ids, implementation=config.attention_impl)
    else:
        k_cache, v_cache, index = kv
        k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, index, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, index, 0, 0))
        new_kv = (k_cache, v_cache)
        attn = attend(q, k_cache.astype(x.dtype), v_cache.astype(x.dtype), mask=mask, layout="bskh")
    attn = checkpoint_name(attn, "context")
    return out_and_mlp(p, x, attn, config=config, lora=lora), new_kv


_policies = jax.checkpoint_policies
# What one layer keeps for the backward pass (`ModelConfig.remat`); the rest is recomputed.
# Names are the `checkpoint_name` tags of `_layer`; "dots" are the weight matmuls (no batch dims),
# not attention's score matmuls.
REMAT_SAVES = {
    "full": _policies.nothing_saveable,
    "save_qkv_proj": _policies.save_only_these_names("q_proj", "k_proj", "v_proj"),
    "dots": _policies.dots_with_no_batch_dims_saveable,
    "minimal": _policies.save_from_both_policies(
        _policies.dots_with_no_batch_dims_saveable, _policies.save_only_these_names("context")
    ),
}


def hidden_states(
    params: Params,
    input_ids: jax.Array,
    *,
    config: ModelConfig,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    adapter_ids: jax.Array | None = None,
    lora_dropout: tuple[float, jax.Array] | None = None,
):
    """Final (normed) hidden states `[B, T, D]` in the compute dtype, and the new cache.

    input_ids: `[B, T]` int. positions: `[B, T]` int rotary positions (default
    `arange(T)`, offset by `cache.index`; pass `positions_from_mask(mask)` for
    left-padded batches). attention_mask: `[B, T]` (1/True = real token).
    segment_ids: `[B, T]` int, tokens attend only within their segment (packing;
    not with a cache). cache: a `KVCache` to read and extend, or None.

    LoRA: with `params["lora"]` (adapters of this base in the layout of
    `marljax.models.lora.stack_adapters`), row b adds adapter `adapter_ids[b]`'s update to every
    targeted projection (default: adapter 0 for all rows); `lora_dropout` `(rate, key)` drops
    adapter inputs (training).
    """
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {input_ids.shape}")
    B, T = input_ids.shape
    for name, arr in (
        ("positions", positions),
        ("attention_mask", attention_mask),
        ("segment_ids", segment_ids),
    ):
        if arr is not None and arr.shape != (B, T):
            raise ValueError(f"{name} must have the shape of input_ids {(B, T)}, got {arr.shape}")
    cd = _dtype(config.dtype)
    x = _pin(jnp.take(params["embed"], input_ids, axis=0).astype(cd), "act_embed")
    valid = jnp.ones((B, T), bool) if attention_mask is None else attention_mask.astype(bool)
    offset = 0 if cache is None else cache.index
    if positions is None:
        positions = jnp.broadcast_to(offset + jnp.arange(T, dtype=jnp.int32), (B, T))

    if cache is None:
        mask = (valid, segment_ids)
        new_mask = None
    else:
        if segment_ids is not None:
            raise ValueError("segment_ids (packed sequences) cannot be combined with a KV cache")
        if cache.k.shape[1] != B:
            raise ValueError(f"cache has batch {cache.k.shape[1]} but input_ids has batch {B}")
        S = cache.k.shape[2]
        new_mask = jax.lax.dynamic_update_slice(cache.mask, valid, (0, cache.index))
        slot, q_slot = jnp.arange(S), cache.index + jnp.arange(T)
        mask = ((slot[None, :] <= q_slot[:, None])[None] & new_mask[:, None, :])[:, None]  # [B, 1, T, S]

    layer = functools.partial(
        _layer, config=config, positions=positions, mask=mask, inv_freq=inverse_frequencies(config)
    )
    if config.remat != "none":
        layer = jax.checkpoint(layer, policy=REMAT_SAVES[config.remat])

    def layer_lora(weights, i):
        if weights is None:
            return None
        dropout = None
        if lora_dropout is not None:
            dropout = (lora_dropout[0], jax.random.fold_in(lora_dropout[1], i))
        return LayerLora(weights, adapter_ids, dropout)

    layer_ids = jnp.arange(config.num_layers)
    if cache is None:

        def body(x, xs):
            p, lw, i = xs
            return layer(p, x, None, layer_lora(lw, i))[0], None

        x, _ = _run_layers(body, x, (params["layers"], params.get("lora"), layer_ids), config.scan_layers)
        new_cache = None
    else:

        def body(x, xs):
            p, lw, i, k, v = xs
            x, kv = layer(p, x, (k, v, cache.index), layer_lora(lw, i))
            return x, kv

        x, (ks, vs) = _run_layers(
            body, x, (params["layers"], params.get("lora"), layer_ids, cache.k, cache.v), config.scan_layers
        )
        new_cache = KVCache(k=ks, v=vs, mask=new_mask, index=cache.index + T)
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), new_cache


def _run_layers(body, x, xs, scan: bool):
    """`lax.scan(body, x, xs)`, or the same loop unrolled (`ModelConfig.scan_layers` False)."""
    if scan:
        return jax.lax.scan(body, x, xs)
    ys = []
    for i in range(jax.tree.leaves(xs)[0].shape[0]):
        x, y = body(x, jax.tree.map(itemgetter(i), xs))
        ys.append(y)
    return x, None if ys[0] is None else jax.tree.map(lambda *a: jnp.stack(a), *ys)


def unembed(params: Params, h: jax.Array) -> jax.Array:
    """float32 logits `[..., V]` from final hidden states `[..., D]`: through `lm_head` `[D, V]`
    when `params` has one, else through the tied embedding `[V, D]`."""
    w = params["lm_head"] if "lm_head" in params else params["embed"].T
    return _matmul(h, w.astype(h.dtype), preferred_element_type=jnp.float32)


def forward(
    params: Params,
    input_ids: jax.Array,
    *,
    config: ModelConfig,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    cache: KVCache | None = None,
    adapter_ids: jax.Array | None = None,
):
    """Logits `[B, T, V]` (float32) and the new cache (None when `cache` is None).

    Arguments as in `hidden_states`. Pure: jit it with `config` static, e.g.
    `jax.jit(forward, static_argnames="config")`.
    """
    h, new_cache = hidden_states(
        params,
        input_ids,
        config=config,
        positions=positions,
        attention_mask=attention_mask,
        segment_ids=segment_ids,
        cache=cache,
        adapter_ids=adapter_ids,
    )
    return unembed(params, h), new_cache


def logprobs_from_hidden(
    params: Params,
    hidden: jax.Array,
    labels: jax.Array,
    *,
    config: ModelConfig,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = 256,
    return_entropy: bool = False,
):
    """`log softmax(lm_head(hidden) / temperature)[labels]`, `[B, T]` float32.

    With `return_entropy`, also the entropy `[B, T]` of each position's
    distribution (at `temperature`), from the same chunked logits.

    hidden: `[B, T, D]`; labels: `[B, T]` int. The vocabulary projection runs
    over chunks of `chunk_size` positions (a `lax.map`, each chunk
    rematerialised in the backward pass), so at most `[B, chunk_size, V]`
    float32 logits are live at once, forward or backward. Log-probs and entropy
    of each chunk are `marljax.kernels`' `logprobs_from_logits` and
    `entropy_from_logits` (the sampler's log-probs are too, so both sides agree).
    """
    B, T, D = hidden.shape
    if labels.shape != (B, T):
        raise ValueError(f"labels must be [B, T] = {(B, T)}, got {labels.shape}")
    C = max(1, min(int(chunk_size), T))
    n = -(-T // C)
    pad = n * C - T
    hs = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(B, n, C, D).swapaxes(0, 1)
    hs = constrain(hs, (None, "batch", None, "act_embed"))  # [chunks, B, C, D]
    ls = jnp.pad(labels.astype(jnp.int32), ((0, 0), (0, pad))).reshape(B, n, C).swapaxes(0, 1)
    head = {"embed": params["embed"]} if config.tie_word_embeddings else {"lm_head": params["lm_head"]}

    @jax.checkpoint
    def chunk_logprobs(head, h, lab, temperature):
        # the temperature may be traced, so it scales the logits here, not inside the kernels
        logits = constrain(unembed(head, h) / temperature, ("batch", None, "act_vocab"))
        picked = logprobs_from_logits(logits, lab)
        return (picked, entropy_from_logits(logits)) if return_entropy else picked

    temperature = jnp.asarray(temperature, jnp.float32)
    out = jax.lax.map(lambda xs: chunk_logprobs(head, xs[0], xs[1], temperature), (hs, ls))
    return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(B, n * C)[:, :T], out)


def token_logprobs(
    params: Params,
    input_ids: jax.Array,
    labels: jax.Array,
    *,
    config: ModelConfig,
    positions: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = 256,
    adapter_ids: jax.Array | None = None,
) -> jax.Array:
    """Log-prob `[B, T]` (float32) of `labels[b, t]` under the model's next-token
    distribution at position t, at `temperature`, without building `[B, T, V]`.

    For the usual "log-prob of each response token", pass
    `labels = jnp.roll(input_ids, -1, axis=1)` and ignore the last column.
    """
    h, _ = hidden_states(
        params,
        input_ids,
        config=config,
        positions=positions,
        attention_mask=attention_mask,
        segment_ids=segment_ids,
        adapter_ids=adapter_ids,
    )
    return logprobs_from_hidden(
        params, h, labels, config=config, temperature=temperature, chunk_size=chunk_size
    )
