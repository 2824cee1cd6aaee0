"""Helpers shared by the benchmarks: interleaved A/B timing and JSON from a child process."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def interleaved(calls: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, dict]:
    """Time each call `repeats` times in rounds (A B A B ...), after `warmup` untimed rounds, so
    every library sees the same machine load. Each call must block until its work is done.
    Returns {name: {"seconds": median, "best_seconds": min, "all_seconds": [...], "best_cpu_seconds":
    min of this process's CPU time (all threads), "last": last result}}. On a loaded machine the
    ratio of the best times is the steadier estimate of what each side can do, and CPU time (work
    done, not time waited for a core) steadier still, for calls that run in this process."""
    last = {}
    for _ in range(warmup):
        for name, fn in calls.items():
            last[name] = fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t, c = time.perf_counter(), time.process_time()
            last[name] = fn()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    return {
        name: {
            "seconds": statistics.median(ts),
            "best_seconds": min(ts),
            "all_seconds": ts,
            "best_cpu_seconds": min(cpu[name]),
            "last": last[name],
        }
        for name, ts in times.items()
    }


def child_json(argv: list[str], timeout: float | None = None, env: dict[str, str] | None = None) -> dict:
    """Run `argv` (a python command) with the repository on PYTHONPATH and `env` (default: this
    process's environment); parse its `JSON:` line."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=timeout)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON:")]
    if proc.returncode or not line:
        raise RuntimeError(
            f"{' '.join(argv[:3])} ... failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(line[-1][5:])


def emit_json(obj: dict) -> None:
    """The child side of `child_json`."""
    print("JSON:" + json.dumps(obj))
    sys.stdout.flush()


def fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"
