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
estimate from `marljax.train.memory` beside them.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from marljax.models.config import ModelConfig
from marljax.models.decoder import abstract_model, param_dict_shardings
from marljax.models.sharding import MESH_AXES, batch_sharding, make_mesh
from marljax.train import memory

GiB = 2**30
# memory per device by `device_kind` (TPU v5p, v5e, v4, v6e)
HBM = {"TPU v5": 95 * GiB, "TPU v5 lite": 16 * GiB, "TPU v4": 32 * GiB, "TPU v6 lite": 32 * GiB}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE_LINE = re.compile(
    r"=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\("
)
_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


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


# ------------------------------------------------------------------ results
@dataclasses.dataclass
class Collective:
    op: str  # e.g. "all-reduce"
    shape: str  # e.g. "bf16[16,1024,896]"
    count: int

    def dims(self) -> tuple[int, ...]:
        inside = self.shape[self.shape.index("[") + 1 : -1]
        return tuple(int(d) for d in inside.split(",") if d)


@dataclasses.dataclass
class ProgramReport:
    """One compiled program's per-device figures."""

    policy: str
    program: str
    arguments: int
    outputs: int
    aliased: int  # output bytes that reuse donated argument buffers
    temporaries: int
    flops: float
    collectives: list[Collective]
    resident_elsewhere: int  # the policy's state the program does not take, resident meanwhile
    estimate: int  # memory.py's figure for what the temporaries hold
    estimate_what: str
    limit: int | None  # the device's memory, where known
    seconds: float = 0.0  # lowering and compiling
    error: str | None = None  # the compiler's own out-of-memory message (then no figures)

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.resident_elsewhere

    @property
    def fits(self) -> bool:
        return self.error is None and (self.limit is None or self.peak <= self.limit)


def collectives(hlo: str) -> list[Collective]:
    """The collective ops of compiled HLO text, by op and result shape, with their counts (ops in
    a loop body count once)."""
    counts: dict[tuple[str, str], int] = {}
    for line in hlo.splitlines():
        m = _COLLECTIVE_LINE.search(line)
        if m is None:
            continue
        shapes = [f"{t}[{d}]" for t, d in _SHAPE.findall(m["type"])]
        if m["start"] and len(shapes) > 1:  # async start: (operands..., results...): the results
            shapes = shapes[len(shapes) // 2 :]
        for s in shapes:
            counts[(m["op"], s)] = counts.get((m["op"], s), 0) + 1
    return [Collective(op, s, n) for (op, s), n in sorted(counts.items())]


def activation_shaped(c: Collective, rows: int, seq: int) -> bool:
    """Whether `c` carries a whole micro-batch's activations: a floating-point all-reduce whose
    shape has the micro-batch's `rows` followed by a sequence dimension (`seq` or a logit chunk).
    (Integer arrays such as token ids are not activations.)"""
    dims = c.dims()
    lengths = {seq, min(seq, memory.LOGIT_CHUNK)}
    return (
        c.op == "all-reduce"
        and c.shape.startswith(("bf16", "f16", "f32"))
        and any(a == rows and b in lengths for a, b in zip(dims, dims[1:], strict=False))
    )


def _analyse(compiled) -> tuple[int, int, int, int, float, list[Collective]]:
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return (
        int(mem.argument_size_in_bytes),
        int(mem.output_size_in_bytes),
        int(mem.alias_size_in_bytes),
        int(mem.temp_size_in_bytes),
        float((cost or {}).get("flops", float("nan"))),
        collectives(compiled.as_text()),
    )


# ------------------------------------------------------------------- inputs
def model_config(spec: Any) -> ModelConfig:
    """The `ModelConfig` of a policy's model spec: a preset, or a checkpoint's `config.json` only."""
    runtime = dict(
        dtype=spec.dtype,
        param_dtype=spec.param_dtype,
        remat=spec.remat,
        attention_impl=spec.attention_impl,
        scan_layers=spec.scan_layers,
    )
    if spec.path is None:
        return ModelConfig.preset(spec.preset, **runtime)
    from marljax.models.hf_io import _read_config

    return _read_config(Path(spec.path), **runtime)


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_params(config: ModelConfig, mesh: Mesh) -> dict:
    """The parameter dict (`get_params` layout) as abstract arrays laid out by the rule table."""
    shapes = nnx.to_pure_dict(nnx.state(abstract_model(config), nnx.Param))
    return _abstract(shapes, param_dict_shardings(config, mesh))


def _replicated(tree: Any, mesh: Mesh) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())), tree
    )


def abstract_opt_state(optimizer: optax.GradientTransformation, params: dict, mesh: Mesh) -> Any:
    """`optimizer.init(params)` as abstract arrays: each moment laid out like its parameter (the
    state leaf whose key path ends with the parameter's), counters replicated (as `Policy` commits
    them)."""
    state = jax.eval_shape(optimizer.init, params)
    by_path = {tuple(path): x for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    replicated = NamedSharding(mesh, P())

    def place(path, s):
        for n in range(len(path)):
            p = by_path.get(tuple(path[n:]))
            if p is not None and p.shape == s.shape:
                return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p.sharding)
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated)

    return jax.tree_util.tree_map_with_path(place, state)


def abstract_batch(
    micro_batches: int, micro_batch_size: int, seq_len: int, mesh: Mesh, extra: Sequence[str] = ()
) -> dict:
    """`collate`'s batch `[M, mb, T]` (and `[M, mb]` per-row values) as abstract arrays, rows over
    `("data", "fsdp")` as `Policy._collate` places them; `extra`: `old_logp`, `ref_logp`,
    `lora_seed` where the policy's update adds them."""
    rows = NamedSharding(mesh, P(None, ("data", "fsdp")))
    M, mb, T = micro_batches, micro_batch_size, seq_len
    kinds = {
        "tokens": ((M, mb, T), jnp.int32),
        "labels": ((M, mb, T), jnp.int32),
        "positions": ((M, mb, T), jnp.int32),
        "attention_mask": ((M, mb, T), jnp.bool_),
        "loss_mask": ((M, mb, T), jnp.bool_),
        "sampling_logp": ((M, mb, T), jnp.float32),
        "advantages": ((M, mb), jnp.float32),
        "temperature": ((M, mb), jnp.float32),
        **{k: ((M, mb, T), jnp.float32) for k in ("old_logp", "ref_logp") if k in extra},
    }
    out = {k: jax.ShapeDtypeStruct(s, d, sharding=rows) for k, (s, d) in kinds.items()}
    if "lora_seed" in extra:
        out["lora_seed"] = jax.ShapeDtypeStruct((M,), jnp.uint32, sharding=NamedSharding(mesh, P()))
    return out


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


# ----------------------------------------------------------------- programs
def _mesh_shape(mesh: Mesh) -> dict:
    return {a: int(mesh.shape.get(a, 1)) for a in MESH_AXES}


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
    from marljax.sampler.engine import Engine
    from marljax.sampler.schedule import next_bucket
    from marljax.train.batch import geometric_bucket
    from marljax.train.learner import step_functions

    options = None if dump_to is None else {"xla_dump_to": str(dump_to), "xla_dump_hlo_as_text": True}

    cfg = run.policies[name]
    config = model_config(run.policy_model(name))
    s = run.sampler
    T = seq_len or s.max_prompt_len + s.max_new_tokens
    T = -(-T // 32) * 32  # collate's lengths are multiples of 32
    mesh, sampler_mesh, own_sampler = policy_meshes(cfg, devices)
    platform = "tpu" if tpu else devices[0].platform
    rows = mesh.shape["data"] * mesh.shape["fsdp"]  # (ICI x DCN)
    if cfg.micro_batch_size % rows:
        raise CompileError(
            f"policies.{name}.micro_batch_size={cfg.micro_batch_size} must be a multiple of mesh.data x "
            f"mesh.fsdp = {rows}"
        )
    limit = device_memory(devices[0])
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
    model = abstract_params(config, mesh)
    reports = []

    started = [time.perf_counter()]

    def compile_or_report(program, lowered, elsewhere, estimate, what):
        """`lowered.compile()`, or None after reporting the compiler's out-of-memory refusal."""
        try:
            return lowered.compile(options)
        except Exception as e:  # noqa: BLE001  (JaxRuntimeError: the TPU compiler checks HBM itself)
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            message = str(e).strip().splitlines()[0]
            reports.append(
                ProgramReport(
                    name,
                    program,
                    0,
                    0,
                    0,
                    0,
                    float("nan"),
                    [],
                    elsewhere,
                    estimate,
                    what,
                    limit,
                    time.perf_counter() - started[0],
                    message,
                )
            )
            started[0] = time.perf_counter()
            return None

    def report(program, compiled, elsewhere, estimate, what):
        args, outs, alias, temp, flops, coll = _analyse(compiled)
        seconds = time.perf_counter() - started[0]
        reports.append(
            ProgramReport(
                name, program, args, outs, alias, temp, flops, coll, elsewhere, estimate, what, limit, seconds
            )
        )
        started[0] = time.perf_counter()

    if "update" in programs:
        frozen = None
        params = model
        if lora is not None:
            from marljax.models.lora import init_adapter

            params = _replicated(jax.eval_shape(lambda: init_adapter(config, lora, jax.random.key(0))), mesh)
            frozen = model
        loss = cfg.loss
        if loss.norm_constant is None:  # the trainer's default: the generation budget
            loss = loss.model_copy(update={"norm_constant": float(s.max_new_tokens)})
        # the trainer's own update program (`Learner` builds it the same way)
        optimizer, fn, _, _ = step_functions(config, cfg.optimizer, loss, cfg.mini_batches > 1, lora, mesh)
        M = micro_batches or geometric_bucket(
            -(-cfg.buffer.threshold // (cfg.mini_batches * cfg.micro_batch_size))
        )
        extra = [
            k
            for k, on in (
                ("old_logp", cfg.mini_batches > 1),
                ("ref_logp", bool(loss.kl_coef)),
                ("lora_seed", bool(lora and lora.dropout)),
            )
            if on
        ]
        batch = abstract_batch(M, cfg.micro_batch_size, T, mesh, extra)
        args = (params, abstract_opt_state(optimizer, params, mesh), batch, frozen)
        what = f"gradients + activations ({est.remat} remat) + compute copies"
        elsewhere = est.reference + est.sampler_copy
        compiled = compile_or_report("update", fn.lower(*args), elsewhere, est.update, what)
        if compiled is not None:
            report("update", compiled, elsewhere, est.update, what)

    sampler_programs = [p for p in ("prefill", "decode") if p in programs]
    if sampler_programs:
        weights = abstract_params(config, sampler_mesh) if own_sampler else model
        # the sampler reads its weights in the compute dtype (`marljax.train.sampling`)
        weights = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape,
                config.dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype,
                sharding=x.sharding,
            ),
            weights,
        )
        if lora is not None:
            from marljax.models.lora import init_adapter, stack_adapters

            adapter = jax.eval_shape(
                lambda: stack_adapters([(lora, init_adapter(config, lora, jax.random.key(0)))])
            )
            weights = {**weights, "lora": _replicated(adapter, sampler_mesh)}
        buckets = s.buckets()
        schedule = s.schedule(platform)
        single = sampler_mesh.size == 1  # the trainer samples such a policy without a mesh
        nbytes = config.num_params() * np.dtype(config.param_dtype).itemsize
        engine = Engine(
            config,
            mesh=sampler_mesh,
            buckets=buckets,
            fuse_projections=single and nbytes <= 256 * 2**20,
            cache_layout="bskh" if tpu else None,
        )
        if engine.fuse_projections:
            weights = _replicated(jax.eval_shape(engine._fuse, weights), sampler_mesh)
        slots = engine.batch_bucket(schedule.slots)
        capacity = engine.prompt_bucket(s.max_prompt_len) + engine.new_tokens_bucket(s.max_new_tokens)
        stop_len = next_bucket(1, buckets.min_stop_len)
        state = jax.eval_shape(
            functools.partial(engine._empty, slots=slots, capacity=capacity, stop_len=stop_len)
        )
        state = type(state)(
            tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=engine._kv_sharding(x)) for x in state.kv),
            *(
                jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding(sampler_mesh, x.ndim))
                for x in state[1:]
            ),
        )
        tables = _replicated(_tables(buckets), sampler_mesh)
        truncate = s.top_k > 0 or s.top_p < 1
        elsewhere = est.optimizer + est.reference + (est.params if own_sampler and lora is None else 0)
        what = "weight copies + gathered weights + logits (the KV cache and the sampler's copy are arguments)"
        transient = est.sampling - est.kv_cache
        if "prefill" in sampler_programs:
            Bn, Tp = slots, engine.prompt_bucket(s.max_prompt_len)

            def put(shape, dtype):
                return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(sampler_mesh, len(shape)))

            rows_in = [put((Bn,), jnp.int32)] * 3 + [put((Bn, Tp), jnp.int32), put((Bn,), jnp.int32)]
            rows_in += [put((Bn,), jnp.uint32), put((Bn,), jnp.int32), put((Bn,), jnp.float32)]
            rows_in += [put((Bn,), jnp.int32), put((Bn,), jnp.float32), put((Bn,), jnp.int32)]
            lowered = engine._insert_jit.lower(
                weights,
                state,
                tables,
                *rows_in,
                window=engine.window(s.max_prompt_len, capacity),
                greedy=s.temperature == 0,
                truncate=truncate,
            )
            prefill_what = "weight copies + logits + one layer's activations for every slot's prompt"
            prefill_est = transient + est.prefill_activations
            compiled = compile_or_report("prefill", lowered, elsewhere, prefill_est, prefill_what)
            if compiled is not None:
                report("prefill", compiled, elsewhere, prefill_est, prefill_what)
        if "decode" in sampler_programs:
            scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(sampler_mesh, P()))
            lowered = engine._decode_jit.lower(
                weights,
                state,
                tables,
                scalar,
                scalar,
                windows=(capacity,),
                chunk=schedule.chunk,
                greedy=s.temperature == 0,
                truncate=truncate,
                want_sampling_lp=True,
                pad_id=0,
            )
            compiled = compile_or_report("decode", lowered, elsewhere, transient, what)
            if compiled is not None:
                report("decode", compiled, elsewhere, transient, what)
    return reports


def _tables(buckets) -> Any:
    from marljax.sampler.schedule import Tables, next_bucket

    E, NS, Ls = buckets.min_eos, next_bucket(1, buckets.min_stop), next_bucket(1, buckets.min_stop_len)
    return Tables(
        eos=jax.ShapeDtypeStruct((E,), jnp.int32),
        stop_seqs=jax.ShapeDtypeStruct((NS, Ls), jnp.int32),
        stop_valid=jax.ShapeDtypeStruct((NS, Ls), jnp.bool_),
        stop_active=jax.ShapeDtypeStruct((NS,), jnp.bool_),
        seed=jax.ShapeDtypeStruct((), jnp.uint32),
    )


# ------------------------------------------------------------------ printing
def _b(n: float) -> str:
    return memory._bytes(n)


def format_report(r: ProgramReport, rows: int | None = None, seq: int | None = None) -> str:
    """A few lines for one program: memory per device beside the estimate, FLOPs, collectives."""
    if r.error is not None:
        return (
            f"policy {r.policy!r} {r.program}: DOES NOT FIT: the compiler refused it: {r.error}\n"
            f"  estimate {_b(r.estimate)} ({r.estimate_what})"
        )
    verdict = "no device memory figure" if r.limit is None else ("fits" if r.fits else "DOES NOT FIT")
    device = "" if r.limit is None else f" of {_b(r.limit)}"
    lines = [
        f"policy {r.policy!r} {r.program}: per device arguments {_b(r.arguments)}, outputs {_b(r.outputs)}"
        f" ({_b(r.aliased)} donated), temporaries {_b(r.temporaries)}; estimate {_b(r.estimate)} "
        f"({r.estimate_what})",
        f"  peak {_b(r.peak)} (with {_b(r.resident_elsewhere)} of resident state it does not take)"
        f"{device}: {verdict}; {r.flops / 1e12:.3g} TFLOP; compiled in {r.seconds:.0f} s",
    ]
    if r.collectives:
        parts = []
        for c in r.collectives:
            flag = " ACTIVATION-SHAPED" if rows and seq and activation_shaped(c, rows, seq) else ""
            parts.append(f"{c.op} {c.shape} x{c.count}{flag}")
        lines.append("  collectives: " + ", ".join(parts))
    else:
        lines.append("  collectives: none")
    return "\n".join(lines)


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
        T = seq_len or run.sampler.max_prompt_len + run.sampler.max_new_tokens
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
            seq = -(-T // 32) * 32 if r.program == "update" else None
            out(format_report(r, cfg.micro_batch_size, seq))
            reports.append(r)
    return reports


def describe_target(devices: Sequence) -> str:
    d = devices[0]
    limit = device_memory(d)
    hbm = f", {_b(limit)} each" if limit else ""
    return f"{len(devices)} x {getattr(d, 'device_kind', d.platform)}{hbm}"


__all__ = [
    "COLLECTIVES",
    "HBM",
    "Collective",
    "CompileError",
    "ProgramReport",
    "activation_shaped",
    "collectives",
    "compile_policy",
    "compile_run",
    "describe_target",
    "device_memory",
    "format_report",
    "topology_devices",
]
