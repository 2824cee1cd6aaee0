"""Two real JAX processes on localhost (jax.distributed, gloo CPU collectives): a data-parallel
update equals the single-process one, and their checkpoint restores in a single process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("_scale_multiprocess.py")
TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def env() -> dict:
    """The workers' environment: no cluster settings of the machine's own; the suite's XLA flags
    (quick compiles, tests/conftest.py) kept: every process compiles each program itself."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MARLJAX_"))}
    out.update(JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return out


def run_workers(script: Path, nproc: int, args: list[str], timeout: float, what: str = "") -> None:
    """`script worker PID PORT *args` in `nproc` processes joined on one free port; each must exit 0
    printing `worker PID[ what]: OK`. Workers still running after `timeout` seconds (a hang) are
    killed and the test fails with their output."""
    port = free_port()
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), "worker", str(pid), str(port), *args],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(nproc)
    ]
    logs = []
    try:
        for w in workers:
            logs.append(w.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for w in workers:
            w.kill()
        pytest.fail(
            f"{what or script.name}: {nproc} workers did not finish within {timeout} s (a hang):\n"
            + "\n".join(w.communicate()[0][-2000:] for w in workers)
        )
    suffix = f" {what}" if what else ""
    for pid, (w, log) in enumerate(zip(workers, logs)):
        assert w.returncode == 0 and f"worker {pid}{suffix}: OK" in log, log[-6000:]


@pytest.mark.slow(seconds=40)
def test_two_processes_match_one_and_share_a_checkpoint(tmp_path):
    run_workers(SCRIPT, 2, [str(tmp_path)], TIMEOUT_S)
    single = subprocess.run(
        [sys.executable, str(SCRIPT), "single", str(tmp_path)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-6000:]
    assert "single process: OK" in single.stdout
