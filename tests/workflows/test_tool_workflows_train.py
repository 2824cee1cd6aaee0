"""Each shipped tiny config of a tool workflow trains end to end on its generated task, and its
rollout logs show the tool prompts and what the environment answered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from marljax.train import rollout_log

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


QUICK = [
    "train.steps=2",
    "train.log_rollouts=1",
    "train.eval_every=2",
    "train.save_every=2",
    "train.log_to=[]",
    "train.progress=false",
    "data.batch_size=1",
]


def run_tiny(name: str, tmp_path: Path, extra: list[str]):
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer
    from marljax.train.metrics import read_metrics

    overrides = [f"run_dir={tmp_path / 'run'}", *QUICK]
    trainer = Trainer(load_config(CONFIGS / f"{name}_tiny.yaml", overrides + extra))
    trainer.run()
    return read_metrics(tmp_path / "run"), [rollout_log.read_step(tmp_path / "run", s) for s in (1, 2)]


@pytest.mark.slow
def test_sharp_tools_tiny_trains(tmp_path):
    records, steps = run_tiny("sharp_tools", tmp_path, ["workflow.group_size=2", "data.source.n_eval=2"])
    assert [r["step"] for r in records] == [0, 1, 2]  # 0: the evaluation before RL
    last = records[-1]
    for key in ("team/reward", "tools/calls_per_episode", "agent/worker1/credit", "eval/team/reward"):
        assert np.isfinite(last[key]), key
    # every worker episode of the random policy ran two turns (no answer): one merged sequence each,
    # the environment's reminder between the turns
    workers = [r for r in steps[0] if r["agent"].startswith("worker")]
    assert len(workers) == 4 and last["multiturn/fallbacks"] == 0.0
    assert all(
        "No tool call and no answer found" in r["completion"] and r["trained_len"] < r["completion_len"]
        for r in workers
    )


@pytest.mark.slow
def test_dr_mas_search_tiny_trains(tmp_path):
    records, steps = run_tiny("dr_mas_search", tmp_path, ["workflow.group_size=2", "data.source.n_eval=2"])
    assert [r["step"] for r in records] == [0, 1, 2]  # 0: the evaluation before RL
    assert {r["agent"] for r in steps[0]} <= {"router", "searcher", "answerer"}
    assert "answerer" in {r["agent"] for r in steps[0]}
    for key in ("team/reward", "dr_mas/rounds", "agent/answerer/adv_std", "eval/team/reward"):
        assert np.isfinite(records[-1][key]), key


@pytest.mark.slow
def test_at_grpo_tools_tiny_trains(tmp_path):
    records, steps = run_tiny(
        "at_grpo_tools", tmp_path, ["workflow.num_candidates=2", "data.source.n_eval=2"]
    )
    assert [r["step"] for r in records] == [0, 1, 2]  # 0: the evaluation before RL
    tool = [r for r in steps[0] if r["agent"] == "tool_agent"]
    assert tool and all("Tools:\n- check_plan(moves: string)" in r["prompt"] for r in tool)
    # the plan agent sees what the tool agent's best candidate got back
    plan = [r for r in steps[0] if r["agent"] == "plan_agent"]
    assert all("Turn 1, tool agent:" in r["prompt"] for r in plan)
    assert np.isfinite(records[-1]["team/reward"]) and np.isfinite(records[-1]["eval/team/pass_at_1"])
