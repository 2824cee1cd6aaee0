"""Multi-process (multi-host) JAX: when and how to call `jax.distributed.initialize`.

One Python process runs per host (or per GPU); all run the same program and
JAX joins their devices into one global device list. `initialize()` must run
before any JAX computation; `marljax train` / `eval` call it first thing.

Where the settings come from, first match wins (each field separately):

1. the run config's `distributed` section (`DistributedConfig`; per-process
   values such as `process_id` are best given as CLI overrides);
2. environment: `MARLJAX_COORDINATOR` (host:port of process 0),
   `MARLJAX_NUM_PROCESSES`, `MARLJAX_PROCESS_ID`, `MARLJAX_LOCAL_DEVICE_IDS`
   ("0,1"), `MARLJAX_DISTRIBUTED` (auto | on | off | tpu);
3. SLURM (`srun`): `SLURM_NTASKS`, `SLURM_PROCID`, and the coordinator on the
   first host of `SLURM_STEP_NODELIST` (or `SLURM_JOB_NODELIST`) at
   `MARLJAX_COORDINATOR_PORT` (default: derived from `SLURM_JOB_ID`, as JAX does);
4. Cloud TPU VM slices: `jax.distributed.initialize()` without arguments
   (JAX reads the workers from the TPU metadata server).

Mode `auto` (default) initialises only when one of these says there is more
than one process, or on a TPU VM; `off` never; `on` always (error if
incomplete); `tpu` always, with JAX's TPU auto-detection. On CPU clusters the
cross-process collectives use gloo (`cpu_collectives`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import Field

from marljax.settings import StrictModel

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off", "tpu")
# how long `barrier` waits for every process: the joining's own timeout (set by `initialize`)
_barrier_timeout_s = 300
_barriers = itertools.count()


class DistributedConfig(StrictModel):
    mode: Literal[MODES] = Field("auto", description="auto: initialise when the environment has >1 process")
    coordinator_address: str | None = Field(None, description="host:port of process 0")
    num_processes: int | None = Field(None, ge=1)
    process_id: int | None = Field(None, ge=0)
    local_device_ids: list[int] | None = Field(None, description="devices this process uses; None = all")
    cpu_collectives: Literal["gloo", "mpi", "none"] = Field(
        "gloo", description="CPU cross-process collectives"
    )
    initialization_timeout: int = Field(300, ge=1, description="seconds to wait for every process")


def first_host(nodelist: str) -> str:
    """First host name of a SLURM node list: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
    m = re.match(r"([^,\[]+)(?:\[([^,\-\]]+))?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot parse SLURM node list {nodelist!r}")
    return m.group(1) + (m.group(2) or "")


def _on_tpu_vm() -> bool:
    """True on a Cloud TPU VM (TPU chips on the PCI bus), without starting a JAX backend."""
    try:
        from jax._src import hardware_utils  # private, hence the broad guard

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # noqa: BLE001
        return False


def resolve(
    cfg: DistributedConfig | None = None, env: Mapping[str, str] | None = None, on_tpu_vm: bool | None = None
) -> dict | None:
    """Keyword arguments for `jax.distributed.initialize`, `{}` for TPU auto-detection,
    or None when this is a single-process run. Raises ValueError for incomplete settings."""
    cfg = cfg or DistributedConfig()
    env = os.environ if env is None else env
    mode = env.get("MARLJAX_DISTRIBUTED", cfg.mode) if cfg.mode == "auto" else cfg.mode
    if mode not in MODES:
        raise ValueError(f"MARLJAX_DISTRIBUTED={mode!r}; expected one of {', '.join(MODES)}")
    if mode == "off":
        return None
    if mode == "tpu":
        return {}
    coord = cfg.coordinator_address or env.get("MARLJAX_COORDINATOR")
    nproc = cfg.num_processes if cfg.num_processes is not None else _int(env, "MARLJAX_NUM_PROCESSES")
    pid = cfg.process_id if cfg.process_id is not None else _int(env, "MARLJAX_PROCESS_ID")
    local = cfg.local_device_ids
    if local is None and env.get("MARLJAX_LOCAL_DEVICE_IDS"):
        local = [int(x) for x in env["MARLJAX_LOCAL_DEVICE_IDS"].split(",")]
    if "SLURM_NTASKS" in env:  # srun: fill the gaps from SLURM
        nproc = nproc if nproc is not None else _int(env, "SLURM_NTASKS")
        pid = pid if pid is not None else _int(env, "SLURM_PROCID")
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if coord is None and nodes and (nproc or 1) > 1:
            port = env.get("MARLJAX_COORDINATOR_PORT") or str(
                int(env.get("SLURM_JOB_ID", "0")) % 4096 + 61440
            )
            coord = f"{first_host(nodes)}:{port}"
    if mode == "auto" and (nproc or 1) <= 1 and coord is None:
        on_tpu = _on_tpu_vm() if on_tpu_vm is None else on_tpu_vm
        return {} if on_tpu else None
    missing = [
        n
        for n, v in (("coordinator_address", coord), ("num_processes", nproc), ("process_id", pid))
        if v is None
    ]
    if missing:
        raise ValueError(
            f"multi-process run needs {', '.join(missing)} (config `distributed.*` or "
            f"MARLJAX_COORDINATOR / MARLJAX_NUM_PROCESSES / MARLJAX_PROCESS_ID)"
        )
    if not 0 <= pid < nproc:
        raise ValueError(f"process_id {pid} not in [0, num_processes={nproc})")
    out = {
        "coordinator_address": coord,
        "num_processes": nproc,
        "process_id": pid,
        "initialization_timeout": cfg.initialization_timeout,
    }
    if local is not None:
        out["local_device_ids"] = local
    return out


def _int(env: Mapping[str, str], key: str) -> int | None:
    if key not in env:
        return None
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"{key}={env[key]!r} is not an integer") from None


def initialize(cfg: DistributedConfig | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Join the multi-process JAX runtime if the settings say so; True when it is (now) joined.

    Call before any JAX computation. Idempotent. On processes other than 0 the
    root logger is raised to WARNING.
    """
    import jax

    if jax.distributed.is_initialized():
        return True
    kwargs = resolve(cfg, env)
    if kwargs is None:
        return False
    collectives = (cfg or DistributedConfig()).cpu_collectives
    if collectives != "none":  # only used by the CPU backend; harmless elsewhere
        jax.config.update("jax_cpu_collectives_implementation", collectives)
    shown = {k: v for k, v in kwargs.items() if k != "initialization_timeout"} or "TPU auto-detection"
    log.info("jax.distributed.initialize(%s)", shown)
    jax.distributed.initialize(**kwargs)
    global _barrier_timeout_s
    _barrier_timeout_s = kwargs.get("initialization_timeout", _barrier_timeout_s)
    log.info(
        "process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    if not is_primary():  # process 0 reports; the others only warn
        logging.getLogger().setLevel(logging.WARNING)
    return True


def barrier(reason: str) -> None:
    """Wait until every process of a multi-process run has reached this call (a no-op in one
    process). Call it before a program that spans processes when their work up to it may differ
    in time: gloo sets up a CPU collective's context with a fixed 30 s deadline, so a process that
    arrives later than that fails the run; this wait's deadline is `initialization_timeout`."""
    import jax

    if jax.process_count() == 1:
        return
    from jax._src.distributed import global_state

    name = f"marljax/{next(_barriers)}/{reason}"  # a barrier's name is used once
    global_state.client.wait_at_barrier(name, timeout_in_ms=_barrier_timeout_s * 1000)


def is_primary() -> bool:
    """True on process 0, the one that writes logs, metrics, plots and manifests."""
    import jax

    return jax.process_index() == 0


def allgather_objects(obj: Any) -> list:
    """Every process's `obj` (JSON-serialisable), in process order; `[obj]` on a single process.

    A collective: every process must call it at the same point of the program, as for any
    computation over devices of several processes.
    """
    import jax

    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([data.size], np.int64)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    rows = multihost_utils.process_allgather(padded).reshape(len(sizes), -1)
    return [json.loads(bytes(row[: int(n)])) for row, n in zip(rows, sizes)]


def all_processes(flag: bool) -> bool:
    """True when `flag` is True on every process (a collective, like `allgather_objects`)."""
    return all(allgather_objects(bool(flag)))
