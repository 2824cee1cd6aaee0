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
  parameter dtype (two: the prefill's and the decode loop's, each a program's temporaries), the
  KV cache of the sampler's slots, and the `[slots, vocab]` float32 logits of a step.

`peak` is the resident state plus the larger transient; `team_bytes` (several policies on one
device) is every policy's resident state, each frozen base once, and the largest transient of any
policy in either phase.

Activations are an estimate of what one micro-batch keeps for the backward pass:

- remat off: every layer's intermediates, per token about
  `4 D + (3 H + 4 K) hd + 4 F` values plus `2 H T` float32 attention scores
  (D hidden, F mlp, H / K query / kv heads on this device, hd head dim);
- remat on (`model.remat`): the layer inputs `L x D` per token, plus one
  layer's intermediates while it is recomputed;
- plus the loss head: `[rows, 256, V]` float32 logit chunks (x3 with grads).

Compute dtype. With `param_dtype` narrower than the compute dtype (bfloat16 storage, float32
compute) the update casts the parameters to the compute dtype and holds the gradients in it
before they are cast back: one copy of each. On CPU the compute dtype is float32 even for `dtype:
bfloat16`: XLA:CPU converts bfloat16 matmul operands to float32 and hoists the conversion of the
weights out of the decode loop and the backward pass, so float32 copies of the weights exist while
sampling and updating (measured with `memory_analysis()`, benchmarks/RESULTS.md). On a GPU with
float32 master weights and bfloat16 compute, sampling holds two bfloat16 copies (the same rule,
measured by the device's peak with adapter teams); the update's bfloat16 casts are not counted
(not measured apart; see issue 28's GPU table).

Adapter policies (`lora:`): the trainable parameters, optimiser moments, gradients and reference
are the adapter's (`L x rank x (in + out)` per targeted projection, replicated on every device);
the frozen base is counted as `base`, once per base for a team (`team_bytes`), with its copy in a
sampler layout of its own. A team of adapters on one base samples in one call: the base's
compute-dtype copies once, plus the team's adapters stacked (`stack_adapters`) and their copies.

Knobs to fit: `model.remat`, `micro_batch_size` (rows per forward/backward),
`mesh.fsdp` / `mesh.tensor` (split parameters, moments and gradients), `sampler.slots` (KV cache
and logits), `model.param_dtype` / `dtype` (bfloat16 halves the state; on CPU sampling and updates
still make float32 copies of the weights, so it saves the resident state only).
"""

from __future__ import annotations

import dataclasses
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
    activations_alt: int  # the same with remat toggled
    remat: bool
    rows: int  # rows of a micro-batch on one device
    seq_len: int
    kv_per_sequence: int  # sampler KV cache of one sequence of seq_len tokens
    slots: int = 1  # sampler slots on this device (sequences decoding at once)
    base: int = 0  # adapter policies: the frozen base (shared by the adapter policies on it)
    base_key: Any = None  # adapter policies with equal keys share one base
    sampler_weights: int = 0  # the model's weights in the sampler's layout (an adapter policy's: the base's)
    sampling_copies: float = 0.0  # compute-dtype copies a sampling call holds, per byte of its weights
    logits_per_slot: int = 0  # a decode step's float32 logits of one slot

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
    def peak(self) -> int:
        return self.state + max(self.update, self.sampling)

    def report(self, optimizer: str = "adamw", device_limit: int | None = None) -> str:
        n = self.policy
        mesh = " ".join(f"{a}={self.mesh_shape.get(a, 1)}" for a in MESH_AXES)
        copies = self.sampling - self.kv_cache - self.logits - (self.params if self.base else 0)
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
            f"{self.seq_len} tokens) ~{_bytes(self.activations)} with remat {'on' if self.remat else 'off'} "
            f"(~{_bytes(self.activations_alt)} with remat {'off' if self.remat else 'on'})"
            + (
                f" + compute-dtype copies of parameters and gradients {_bytes(self.compute_copy)}"
                if self.compute_copy
                else ""
            )
            + f" = ~{_bytes(self.update)}",
            f"  sampling: KV cache {_bytes(self.kv_cache)} ({self.slots} slots x {_bytes(self.kv_per_sequence)})"
            f" + logits {_bytes(self.logits)}"
            + (f" + compute-dtype weight copies (prefill, decode) {_bytes(copies)}" if copies else "")
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


def _activations(c: ModelConfig, rows: int, T: int, tensor: int, remat: bool) -> int:
    cd = np.dtype(c.dtype).itemsize
    H = c.num_heads // tensor if c.num_heads % tensor == 0 else c.num_heads
    K = c.num_kv_heads // tensor if c.num_kv_heads % tensor == 0 else c.num_kv_heads
    F = c.intermediate_size // tensor if c.intermediate_size % tensor == 0 else c.intermediate_size
    D, hd = c.hidden_size, c.head_dim
    layer = rows * T * (cd * (4 * D + (3 * H + 4 * K) * hd + 4 * F) + 4 * 2 * H * T)
    saved = c.num_layers * rows * T * D * cd + layer if remat else c.num_layers * layer
    head = 3 * rows * min(LOGIT_CHUNK, T) * c.vocab_size * 4 + 2 * rows * T * D * cd
    return saved + head


def estimate(
    config: ModelConfig,
    *,
    name: str = "policy",
    mesh_shape: Mapping[str, int] | None = None,
    micro_batch_size: int = 8,
    seq_len: int = 1024,
    optimizer: str = "adamw",
    reference: bool = False,
    remat: bool | None = None,
    sampler_mesh_shape: Mapping[str, int] | None = None,
    platform: str | None = None,
    sampler_slots: int = 64,
    lora: LoraSpec | None = None,
    base_key: Any = None,
) -> MemoryEstimate:
    """Per-device estimate for a model, mesh and update settings (no devices needed: plan ahead).

    `sampler_mesh_shape`: the sampler's layout when it differs (a second copy of the parameters).
    `sampler_slots`: sequences the sampler decodes at once (`sampler.slots`), over its data axes.
    `platform`: the JAX backend ("cpu" computes bfloat16 in float32; see the module doc).
    `lora`: an adapter policy's adapter on this (frozen) model; `base_key` names its base.
    """
    shape = {a: int((mesh_shape or {}).get(a, 1)) for a in MESH_AXES}
    total, params = param_bytes(config, shape)
    remat = config.remat != "none" if remat is None else remat
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
    base = 0
    activations = _activations(config, rows, seq_len, shape["tensor"], remat)
    activations_alt = _activations(config, rows, seq_len, shape["tensor"], not remat)
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
        slots=-(
            -sampler_slots // math.prod((sampler_mesh_shape or shape).get(a, 1) for a in ("data", "fsdp"))
        ),
        base=base,
        base_key=base_key,
        sampler_weights=sampler_weights,
        # the prefill's and the decode loop's copies, where the weights are cast
        sampling_copies=2 * widen if widen != 1 else 0.0,
        logits_per_slot=4 * config.vocab_size,
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
    return adapters + int(e.sampling_copies * (e.sampler_weights + adapters)) + e.kv_cache + e.logits


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
    shape = None if policy.mesh is None else dict(policy.mesh.shape)
    sampler = policy.sampler_mesh if getattr(policy, "_to_sampler", None) is not None else None
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
        lora=getattr(policy, "lora", None),
        base_key=getattr(policy, "base_key", None),
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
        estimates.append(policy_estimate(policy, seq_len, sampler_slots))
        log.info(estimates[-1].report(policy.cfg.optimizer.name, limit))
    if len(estimates) > 1:
        log.info(
            "memory estimate, all %d policies on one device: ~%s (every policy's resident state, each "
            "frozen base once, and the largest update or sampling call)",
            len(estimates),
            _bytes(team_bytes(estimates)),
        )
