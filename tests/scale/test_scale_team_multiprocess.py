"""Four real JAX processes x 2 CPU devices (jax.distributed, gloo) train a heterogeneous team
through the trainer, one policy with FSDP over all 8 devices: the metrics equal one process's
with 8 devices, the checkpoint resumes on 2 processes x 4 devices, and processes whose rollouts
differ in size (and in which policies they sample) neither hang nor disagree on updates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_scale_multiprocess import env
from test_scale_multiprocess import run_workers as run_processes

SCRIPT = Path(__file__).with_name("_scale_team_multiprocess.py")
TIMEOUT_S = 600  # a run takes minutes on 2 busy cores; a hang ends here as a failure


def run_workers(out: Path, nproc: int, mode: str) -> None:
    run_processes(SCRIPT, nproc, [str(out), str(nproc), mode], TIMEOUT_S, what=mode)


@pytest.mark.slow(seconds=100)
def test_four_processes_train_a_team_like_one_and_resume_on_two(tmp_path):
    run_workers(tmp_path, 4, "train")
    single = subprocess.run(
        [sys.executable, str(SCRIPT), "single", str(tmp_path)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert single.returncode == 0 and "single process: OK" in single.stdout, (
        single.stdout[-3000:] + single.stderr[-6000:]
    )
    run_workers(tmp_path, 2, "resume")


@pytest.mark.slow(seconds=50)
def test_processes_with_different_sample_counts_agree(tmp_path):
    run_workers(tmp_path, 4, "ragged")
