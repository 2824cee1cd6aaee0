"""Ahead-of-time compilation of a run's programs for a device topology (`marljax compile`).

For each policy of a run config this builds the inputs of its programs as abstract arrays
(`jax.ShapeDtypeStruct`s with their shardings; no weights are loaded or allocated) on the
policy's mesh over the target devices, lowers and compiles

- `update`: the RL update step, the trainer's own (`marljax.train.learner.step_functions`), on a
  batch `[M, micro_batch_size, T]` as `collate` makes it, rows over `("data", "fsdp")`;
- `prefill`: the sampler's insert of a full slot batch of prompts (`Engine._insert`);
- `decode`: the sampler's decode loop over the whole cache (`Engine._decode`);

and reports, per device, what XLA's `memory_analysis()` says each program needs (arguments,
outputs, temporaries), its FLOPs, the collectives in the compiled HLO, and the policy's
estimate from `marljax.train.memory` beside them (`marljax.train.program_report`).

Targets: a TPU topology (`jax.experimental.topologies`, e.g. "v5p:4x4x4"; needs libtpu, not the
chips), or the devices JAX has (e.g. fake CPU devices). A TPU topology compiles for the TPU
backend, so the sampler is built with the accelerators' cache layout.

Fit rule, per program: arguments + outputs - donated (aliased) buffers + temporaries + the
policy's resident state that the program does not take (the other phase's weights, the
optimiser state while sampling, the KL reference) must not exceed the chip's memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from marljax.models.config import ModelConfig
from marljax.models.sharding import MESH_AXES, batch_sharding, make_mesh
from marljax.train import memory
from marljax.train.abstract_inputs import (
    abstract_batch,
    abstract_opt_state,
    abstract_params,
    abstract_tables,
    model_config,
    replicated,
)
from marljax.train.program_report import NO_FIGURES, ProgramReport, analyse, format_report

GiB = 2**30
# memory per device by `device_kind` (TPU v5p, v5e, v4, v6e)
HBM = {"TPU v5": 95 * GiB, "TPU v5 lite": 16 * GiB, "TPU v4": 32 * GiB, "TPU v6 lite": 32 * GiB}


class CompileError(ValueError):
    """A bad target or a config that cannot be laid out on it (one line, for the CLI)."""


def topology_devices(name: str, num_slices: int = 1) -> list:
    """The abstract devices of a TPU topology such as "v5p:4x4x4" (libtpu; no TPU needed)."""
    # several processes may compile for topologies at once: libtpu's single-user lock would refuse
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    if not re.fullmatch(r"v\d+[a-z]*:\d+(x\d+)*", name):
        raise CompileError(f"--topology {name!r}: expected a TPU generation and chip grid, e.g. v5p:2x2x2")
    kwargs = {"num_slices": num_slices} if num_slices > 1 else {}
    try:
        return list(topologies.get_topology_desc(name, "tpu", **kwargs).devices)
    except (RuntimeError, ValueError) as e:  # libtpu's JaxRuntimeError, or no TPU plugin at all
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CompileError(f"--topology {name!r}: {first}") from None


def device_memory(device) -> int | None:
    """Bytes of memory of one device: by kind for TPU generations, else what a local device
    reports (GPUs); None where unknown (CPU)."""
    if getattr(device, "device_kind", "") in HBM:
        return HBM[device.device_kind]
    try:
        return (device.memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001  (CPU and compile-only devices implement no memory_stats)
        return None


def policy_meshes(cfg: Any, devices: Sequence) -> tuple[Mesh, Mesh, bool]:
    """(trainer mesh, sampler mesh, sampler has a layout of its own) of a policy on `devices`."""

    def one(m, what):
        picked = devices
        if m.devices is not None:
            bad = [d for d in m.devices if not 0 <= d < len(devices)]
            if bad:
                raise CompileError(f"{what}.devices {bad}: the target has {len(devices)} devices")
            picked = [devices[d] for d in m.devices]
        dcn = {} if m.dcn is None else {"data": m.dcn.data, "fsdp": m.dcn.fsdp}
        n = m.data * m.fsdp * m.tensor * math.prod(dcn.values())
        if n > len(picked):
            across = "".join(f" x dcn {a}={k}" for a, k in dcn.items() if k > 1)
            raise CompileError(
                f"{what}: data={m.data} x fsdp={m.fsdp} x tensor={m.tensor}{across} = {n} devices, "
                f"the target has {len(picked)}"
            )
        try:
            return make_mesh(m.data, m.fsdp, m.tensor, devices=picked, dcn=dcn)
        except ValueError as e:
            raise CompileError(f"{what}: {e}") from None

    own = getattr(cfg, "sampler_mesh", None)
    mesh = one(cfg.mesh, "mesh")
    return mesh, (mesh if own is None else one(own, "sampler_mesh")), own is not None


def _mesh_shape(mesh: Mesh) -> dict:
    return {a: int(mesh.shape.get(a, 1)) for a in MESH_AXES}


def _update_length(run: Any, seq_len: int | None = None) -> int:
    """The update's T: `seq_len`, by default `sampler.max_prompt_len + max_new_tokens` (as the
    trainer's estimate uses), rounded up as `collate` rounds lengths (to multiples of 32)."""
    T = seq_len or run.sampler.max_prompt_len + run.sampler.max_new_tokens
    return -(-T // 32) * 32


# ----------------------------------------------------------------- programs
@dataclasses.dataclass
class _Policy:
    """What every program of one policy is built from."""

    cfg: Any  # the run's PolicyConfig
    sampler: Any  # the run's SamplerConfig
    config: ModelConfig
    lora: Any  # LoraSpec or None
    mesh: Mesh
    sampler_mesh: Mesh
    own_sampler: bool
    model: dict  # abstract parameters on `mesh`
    est: Any  # memory.MemoryEstimate
    T: int  # the update's length


@dataclasses.dataclass
class _Program:
    """A program to compile: `lower()` builds it; the rest is what its report says beside it."""

    name: str
    lower: Callable[[], Any]  # -> jax.stages.Lowered
    elsewhere: int
    estimate: int
    what: str


def _update_program(p: _Policy, micro_batches: int | None) -> _Program:
    """The trainer's own RL update (`Learner` builds it the same way) on `collate`'s batch."""
    from marljax.train.batch import geometric_bucket
    from marljax.train.learner import step_functions

    cfg, frozen, params = p.cfg, None, p.model
    if p.lora is not None:
        from marljax.models.lora import init_adapter

        params = replicated(jax.eval_shape(lambda: init_adapter(p.config, p.lora, jax.random.key(0))), p.mesh)
        frozen = p.model
    loss = cfg.loss
    if loss.norm_constant is None:  # the trainer's default: the generation budget
        loss = loss.model_copy(update={"norm_constant": float(p.sampler.max_new_tokens)})
    optimizer, fn, _, _ = step_functions(p.config, cfg.optimizer, loss, cfg.mini_batches > 1, p.lora, p.mesh)
    M = micro_batches or geometric_bucket(
        -(-cfg.buffer.threshold // (cfg.mini_batches * cfg.micro_batch_size))
    )
    extra = [
        k
        for k, on in (
            ("old_logp", cfg.mini_batches > 1),
            ("ref_logp", bool(loss.kl_coef)),
            ("lora_seed", bool(p.lora and p.lora.dropout)),
        )
        if on
    ]
    batch = abstract_batch(M, cfg.micro_batch_size, p.T, p.mesh, extra)
    args = (params, abstract_opt_state(optimizer, params, p.mesh), batch, frozen)
    return _Program(
        "update",
        lambda: fn.lower(*args),
        p.est.reference + p.est.sampler_copy,
        p.est.update,
        f"gradients + activations ({p.est.remat} remat) + compute copies",
    )


def _sampler_programs(p: _Policy, which: Sequence[str], tpu: bool, platform: str) -> list[_Program]:
    """The sampler's insert of a full slot batch of prompts ("prefill") and its decode loop over the
    whole cache ("decode"), each on the policy's sampler weights in the compute dtype."""
    from marljax.sampler.engine import Engine
    from marljax.sampler.schedule import next_bucket

    s, config, mesh, est = p.sampler, p.config, p.sampler_mesh, p.est
    weights = abstract_params(config, mesh) if p.own_sampler else p.model
    # the sampler reads its weights in the compute dtype (`marljax.train.sampling`)
    weights = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, config.dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype, sharding=x.sharding
        ),
        weights,
    )
    if p.lora is not None:
        from marljax.models.lora import init_adapter, stack_adapters

        adapter = jax.eval_shape(
            lambda: stack_adapters([(p.lora, init_adapter(config, p.lora, jax.random.key(0)))])
        )
        weights = {**weights, "lora": replicated(adapter, mesh)}
    buckets = s.buckets()
    schedule = s.schedule(platform)
    single = mesh.size == 1  # the trainer samples such a policy without a mesh
    nbytes = config.num_params() * np.dtype(config.param_dtype).itemsize
    engine = Engine(
        config,
        mesh=mesh,
        buckets=buckets,
        fuse_projections=single and nbytes <= 256 * 2**20,
        cache_layout="bskh" if tpu else None,
    )
    if engine.fuse_projections:
        weights = replicated(jax.eval_shape(engine._fuse, weights), mesh)
    slots = engine.batch_bucket(schedule.slots)
    capacity = engine.prompt_bucket(s.max_prompt_len) + engine.new_tokens_bucket(s.max_new_tokens)
    stop_len = next_bucket(1, buckets.min_stop_len)
    state = jax.eval_shape(
        functools.partial(engine._empty, slots=slots, capacity=capacity, stop_len=stop_len)
    )
    state = type(state)(
        tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=engine._kv_sharding(x)) for x in state.kv),
        *(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding(mesh, x.ndim)) for x in state[1:]),
    )
    tables = replicated(abstract_tables(buckets), mesh)
    truncate, greedy = s.top_k > 0 or s.top_p < 1, s.temperature == 0
    elsewhere = est.optimizer + est.reference + (est.params if p.own_sampler and p.lora is None else 0)
    transient = est.sampling - est.kv_cache
    out = []
    if "prefill" in which:
        Bn, Tp = slots, engine.prompt_bucket(s.max_prompt_len)

        def put(shape, dtype):
            return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))

        rows_in = [put((Bn,), jnp.int32)] * 3 + [put((Bn, Tp), jnp.int32), put((Bn,), jnp.int32)]
        rows_in += [put((Bn,), jnp.uint32), put((Bn,), jnp.int32), put((Bn,), jnp.float32)]
        rows_in += [put((Bn,), jnp.int32), put((Bn,), jnp.float32), put((Bn,), jnp.int32)]
        window = engine.window(s.max_prompt_len, capacity)
        out.append(
            _Program(
                "prefill",
                lambda: engine._insert_jit.lower(
                    weights, state, tables, *rows_in, window=window, greedy=greedy, truncate=truncate
                ),
                elsewhere,
                transient + est.prefill_activations,
                "weight copies + logits + one layer's activations for every slot's prompt",
            )
        )
    if "decode" in which:
        scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))
        out.append(
            _Program(
                "decode",
                lambda: engine._decode_jit.lower(
                    weights,
                    state,
                    tables,
                    scalar,
                    scalar,
                    windows=(capacity,),
                    chunk=schedule.chunk,
                    greedy=greedy,
                    truncate=truncate,
                    want_sampling_lp=True,
                    pad_id=0,
                ),
                elsewhere,
                transient,
                "weight copies + gathered weights + logits (the KV cache and the sampler's copy are arguments)",
            )
        )
    return out


def _compile(policy: str, program: _Program, limit: int | None, options: dict | None) -> ProgramReport:
    """Lower and compile `program` and report it; a compiler that refuses it for lack of memory
    (the TPU compiler checks HBM itself) gives a report carrying its message instead of figures."""
    started = time.perf_counter()
    common = dict(
        policy=policy,
        program=program.name,
        resident_elsewhere=program.elsewhere,
        estimate=program.estimate,
        estimate_what=program.what,
        limit=limit,
    )
    try:
        figures = analyse(program.lower().compile(options))
    except Exception as e:  # noqa: BLE001  (JaxRuntimeError)
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        error = str(e).strip().splitlines()[0]
        return ProgramReport(**common, **NO_FIGURES, seconds=time.perf_counter() - started, error=error)
    return ProgramReport(**common, **figures, seconds=time.perf_counter() - started)


def compile_policy(
    run: Any,
    name: str,
    devices: Sequence,
    *,
    seq_len: int | None = None,
    micro_batches: int | None = None,
    programs: Sequence[str] = ("update", "prefill", "decode"),
    tpu: bool = True,
    dump_to: str | None = None,
) -> list[ProgramReport]:
    """Compile `programs` of policy `name` of the run config `run` for `devices`; see the module doc.

    seq_len: the update's T (default `sampler.max_prompt_len + max_new_tokens`, as the trainer's
    estimate uses); micro_batches: M (default the buffer threshold's micro-batches, rounded up as
    `collate` rounds them). `tpu`: the devices are TPUs (the sampler's accelerator cache layout).
    `dump_to`: a directory for XLA's dumps of each program (HLO, buffer assignment, memory-usage
    report: where the temporaries go).
    """
    from marljax.sampler.schedule import next_bucket

    options = None if dump_to is None else {"xla_dump_to": str(dump_to), "xla_dump_hlo_as_text": True}
    cfg = run.policies[name]
    config = model_config(run.policy_model(name))
    s = run.sampler
    T = _update_length(run, seq_len)
    mesh, sampler_mesh, own_sampler = policy_meshes(cfg, devices)
    platform = "tpu" if tpu else devices[0].platform
    rows = mesh.shape["data"] * mesh.shape["fsdp"]  # (ICI x DCN)
    if cfg.micro_batch_size % rows:
        raise CompileError(
            f"policies.{name}.micro_batch_size={cfg.micro_batch_size} must be a multiple of mesh.data x "
            f"mesh.fsdp = {rows}"
        )
    lora = None if cfg.lora is None else cfg.lora.spec()
    est = memory.estimate(
        config,
        name=name,
        mesh_shape=_mesh_shape(mesh),
        micro_batch_size=cfg.micro_batch_size,
        seq_len=T,
        optimizer=cfg.optimizer.name,
        reference=cfg.reference,
        sampler_mesh_shape=_mesh_shape(sampler_mesh) if own_sampler else None,
        platform=platform,
        sampler_slots=s.slots,
        lora=lora,
        prompt_len=next_bucket(s.max_prompt_len, s.min_prompt_bucket),
    )
    p = _Policy(cfg, s, config, lora, mesh, sampler_mesh, own_sampler, abstract_params(config, mesh), est, T)
    todo = [_update_program(p, micro_batches)] if "update" in programs else []
    sampling = [x for x in ("prefill", "decode") if x in programs]
    if sampling:
        todo += _sampler_programs(p, sampling, tpu, platform)
    limit = device_memory(devices[0])
    return [_compile(name, program, limit, options) for program in todo]


# ------------------------------------------------------------------ printing
def compile_run(
    run: Any,
    devices: Sequence,
    *,
    seq_len: int | None = None,
    micro_batches: int | None = None,
    programs: Sequence[str] = ("update", "prefill", "decode"),
    tpu: bool = True,
    policies: Sequence[str] | None = None,
    dump_to: str | None = None,
    out=print,
) -> list[ProgramReport]:
    """`compile_policy` for every policy of `run` (or `policies`), printing each program's report."""
    reports = []
    for name in policies or list(run.policies):
        cfg = run.policies[name]
        for r in compile_policy(
            run,
            name,
            devices,
            seq_len=seq_len,
            micro_batches=micro_batches,
            programs=programs,
            tpu=tpu,
            dump_to=dump_to,
        ):
            seq = _update_length(run, seq_len) if r.program == "update" else None
            out(format_report(r, cfg.micro_batch_size, seq))
            reports.append(r)
    return reports


def describe_target(devices: Sequence) -> str:
    d = devices[0]
    limit = device_memory(d)
    hbm = f", {memory._bytes(limit)} each" if limit else ""
    return f"{len(devices)} x {getattr(d, 'device_kind', d.platform)}{hbm}"


__all__ = [
    "HBM",
    "CompileError",
    "compile_policy",
    "compile_run",
    "describe_target",
    "device_memory",
    "topology_devices",
]
