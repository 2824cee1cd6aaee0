"""LoRA adapters on a frozen decoder: `W x + scale * B(A(x))` for the targeted projections.

An adapter is a plain dict beside the base parameters, one entry per targeted weight, each
stacked over the layers like the base:

    {"wq": {"a": [L, in, r], "b": [L, r, out]}, "w_down": {...}, ...}

with `in`/`out` the projection's flattened input and output sizes (`wq`: D -> N H, `wo`:
N H -> D, ...) and `scale = alpha / rank`. `a` starts random (uniform in +-1/sqrt(in), as
peft's default) and `b` at zero, so a new adapter computes exactly the base.

The layer maths (`marljax.models.decoder`) reads adapters from `params["lora"]`, in the
*batched* layout of `stack_adapters`: one or more adapters of one base stacked on an adapter
axis, the scale folded into `b`,

    params["lora"] = {"wq": {"a": [L, in, A, r], "b": [L, A, r, out]}, ...}

together with a per-row adapter index `adapter_ids` `[B]` (`hidden_states`, `forward`,
`token_logprobs`, the sampler's `extend_step`). The base matmul is shared by every row; each
row adds its own adapter's low-rank update (`lora_delta`). Adapters of different ranks
or targets stack by zero padding (zero rows and columns add nothing). Nothing is ever merged
into a copy of the base, in training or sampling; `merge` exists for export only.

Why not qwix (the LoRA library tunix uses): qwix adds adapters by intercepting the
`dot_general` / `einsum` calls a Flax module makes inside its `__call__`, chosen by module path.
marljax's decoder runs its maths outside the modules, as pure functions over a plain parameter
dict (the NNX `Decoder` only owns parameters), and the sampler's decode step never calls a
module, so there is nothing for qwix to intercept; and qwix holds one adapter per module, while
the sampler needs rows of different adapters in one batch. A low-rank update is two small
matmuls, so it lives here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from marljax.models.config import ModelConfig

Adapter = dict[str, dict[str, Any]]

# config names of the targets -> the decoder's weight names
TARGETS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up", "down": "w_down"}
# the HF module of each weight (PEFT's target_modules and tensor names)
HF_MODULES = {
    "wq": "self_attn.q_proj",
    "wk": "self_attn.k_proj",
    "wv": "self_attn.v_proj",
    "wo": "self_attn.o_proj",
    "w_gate": "mlp.gate_proj",
    "w_up": "mlp.up_proj",
    "w_down": "mlp.down_proj",
}


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """An adapter's shape: `rank`, `alpha` (update scale `alpha / rank`), `targets` (names of
    `TARGETS`) and `dropout` (on the adapter's input, training only)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
    dropout: float = 0.0

    def __post_init__(self):
        bad = [t for t in self.targets if t not in TARGETS]
        if bad or not self.targets:
            raise ValueError(f"lora targets {list(self.targets)}: choose among {list(TARGETS)}")
        if self.rank < 1:
            raise ValueError(f"lora rank must be >= 1, got {self.rank}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def weights(self) -> tuple[str, ...]:
        """The decoder weight names this adapter updates."""
        return tuple(TARGETS[t] for t in self.targets)


def projection_dims(config: ModelConfig, weight: str) -> tuple[int, int]:
    """(input, output) sizes of a projection, flattened as `_matmul` sees it."""
    D, F, H = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * H, config.num_kv_heads * H
    return {
        "wq": (D, q),
        "wk": (D, kv),
        "wv": (D, kv),
        "wo": (q, D),
        "w_gate": (D, F),
        "w_up": (D, F),
        "w_down": (F, D),
    }[weight]


def init_adapter(config: ModelConfig, spec: LoraSpec, key: jax.Array, dtype: Any = None) -> Adapter:
    """A new adapter: `a` uniform in +-1/sqrt(in) (peft's Kaiming-uniform default), `b` zero,
    in the base's parameter dtype unless `dtype` is given."""
    dtype = jnp.dtype(config.param_dtype if dtype is None else dtype)
    L, r = config.num_layers, spec.rank
    out = {}
    for name, k in zip(spec.weights, jax.random.split(key, len(spec.weights))):
        n_in, n_out = projection_dims(config, name)
        bound = 1.0 / math.sqrt(n_in)
        out[name] = {
            "a": jax.random.uniform(k, (L, n_in, r), jnp.float32, -bound, bound).astype(dtype),
            "b": jnp.zeros((L, r, n_out), dtype),
        }
    return out


def adapter_shapes(config: ModelConfig, spec: LoraSpec) -> dict[str, dict[str, tuple[int, ...]]]:
    """Shapes of `init_adapter`'s arrays (for memory estimates)."""
    L, r = config.num_layers, spec.rank
    shapes = {}
    for name in spec.weights:
        n_in, n_out = projection_dims(config, name)
        shapes[name] = {"a": (L, n_in, r), "b": (L, r, n_out)}
    return shapes


def stack_adapters(adapters: Sequence[tuple[LoraSpec, Adapter]]) -> Adapter:
    """Adapters of one base in the batched layout of `params["lora"]`: adapter `i` of the list is
    index `i`; targets are the union, ranks padded to the largest with zeros, scales folded into
    `b`. Differentiable (training uses it with one adapter)."""
    if not adapters:
        raise ValueError("stack_adapters needs at least one adapter")
    rank = max(spec.rank for spec, _ in adapters)
    names = [n for n in TARGETS.values() if any(n in ad for _, ad in adapters)]
    out = {}
    for name in names:
        a_like, b_like = next((ad[name]["a"], ad[name]["b"]) for _, ad in adapters if name in ad)
        L, n_in, n_out = a_like.shape[0], a_like.shape[1], b_like.shape[2]
        a_rows, b_rows = [], []
        for spec, ad in adapters:
            if name in ad:
                a, b = ad[name]["a"], ad[name]["b"] * jnp.asarray(spec.scale, ad[name]["b"].dtype)
                pad = rank - a.shape[-1]
                a = jnp.pad(a, ((0, 0), (0, 0), (0, pad)))
                b = jnp.pad(b, ((0, 0), (0, pad), (0, 0)))
            else:
                a = jnp.zeros((L, n_in, rank), a_like.dtype)
                b = jnp.zeros((L, rank, n_out), b_like.dtype)
            a_rows.append(a)
            b_rows.append(b)
        out[name] = {"a": jnp.stack(a_rows, axis=2), "b": jnp.stack(b_rows, axis=1)}
    return out


def num_adapters(stacked: Adapter) -> int:
    """How many adapters `stack_adapters` stacked."""
    return next(iter(stacked.values()))["b"].shape[1]


class LayerLora(NamedTuple):
    """One layer's adapters (batched layout without the layer axis: `a` `[in, A, r]`, `b`
    `[A, r, out]`), each row's adapter index `ids` `[B]` (None: every row uses adapter 0), and
    optionally a dropout `(rate, key)` on the adapters' inputs."""

    weights: Adapter
    ids: jax.Array | None = None
    dropout: tuple[float, jax.Array] | None = None


def lora_delta(lora: LayerLora | None, name: str, h: jax.Array) -> jax.Array | None:
    """The low-rank update `[B, ..., out]` of weight `name` for inputs `h` `[B, ..., in]` (the
    same input as the base matmul), or None where the weight has no adapter."""
    if lora is None or name not in lora.weights:
        return None
    a, b = lora.weights[name]["a"].astype(h.dtype), lora.weights[name]["b"].astype(h.dtype)
    x = h.reshape(*h.shape[:-1], a.shape[0])
    if lora.dropout is not None:
        rate, key = lora.dropout
        key = jax.random.fold_in(key, list(TARGETS.values()).index(name))
        x = jnp.where(jax.random.bernoulli(key, 1.0 - rate, x.shape), x / (1.0 - rate), 0)
    n_in, A, r = a.shape
    flat = x.reshape(-1, n_in)
    if lora.ids is None or A == 1:  # one adapter for every row: two plain matmuls
        y = (flat @ a[:, 0]) @ b[0]
        return y.reshape(*x.shape[:-1], b.shape[-1])
    # rows of different adapters: every token runs through all adapters' `a` at once (one
    # [in, A r] matmul; `a`'s layout makes that a free reshape), the other adapters' ranks are
    # zeroed, and one [A r, out] matmul applies the row's own `b`. A step reads each adapter once
    # and costs tokens x A r x (in + out), small beside the base's tokens x in x out while A r is
    # small next to in and out; gathering every row's own matrices instead would copy rows x
    # r x (in + out) per layer and step and run as batched matrix-vector products.
    ids = jnp.broadcast_to(lora.ids.reshape(-1, *([1] * (x.ndim - 2))), x.shape[:-1]).reshape(-1)
    own = (ids[:, None] == jnp.arange(A)[None, :]).astype(h.dtype)  # [tokens, A]
    xa = (flat @ a.reshape(n_in, A * r)).reshape(-1, A, r) * own[:, :, None]
    y = xa.reshape(-1, A * r) @ b.reshape(A * r, b.shape[-1])
    return y.reshape(*x.shape[:-1], b.shape[-1])


def merge(params: dict, spec: LoraSpec, adapter: Adapter) -> dict:
    """The base `params` with the adapter folded into its weights (`W + scale * A B`): for
    export only; training and sampling apply the adapter beside the base."""
    layers = dict(params["layers"])
    for name, ab in adapter.items():
        w = layers[name]
        delta = jnp.einsum("lir,lro->lio", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
        layers[name] = (w.astype(jnp.float32) + spec.scale * delta.reshape(w.shape)).astype(w.dtype)
    return {**params, "layers": layers}
