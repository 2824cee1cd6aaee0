"""The warm-started tiny configs of the README's CLI block visibly learn, one per family of
workflows (a single agent writing programs; a team writing programs; a team calling tools), and a
team of LoRA adapters on the code team's warm start: their held-out evaluation after RL is above
the one before RL (step 0, right after the SFT warm start) by more than the seed-to-seed spread of
that gain.

In CI the README's CLI block trains these configs as written (`.ci/run` names its directory in
MARLJAX_README_CLI_OUT, and its last commands still run when the tests start); the tests wait for
the block to finish and read those runs instead of training them again. Elsewhere each trains the
shipped config into a temporary directory (about two minutes each on 2 cores)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


# configs whose base model is another config's warm start (step 0 of its run: the policy right
# after SFT), as the README block exports it: config -> (that config, its policy)
WARM_BASES = {"mars2_lora_warm_tiny": ("mars2_sft_tiny", "coder")}


def finished_run(name: str, tmp_path: Path, extra: tuple[str, ...] = ()) -> tuple[Path, object]:
    """(run directory, config) of `configs/<name>.yaml` trained to its `train.steps` (with the
    `extra` overrides where the README block's run is not there to read)."""
    from marljax.demo.tools import write_teacher_model
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer

    cfg = load_config(CONFIGS / f"{name}.yaml")
    cli = os.environ.get("MARLJAX_README_CLI_OUT")
    if cli and readme_cli_status(Path(cli)) == 0 and (Path(cli) / "runs" / name / "metrics.jsonl").is_file():
        return Path(cli) / "runs" / name, cfg
    overrides = [f"run_dir={tmp_path / 'run'}", "train.log_to=[]", "train.progress=false", *extra]
    if cfg.train.sft_teacher is not None:  # its model, written as the README does
        (policy,) = cfg.policies
        overrides.append(f"policies.{policy}.model.path={tmp_path / 'model'}")
    if name in WARM_BASES:
        base = warm_start(*WARM_BASES[name], tmp_path / "base")
        overrides += [f"policies.{p}.model.path={base}" for p in cfg.policies]
    run_cfg = load_config(CONFIGS / f"{name}.yaml", overrides)
    if run_cfg.train.sft_teacher is not None:
        write_teacher_model(run_cfg)
    Trainer(run_cfg).run()
    return tmp_path / "run", cfg


def warm_start(name: str, policy: str, tmp_path: Path) -> Path:
    """`policy` at step 0 of `configs/<name>.yaml`'s run, exported as the README block does. One RL
    step is trained: step 0, saved before RL, is the full run's."""
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer

    run_dir, _ = finished_run(name, tmp_path, ("train.steps=1", "train.eval_every=null"))
    trainer = Trainer(load_config(run_dir / "config.yaml", [f"run_dir={run_dir}"]))
    try:
        assert trainer.restore(step=0) and trainer.step == 0
        return trainer.policies[policy].export(tmp_path / "warm")
    finally:
        trainer.close()


def readme_cli_status(cli: Path, timeout: float = 1500.0) -> int:
    """The README CLI block's exit status, once it has finished: `.ci/run` starts the tests while
    the block's last commands still run and writes `exit_status` to its directory at the end. A block
    that failed is reported by `.ci/run` itself; here the test then trains the config on its own.
    The wait is for a hung block only: on a slow 2-core machine the block ends ~15 minutes after
    the tests start."""
    deadline = time.monotonic() + timeout
    while not (cli / "exit_status").is_file():
        if time.monotonic() > deadline:
            pytest.fail(f"the README CLI block in {cli} did not finish within {timeout:.0f} s")
        time.sleep(1.0)
    return int((cli / "exit_status").read_text())


def evaluations(run_dir: Path, steps: int) -> dict[int, dict[str, float]]:
    """step -> that step's `eval/...` metrics, for the steps up to `steps`."""
    from marljax.train.metrics import read_metrics

    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")}
        for r in read_metrics(run_dir)
        if 0 <= r["step"] <= steps and any(k.startswith("eval/") for k in r)
    }


# the wait for the README block (`readme_cli_status`) counts toward the test's time
@pytest.mark.timeout(1800)
@pytest.mark.slow(seconds=150)
def test_warm_started_grpo_tiny_config_learns(tmp_path):
    # configs/grpo_sft_tiny.yaml at model seeds 0, 1, 2 (AMD EPYC 2-core VM, 2026-11-28): held-out
    # reward at step 0 -> mean of steps 30 and 40: 0.236 -> 0.369 (+0.13), 0.132 -> 0.289 (+0.16),
    # 0.246 -> 0.378 (+0.13); pass@1 0.047 -> 0.156, 0.125, 0.227 (+0.11, +0.08, +0.18). A run
    # that does not learn keeps its step-0 weights and, evaluated greedily, its step-0 numbers.
    # The margins are half the smallest gain seen, several times the seeds' spread of the gains
    # (0.016 for the reward, 0.05 for pass@1).
    run_dir, cfg = finished_run("grpo_sft_tiny", tmp_path)
    evals = evaluations(run_dir, cfg.train.steps)
    assert sorted(evals) == list(range(0, cfg.train.steps + 1, cfg.train.eval_every)), sorted(evals)
    before, after = evals[0], [evals[s] for s in (cfg.train.steps - 10, cfg.train.steps)]
    for key, margin in (("eval/solver/reward", 0.06), ("eval/solver/pass_at_1", 0.04)):
        gain = np.mean([a[key] for a in after]) - before[key]
        assert gain > margin, (key, evals)
    assert before["eval/solver/pass_at_1"] < 0.5  # the warm start leaves room to learn


def check_code_team_rise(name: str, tmp_path: Path, after: list[int], margins: dict[str, float]) -> None:
    """The code team's held-out pass@1 and reward (its agents' mean), step 0 -> the mean of the
    evaluations at steps `after`, rise by more than `margins`; the warm start leaves room to learn."""
    run_dir, cfg = finished_run(name, tmp_path)
    evals = evaluations(run_dir, cfg.train.steps)
    assert sorted(evals) == list(range(0, cfg.train.steps + 1, cfg.train.eval_every)), sorted(evals)

    def team(e: dict, what: str) -> float:
        return np.mean([e[f"eval/{agent}/{what}"] for agent in cfg.agents])

    for what, margin in margins.items():
        gain = np.mean([team(evals[s], what) for s in after]) - team(evals[0], what)
        assert gain > margin, (what, evals)
    assert team(evals[0], "pass_at_1") < 0.5


# the wait for the README block (`readme_cli_status`) counts toward the test's time
@pytest.mark.timeout(1800)
@pytest.mark.slow(seconds=150)
def test_warm_started_code_team_config_learns(tmp_path):
    # configs/mars2_sft_tiny.yaml at seeds 0, 1, 2 (model, teacher and run; AMD EPYC 2-core VM,
    # 2026-11-29, `marljax train` at LLVM level 1 and at XLA's default, as the README block runs it:
    # the same numbers): held-out pass@1 and reward (one program per agent
    # and task, 128 tasks, RL's temperature, the same seeds at every evaluation), the two agents'
    # mean, step 0 -> mean of steps 30 and 40: pass@1 0.188 -> 0.285 (+0.098), 0.258 -> 0.383
    # (+0.125), 0.109 -> 0.287 (+0.178); reward 0.310 -> 0.400 (+0.090), 0.410 -> 0.501 (+0.090),
    # 0.260 -> 0.392 (+0.132). A team that does not learn keeps its step-0 numbers (same weights,
    # same seeds) or, if its weights drift, moves by about the standard deviation of two 256-sample
    # means drawn apart (~0.04 for pass@1, ~0.03 for the reward): the margins are above that and
    # below the smallest gain by about the gains' spread (0.04 for pass@1, 0.02 for the reward).
    check_code_team_rise("mars2_sft_tiny", tmp_path, [30, 40], {"reward": 0.05, "pass_at_1": 0.06})


# the wait for the README block (`readme_cli_status`) counts toward the test's time
@pytest.mark.timeout(1800)
@pytest.mark.slow(seconds=150)
def test_warm_started_tool_team_config_learns(tmp_path):
    # configs/dr_mas_search_sft_tiny.yaml at seeds 0, 1, 2 (model, teacher and run; AMD EPYC 2-core
    # VM, 2026-11-29): the team's reward on 128 new draws of its world (its 12 people's questions
    # with other distractor passages and orders), at RL's sampling with the same seeds before and
    # after, step 0 -> step 12, `marljax train` at XLA's default (as the README block runs it):
    # 0.023 -> 0.383 (+0.359), 0.125 -> 0.391 (+0.266), 0.086 -> 0.477 (+0.391), mean +0.34, std
    # 0.07; at LLVM level 1: +0.375, +0.266, +0.328. A team that does not learn
    # gains 0 (same weights, same seeds) or, if its weights drift, about one standard deviation of
    # two 128-episode means drawn apart (~0.06): the margin is twice that, below every gain by more
    # than twice their spread.
    from marljax.train import rollout_log

    run_dir, cfg = finished_run("dr_mas_search_sft_tiny", tmp_path)
    evals = evaluations(run_dir, cfg.train.steps)
    assert sorted(evals) == [0, cfg.train.steps], sorted(evals)
    before, after = evals[0]["eval/team/reward"], evals[cfg.train.steps]["eval/team/reward"]
    assert before < 0.5 and after - before > 0.12, evals
    # what the team was asked and wrote: the searcher's tool calls and what the search tool answered
    logged = rollout_log.read_step(run_dir, cfg.train.steps)
    text = "\n".join(r["prompt"] + r["completion"] for r in logged)
    assert "<tool_call>" in text and "[search] [1]" in text


# the wait for the README block (`readme_cli_status`) counts toward the test's time
@pytest.mark.timeout(1800)
@pytest.mark.slow(seconds=150)
def test_lora_team_on_the_warm_start_config_learns(tmp_path):
    # configs/mars2_lora_warm_tiny.yaml (alice's and bob's adapters on step 0 of mars2_sft_tiny's run)
    # at seeds 0, 1, 2 (the base's model, teacher and SFT, and the LoRA run; AMD EPYC 2-core VM,
    # 2026-11-29, XLA's default, as the README block runs it): the two agents' held-out pass@1 and
    # reward (as in the code team's test), step 0 -> mean of every evaluation after RL began (steps
    # 10-40): pass@1 0.191 -> 0.267 (+0.075), 0.582 -> 0.710 (+0.128), 0.125 -> 0.230 (+0.105);
    # reward 0.316 -> 0.385 (+0.069), 0.644 -> 0.728 (+0.084), 0.277 -> 0.364 (+0.087). Seed 0 on
    # another float path (the test suite's quick compiles, where no README run is there to read):
    # +0.066 and +0.053. The gain of steps 30-40 alone moved more with the float path (+0.088 and
    # +0.083 at XLA's default, +0.059 and +0.042 at the suite's), so the criterion averages the
    # four evaluations. A team that does not learn moves by ~0.02-0.03: the margins are above
    # that and below the smallest gain by ~0.025.
    check_code_team_rise(
        "mars2_lora_warm_tiny", tmp_path, [10, 20, 30, 40], {"reward": 0.03, "pass_at_1": 0.04}
    )
