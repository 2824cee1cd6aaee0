"""Per-device memory estimate of one policy: what stays resident, and the larger of its two phases.

A policy's device memory is its resident state plus the transient memory of whichever phase is
running; the phases on one device run one at a time:

- resident state: parameters, optimiser moments (AdamW / Adam keep two in the parameter dtype;
  SGD none), the KL reference and a copy in the sampler's layout where it has its own; adapter
  policies add their frozen base (below). Counted exactly from the model's shapes and the mesh's
  shardings.
- the update: the gradients (the accumulator and one micro-batch's, in the parameter dtype: they
  exist only while this policy updates), the activations of one micro-batch, and the
  compute-dtype copies of the parameters and gradients where the compute dtype is wider.
- sampling: the weights' copies in the sampler's compute dtype where it differs from the
  parameter dtype (narrower, e.g. float32 masters and bfloat16 compute: one, made by the sampler
  once per parameter change and dropped when an update starts; wider, on CPU: two, the prefill's
  and the decode loop's, each a program's temporaries; stacked adapters: those two), the
  KV cache of the sampler's slots, and the `[slots, vocab]` float32 logits of a step; where the
  sampler's mesh splits the weights over `fsdp`, every weight gathered whole in the compute dtype
  (XLA gathers them once per call, out of the decode loop) instead of those copies: an upper
  bound for large models, whose layers XLA may gather one at a time. The prefill of a full slot
  batch adds one layer's intermediates for every slot's prompt (`prefill`, given the prompt length).

`peak` is the resident state plus the larger transient; `team_bytes` (several policies on one
device) is every policy's resident state, each frozen base once, and the largest transient of any
policy in either phase.

Activations are an estimate of what one micro-batch keeps for the backward pass, per device
(the model pins activations to rows over `data x fsdp`, so a device holds `rows = micro_batch_size
/ (data x fsdp)` rows; H / K query / kv heads and F mlp width are those on this device, split over
`tensor`; D hidden, hd head dim, L layers, T tokens per row), by `model.remat`, the named policy
of what each layer saves (`marljax.models.decoder.REMAT_SAVES`), per token and layer:

- none: every intermediate, about `4 D + (3 H + 4 K) hd + 4 F` values plus `2 H T` float32
  attention scores;
- full: the layer input, `D`;
- save_qkv_proj: the input and the q / k / v projections, `D + (H + 2 K) hd`;
- dots: the input and every weight matmul's output (q / k / v, the attention output projection,
  gate, up, down), `3 D + (H + 2 K) hd + 2 F`;
- minimal: dots and the attention context, `3 D + (2 H + 2 K) hd + 2 F`;
- the backward pass holds either one layer's intermediates while it is recomputed (the `none`
  figure; with remat only) or the loss head's, whichever is larger: two `[rows, 256, V]` float32
  logit chunks (the logits and their gradient) and, where `fsdp` splits the weights, the
  (un)embedding gathered whole, twice in the compute dtype, and its float32 gradient,
  `V x D x (2 cd + 4)` bytes.

These were fitted to the temporaries of the compiled update for TPU v5p (`marljax compile`:
Qwen2.5-0.5B at fsdp 8 and 64, a Llama-3-8B shape at fsdp 64; benchmarks/RESULTS.md).

Compute dtype. With `param_dtype` narrower than the compute dtype (bfloat16 storage, float32
compute) the update casts the parameters to the compute dtype and holds the gradients in it
before they are cast back: one copy of each. On CPU the compute dtype is float32 even for `dtype:
bfloat16`: XLA:CPU converts bfloat16 matmul operands to float32 and hoists the conversion of the
weights out of the decode loop and the backward pass, so float32 copies of the weights exist while
sampling and updating (measured with `memory_analysis()`, benchmarks/RESULTS.md). On a GPU with
float32 master weights and bfloat16 compute, sampling holds one bfloat16 copy of the weights, the
sampler's (`marljax.train.sampling`); the update's bfloat16 casts are not counted (not measured
apart; see issue 28's GPU table). An adapter policy's base keeps its bfloat16 copy through the
update too (it is shared and frozen), counted here in the sampling phase only.

Adapter policies (`lora:`): the trainable parameters, optimiser moments, gradients and reference
are the adapter's (`L x rank x (in + out)` per targeted projection, replicated on every device);
the frozen base is counted as `base`, once per base for a team (`team_bytes`), with its copy in a
sampler layout of its own. A team of adapters on one base samples in one call: the base's
compute-dtype copies once, plus the team's adapters stacked (`stack_adapters`) and their copies.

Knobs to fit: `model.remat` (memory: none > minimal > dots > save_qkv_proj > full),
`micro_batch_size` (rows per forward/backward), `mesh.fsdp` / `mesh.tensor` (split parameters,
moments and gradients), `sampler.slots` (KV cache and logits), `model.param_dtype` / `dtype`
(bfloat16 halves the state; on CPU sampling and updates still make float32 copies of the
weights, so it saves the resident state only).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
from flax import nnx

from marljax.models.config import ModelConfig
from marljax.models.decoder import abstract_model
from marljax.models.lora import LoraSpec, adapter_shapes
from marljax.models.sharding import MESH_AXES, logical_to_spec

MOMENTS = {"adamw": 2, "adam": 2, "sgd": 0}  # optimiser state per parameter, in the parameter dtype
LOGIT_CHUNK = 256  # positions per logits chunk in `logprobs_from_hidden`


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def param_bytes(config: ModelConfig, mesh_shape: Mapping[str, int] | None = None) -> tuple[int, int]:
    """(total bytes, bytes on the most loaded device) of the parameters under the rule table."""
    state = nnx.state(abstract_model(config), nnx.Param)
    mesh = None if mesh_shape is None else SimpleNamespace(shape={a: mesh_shape.get(a, 1) for a in MESH_AXES})
    total = per_device = 0
    for _, var in nnx.to_flat_state(state):
        sds = var.get_value()
        size = int(np.prod(sds.shape)) * np.dtype(sds.dtype).itemsize
        total += size
        if mesh is None:
            per_device += size
            continue
        spec = logical_to_spec(var.get_metadata()["logical_axes"], sds.shape, mesh)
        split = math.prod(
            math.prod(mesh.shape[a] for a in ((s,) if isinstance(s, str) else s))
            for s in spec
            if s is not None
        )
        per_device += size // split
    return total, per_device


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device of one policy (see the module doc for what each term counts)."""

    policy: str
    mesh_shape: dict
    total_params: int  # bytes of all parameters (unsharded)
    params: int
    optimizer: int
    gradients: int  # accumulator + one micro-batch's gradients (the update only)
    reference: int
    sampler_copy: int
    activations: int  # one micro-batch, with the configured remat
    compute_copy: int  # the update's parameters and gradients in the compute dtype, where it is wider
    activations_alt: int  # the same with the other end of remat (`full` for `none`, else `none`)
    remat: str  # the named remat policy (`ModelConfig.remat`)
    rows: int  # rows of a micro-batch on one device
    seq_len: int
    kv_per_sequence: int  # sampler KV cache of one sequence of seq_len tokens
    slots: int = 1  # sampler slots on this device (sequences decoding at once)
    base: int = 0  # adapter policies: the frozen base (shared by the adapter policies on it)
    base_key: Any = None  # adapter policies with equal keys share one base
    sampler_weights: int = 0  # the model's weights in the sampler's layout (an adapter policy's: the base's)
    weight_copies: float = 0.0  # compute-dtype copies of the weights while sampling, per byte of them
    sampling_copies: float = 0.0  # compute-dtype copies of stacked adapters a sampling call holds, per byte
    logits_per_slot: int = 0  # a decode step's float32 logits of one slot
    prefill_activations: int = 0  # one layer's intermediates for a full slot batch's prompts (`prompt_len`)
    gathered: int = 0  # weights a sampling step gathers whole where the sampler's mesh splits them on fsdp

    @property
    def kv_cache(self) -> int:
        """The sampler's KV cache: allocated for its slots, whatever the number of requests."""
        return self.kv_per_sequence * self.slots

    @property
    def logits(self) -> int:
        return self.logits_per_slot * self.slots

    @property
    def state(self) -> int:
        """What stays resident between the phases."""
        return self.params + self.optimizer + self.reference + self.sampler_copy + self.base

    @property
    def update(self) -> int:
        """Transient bytes of this policy's update."""
        return self.gradients + self.activations + self.compute_copy

    @property
    def sampling(self) -> int:
        """Transient bytes of a sampling call of this policy alone."""
        return sampling_bytes([self])

    @property
    def prefill(self) -> int:
        """Transient bytes of a sampling call's prefill of every slot (with `prompt_len`)."""
        return self.sampling + self.prefill_activations

    @property
    def peak(self) -> int:
        return self.state + max(self.update, self.sampling)

    def report(self, optimizer: str = "adamw", device_limit: int | None = None) -> str:
        n = self.policy
        mesh = " ".join(f"{a}={self.mesh_shape.get(a, 1)}" for a in MESH_AXES)
        copies = (
            self.sampling - self.kv_cache - self.logits - self.gathered - (self.params if self.base else 0)
        )
        lines = [
            f"memory estimate, policy {n!r} ({_bytes(self.total_params)} of parameters; mesh {mesh}; per device):",
            f"  resident: {'adapter' if self.base else 'parameters'} {_bytes(self.params)} + optimizer "
            f"({optimizer}, {MOMENTS.get(optimizer, 2)} moments) {_bytes(self.optimizer)} + reference "
            f"{_bytes(self.reference)} + sampler copy {_bytes(self.sampler_copy)}"
            + (
                f" + frozen base {_bytes(self.base)} (shared by the adapter policies on it)"
                if self.base
                else ""
            )
            + f" = {_bytes(self.state)}",
            f"  update: gradients {_bytes(self.gradients)} + activations per micro-batch ({self.rows} rows x "
            f"{self.seq_len} tokens) ~{_bytes(self.activations)} with remat {self.remat} "
            f"(~{_bytes(self.activations_alt)} with remat {_other_remat(self.remat)})"
            + (
                f" + compute-dtype copies of parameters and gradients {_bytes(self.compute_copy)}"
                if self.compute_copy
                else ""
            )
            + f" = ~{_bytes(self.update)}",
            f"  sampling: KV cache {_bytes(self.kv_cache)} ({self.slots} slots x {_bytes(self.kv_per_sequence)})"
            f" + logits {_bytes(self.logits)}"
            + (f" + compute-dtype weight copies {_bytes(copies)}" if copies else "")
            + (f" + weights gathered over fsdp {_bytes(self.gathered)}" if self.gathered else "")
            + (f" + stacked adapter {_bytes(self.params)}" if self.base else "")
            + f" = ~{_bytes(self.sampling)}",
            f"  peak ~{_bytes(self.peak)} (resident + the larger phase: "
            f"{'update' if self.update >= self.sampling else 'sampling'})",
        ]
        if device_limit:
            verdict = "fits" if self.peak <= device_limit else "DOES NOT FIT"
            lines.append(f"  device memory {_bytes(device_limit)}: {verdict}")
        lines.append(
            f"  knobs: policies.{n}.model.remat, policies.{n}.micro_batch_size, policies.{n}.mesh.fsdp / "
            f"tensor, policies.{n}.model.param_dtype / dtype, sampler.slots"
        )
        return "\n".join(lines)

    def summary(self, device_limit: int | None = None) -> str:
        """The estimate in one line (`report` has the breakdown)."""
        phase = "update" if self.update >= self.sampling else "sampling"
        fit = ""
        if device_limit:
            fit = f"; {'fits in' if self.peak <= device_limit else 'DOES NOT FIT in'} {_bytes(device_limit)}"
        return (
            f"memory estimate, policy {self.policy!r}: peak ~{_bytes(self.peak)} per device (resident "
            f"{_bytes(self.state)} + {phase}){fit}"
        )


def _other_remat(remat: str) -> str:
    return "full" if remat == "none" else "none"


def _saved_per_token(remat: str, D: int, H: int, K: int, F: int, hd: int) -> int:
    """Compute-dtype values one layer saves per token under the remat policy (module doc)."""
    dots = 3 * D + (H + 2 * K) * hd + 2 * F
    saves = {
        "full": D,
        "save_qkv_proj": D + (H + 2 * K) * hd,
        "dots": dots,
        "minimal": dots + H * hd,
    }
    if remat not in saves:
        raise ValueError(f"remat must be one of none, {', '.join(saves)}; got {remat!r}")
    return saves[remat]


def _split(c: ModelConfig, tensor: int) -> tuple[int, int, int]:
    """(query heads, kv heads, mlp width) on one device: split over `tensor` where they divide."""
    return tuple(
        n // tensor if n % tensor == 0 else n for n in (c.num_heads, c.num_kv_heads, c.intermediate_size)
    )


def _layer_bytes(c: ModelConfig, rows: int, T: int, tensor: int) -> int:
    """One layer's intermediates for `rows x T` tokens (module doc, remat none)."""
    H, K, F = _split(c, tensor)
    cd = np.dtype(c.dtype).itemsize
    return rows * T * (cd * (4 * c.hidden_size + (3 * H + 4 * K) * c.head_dim + 4 * F) + 4 * 2 * H * T)


def _activations(c: ModelConfig, rows: int, T: int, tensor: int, remat: str, fsdp: int = 1) -> int:
    cd = np.dtype(c.dtype).itemsize
    H, K, F = _split(c, tensor)
    D, hd = c.hidden_size, c.head_dim
    layer = _layer_bytes(c, rows, T, tensor)
    head = 2 * rows * min(LOGIT_CHUNK, T) * c.vocab_size * 4 + 2 * rows * T * D * cd
    if fsdp > 1:  # the gathered (un)embedding: two compute-dtype copies and a float32 gradient
        head += c.vocab_size * D * (2 * cd + 4) // (tensor if c.vocab_size % tensor == 0 else 1)
    if remat == "none":
        return c.num_layers * layer + head
    saved = c.num_layers * rows * T * cd * _saved_per_token(remat, D, H, K, F, hd)
    return saved + max(layer, head)


def estimate(
    config: ModelConfig,
    *,
    name: str = "policy",
    mesh_shape: Mapping[str, int] | None = None,
    micro_batch_size: int = 8,
    seq_len: int = 1024,
    optimizer: str = "adamw",
    reference: bool = False,
    remat: str | bool | None = None,
    sampler_mesh_shape: Mapping[str, int] | None = None,
    platform: str | None = None,
    sampler_slots: int = 64,
    lora: LoraSpec | None = None,
    base_key: Any = None,
    prompt_len: int | None = None,
) -> MemoryEstimate:
    """Per-device estimate for a model, mesh and update settings (no devices needed: plan ahead).

    `sampler_mesh_shape`: the sampler's layout when it differs (a second copy of the parameters).
    `sampler_slots`: sequences the sampler decodes at once (`sampler.slots`), over its data axes.
    `remat`: a named remat policy (default `config.remat`; True / False read as full / none).
    `platform`: the JAX backend ("cpu" computes bfloat16 in float32; see the module doc).
    `lora`: an adapter policy's adapter on this (frozen) model; `base_key` names its base.
    `prompt_len`: the sampler's prompt bucket, for the prefill's activations (`prefill_activations`:
    one layer's intermediates for every slot's prompt; 0 when not given).
    """
    shape = {a: int((mesh_shape or {}).get(a, 1)) for a in MESH_AXES}
    total, params = param_bytes(config, shape)
    remat = config.remat if remat is None else {True: "full", False: "none"}.get(remat, remat)
    rows = max(1, micro_batch_size // (shape["data"] * shape["fsdp"]))
    copy = param_bytes(config, sampler_mesh_shape)[1] if sampler_mesh_shape is not None else 0
    sampler_weights = copy or params
    compute = np.dtype(config.dtype).itemsize
    if platform == "cpu":
        compute = max(compute, 4)
    widen = compute / np.dtype(config.param_dtype).itemsize
    kv = (
        2
        * config.num_layers
        * seq_len
        * config.num_kv_heads
        * config.head_dim
        * np.dtype(config.dtype).itemsize
    )
    sampler = {a: int((sampler_mesh_shape or shape).get(a, 1)) for a in MESH_AXES}
    slots = -(-sampler_slots // (sampler["data"] * sampler["fsdp"]))
    base = 0
    activations = _activations(config, rows, seq_len, shape["tensor"], remat, shape["fsdp"])
    activations_alt = _activations(config, rows, seq_len, shape["tensor"], _other_remat(remat), shape["fsdp"])
    compute_copy = int(2 * params * widen) if widen > 1 else 0
    if lora is not None:
        # the frozen base and its copy in a sampler layout of its own: shared by the adapters on it
        base, copy = params + copy, 0
        params = adapter_bytes(config, lora)
        # each targeted projection keeps its rank-r input product for the backward pass
        extra = config.num_layers * rows * seq_len * lora.rank * len(lora.weights) * compute
        activations, activations_alt = activations + extra, activations_alt + extra
        compute_copy = int((base + 2 * params) * widen) if widen > 1 else 0
    return MemoryEstimate(
        policy=name,
        mesh_shape=shape,
        total_params=total,
        params=params,
        optimizer=MOMENTS.get(optimizer, 2) * params,
        gradients=2 * params,
        reference=params if reference else 0,
        sampler_copy=copy,
        activations=activations,
        compute_copy=compute_copy,
        activations_alt=activations_alt,
        remat=remat,
        rows=rows,
        seq_len=seq_len,
        kv_per_sequence=kv,
        slots=slots,
        base=base,
        base_key=base_key,
        sampler_weights=sampler_weights,
        # narrower compute: one copy, the sampler's (`SamplerView`, made once per parameter change);
        # wider (CPU): the prefill's and the decode loop's, hoisted out of each program, as for
        # adapters, which every program casts
        weight_copies=widen if widen < 1 else (2 * widen if widen > 1 else 0.0),
        sampling_copies=2 * widen if widen != 1 else 0.0,
        logits_per_slot=4 * config.vocab_size,
        gathered=_gathered(config, sampler_mesh_shape or shape, compute),
        prefill_activations=0
        if prompt_len is None
        else _layer_bytes(config, slots, prompt_len, sampler["tensor"]),
    )


def _gathered(c: ModelConfig, mesh_shape: Mapping[str, int], compute: int) -> int:
    """Bytes a sampling call gathers over `fsdp`: every weight, in the compute dtype (split over
    `tensor` where it divides), as XLA does for a small model by hoisting the gathers out of the
    decode loop; an upper bound for a large one, whose layers XLA may gather one at a time."""
    if mesh_shape.get("fsdp", 1) == 1:
        return 0
    t = mesh_shape.get("tensor", 1)
    embed = c.vocab_size * c.hidden_size
    rest = c.num_params() - embed * (1 if c.tie_word_embeddings else 2)
    return compute * (
        embed * (1 if c.tie_word_embeddings else 2) // (t if c.vocab_size % t == 0 else 1) + rest // t
    )


def adapter_bytes(config: ModelConfig, lora: LoraSpec) -> int:
    """Bytes of one adapter (`marljax.models.lora.init_adapter`, in the parameter dtype)."""
    size = sum(math.prod(s) for ab in adapter_shapes(config, lora).values() for s in ab.values())
    return size * np.dtype(config.param_dtype).itemsize


def sampling_bytes(estimates: Sequence[MemoryEstimate]) -> int:
    """Transient bytes of one sampling call of `estimates` (one policy, or adapter policies on one
    base sampled together): the compute-dtype copies of the weights it reads, the KV cache of the
    sampler's slots and a step's logits; adapters are stacked into one array for the call."""
    e = estimates[0]
    adapters = sum(x.params for x in estimates) if e.base else 0
    # weights gathered over fsdp are cast as they are gathered: no copy of their own
    # narrower compute: the sampler's one copy of its (split) weights, gathered or not; wider (CPU):
    # each program's casts, which gathering does in passing
    own = e.sampler_weights if e.weight_copies < 1 or not e.gathered else 0
    copies = int(e.weight_copies * own + e.sampling_copies * adapters)
    return adapters + copies + e.gathered + e.kv_cache + e.logits


def team_bytes(estimates: Sequence[MemoryEstimate]) -> int:
    """Peak bytes of several policies on one device: every policy's resident state, each shared base
    once, and the largest transient of one phase (updates and sampling calls on one device run one
    at a time): one policy's update, one policy's sampling call, or one call of all the adapter
    policies on a base (the base's weight copies once, every adapter stacked)."""
    own = sum(e.state - e.base for e in estimates)
    bases = {e.base_key: e.base for e in estimates if e.base}
    teams = [[e for e in estimates if e.base and e.base_key == key] for key in bases]
    transient = max(
        [e.update for e in estimates]
        + [e.sampling for e in estimates if not e.base]
        + [sampling_bytes(team) for team in teams],
        default=0,
    )
    return own + sum(bases.values()) + transient


def policy_estimate(policy: Any, seq_len: int, sampler_slots: int = 64) -> MemoryEstimate:
    """`estimate` for a built `Policy` (its model, mesh, optimizer and sampler layout)."""
    import jax

    cfg = policy.cfg
    mesh = policy.learner.mesh
    shape = None if mesh is None else dict(mesh.shape)
    sampler = policy.sampler.mesh if policy.sampler.own_copy else None
    sampler_shape = None if sampler is None else {a: sampler.shape.get(a, 1) for a in MESH_AXES}
    return estimate(
        policy.config,
        name=policy.name,
        mesh_shape=shape,
        micro_batch_size=cfg.micro_batch_size,
        seq_len=seq_len,
        optimizer=cfg.optimizer.name,
        reference=cfg.reference,
        sampler_mesh_shape=sampler_shape,
        platform=jax.default_backend(),
        sampler_slots=sampler_slots,
        lora=policy.learner.lora,
        base_key=policy.sampler.base_key,
    )


def device_limit() -> int | None:
    """Bytes of memory of the first local device, where the backend reports it (GPU, TPU)."""
    import jax

    try:
        stats = jax.local_devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001  (CPU and some plugins do not implement memory_stats)
        return None
    return stats.get("bytes_limit")


def log_estimates(policies: Mapping[str, Any], seq_len: int, log: Any, sampler_slots: int = 64) -> None:
    """Log every policy's estimate on process 0 (`log` is a `logging.Logger`)."""
    import jax

    if jax.process_index() != 0:
        return
    limit = device_limit()
    estimates = []
    for policy in policies.values():
        e = policy_estimate(policy, seq_len, sampler_slots)
        estimates.append(e)
        # one line; the breakdown (and the knobs to turn) where it does not fit, else at debug level
        fits = not limit or e.peak <= limit
        log.log(logging.INFO if fits else logging.WARNING, e.summary(limit))
        log.log(logging.DEBUG if fits else logging.WARNING, e.report(policy.cfg.optimizer.name, limit))
    if len(estimates) > 1:
        log.info(
            "memory estimate, all %d policies on one device: ~%s (every policy's resident state, each "
            "frozen base once, and the largest update or sampling call)",
            len(estimates),
            _bytes(team_bytes(estimates)),
        )
