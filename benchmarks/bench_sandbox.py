"""Sandbox throughput: programs/s through the pool (forked from warm sandboxes, and with a fresh
sandbox per program) vs one fresh sandbox at a time.

    python benchmarks/bench_sandbox.py [--n 200] [--workers N] [--json PATH]

(JSON default: $TMPDIR/marljax_bench_sandbox.json)

Workload: trivial HumanEval-style programs (a one-line function and a
``check(candidate)`` with three asserts).  Prints a markdown table and writes
JSON.  Where the isolation level allows it (``bwrap``; ``unshare`` as root) the
pool forks each program from a warm sandbox (``SandboxConfig.fork_server``, the
default); the same pool with ``fork_server=False`` starts the sandbox and Python
per program.  The overhead
of a fresh sandbox is broken down by starting the same things bare: ``python
-I -S -c pass`` (interpreter start-up), the isolation wrapper around it
(``bwrap``/``unshare`` cost), and the full harness run (our protocol, rlimits,
uid drop, temp dir, records, cleanup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marljax.rewards import AssertTest, Program, SandboxConfig, SandboxPool, detect_isolation, run_program  # noqa: E402
from marljax.rewards.fork_server import ForkServer  # noqa: E402
from marljax.rewards.isolation import bwrap_harness_argv, forks_programs, unshare_argv  # noqa: E402
from marljax.rewards.pool import default_workers  # noqa: E402

CHECK = (
    "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
    "    assert candidate(-1, 1) == 0\n\ncheck(add)\n"
)


def programs(n: int) -> list[Program]:
    return [
        Program(f"def add(a, b):\n    # variant {k}\n    return a + b\n", (AssertTest(CHECK),))
        for k in range(n)
    ]


def timed_runs(argv_fn, n: int) -> float:
    """Median seconds of running a command n times (sequentially)."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv_fn(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(mode: str = "full", n: int | None = None, workers: int | None = None) -> dict:
    n = n or {"smoke": 8, "quick": 60, "full": 200}[mode]
    workers = workers or default_workers()
    cfg = SandboxConfig()
    iso = detect_isolation(cfg)
    progs = programs(n)
    run_program(progs[0])  # warm caches

    # Naive baseline: one sandboxed subprocess at a time.
    n_seq = max(4 if mode == "smoke" else 20, n // 4)
    t = time.perf_counter()
    seq = [run_program(p) for p in progs[:n_seq]]
    seq_s = time.perf_counter() - t
    assert all(r.passed for r in seq)

    def pool_rate(config: SandboxConfig, count: int) -> float:
        with SandboxPool(max_workers=workers, config=config) as pool:
            pool.map(progs[:workers])  # start the workers' sandboxes
            t = time.perf_counter()
            res = pool.map(progs[:count])
            rate = count / (time.perf_counter() - t)
        assert all(r.passed for r in res)
        return rate

    fresh_rate = pool_rate(SandboxConfig(fork_server=False), n)
    warm = forks_programs(iso)
    warm_rate = pool_rate(SandboxConfig(), n) if warm else None

    # Overhead breakdown (sequential medians).
    k = 3 if mode == "smoke" else 15
    py = [cfg.python, "-I", "-S", "-c", "pass"]
    bare = timed_runs(lambda: py, k)
    wrapped = None
    tmp = tempfile.mkdtemp(prefix="marljax-bench-")
    payload = os.path.join(tmp, "p.json")
    Path(payload).write_text("{}")
    if iso.level == "bwrap":
        argv = bwrap_harness_argv(cfg, tmp, payload, drop=False)
        cut = argv.index("--") + 1
        wrapped = timed_runs(lambda: argv[:cut] + py, k)
    elif iso.level == "unshare":
        wrapped = timed_runs(lambda: unshare_argv(cfg, ["-c", "pass"]), k)
    shutil.rmtree(tmp)
    full = statistics.median([run_program(p).wall_s for p in progs[:k]])
    forked = None
    if warm:
        with ForkServer(cfg, iso) as server:
            run_program(progs[0], server=server)
            forked = statistics.median([run_program(p, server=server).wall_s for p in progs[:k]])
    startup = statistics.median([r.startup_s for r in seq])
    tests = statistics.median([r.tests_s for r in seq])

    out = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "isolation": iso.level,
        "workers": workers,
        "n": n,
        "pool_programs_per_s": warm_rate or fresh_rate,
        "pool_fresh_programs_per_s": fresh_rate,
        "pool_fork_server_programs_per_s": warm_rate,
        "sequential_programs_per_s": n_seq / seq_s,
        "speedup": (warm_rate or fresh_rate) / (n_seq / seq_s),
        "fork_server_speedup": None if warm_rate is None else warm_rate / fresh_rate,
        "overhead_ms": {
            "python_-I_-S_start": bare * 1e3,
            "isolation_wrapper_plus_python": None if wrapped is None else wrapped * 1e3,
            "full_run_program": full * 1e3,
            "forked_run_program": None if forked is None else forked * 1e3,
            "child_startup_until_ready": startup * 1e3,
            "tests_themselves": tests * 1e3,
        },
    }
    o = out["overhead_ms"]
    rows = []
    if warm:
        rows += [
            f"| pool ({workers} workers), forked from warm sandboxes, programs/s | **{warm_rate:.1f}** |",
            f"| pool, fresh sandbox per program, programs/s | {fresh_rate:.1f} |",
            f"| warm / fresh | **{out['fork_server_speedup']:.2f}x** |",
        ]
    else:
        rows.append(
            f"| pool ({workers} workers), fresh sandbox per program, programs/s | **{fresh_rate:.1f}** |"
        )
    rows += [
        f"| one fresh sandbox at a time, programs/s | {out['sequential_programs_per_s']:.1f} |",
        f"| pool / one at a time | {out['speedup']:.2f}x |",
        f"| `python -I -S -c pass` | {o['python_-I_-S_start']:.1f} ms |",
    ]
    if wrapped is not None:
        rows.append(f"| {iso.level} + python | {o['isolation_wrapper_plus_python']:.1f} ms |")
    rows += [f"| full run_program, fresh sandbox (wall) | {o['full_run_program']:.1f} ms |"]
    if forked is not None:
        rows.append(f"| run_program forked from a warm sandbox (wall) | {o['forked_run_program']:.1f} ms |")
    rows += [
        f"| child start-up until ready (incl. harness imports, rlimits, uid drop) | "
        f"{o['child_startup_until_ready']:.1f} ms |",
        f"| the tests themselves | {o['tests_themselves']:.2f} ms |",
    ]
    out["markdown"] = (
        f"{n} trivial HumanEval-style programs, isolation={iso.level}\n\n| measure | value |\n"
        "|---|---|\n" + "\n".join(rows)
    )
    if iso.level == "bwrap":  # measured: 300 forked programs, 0.71 s busy of which 0.00 s reached os.times()
        out["markdown"] += (
            '\n\nThe "other processes" figure below includes this section\'s own sandboxes: '
            "the CPU time of bubblewrap's processes never reaches this process's accounting."
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--workers", type=int, help="default: SandboxPool's (cores + 1)")
    ap.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "marljax_bench_sandbox.json"))
    args = ap.parse_args()
    out = run("full", args.n, args.workers)
    print(out.pop("markdown"))
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"\nJSON written to {args.json}")


if __name__ == "__main__":
    main()
