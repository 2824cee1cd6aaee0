"""DAPO's overlong penalty (`workflow.overlong`) enters each completion's reward before credit."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import parse_row
from marljax.train.config import load_config
from marljax.workflows import build_workflow
from marljax.workflows.base import Agent, OverlongConfig, ScriptedGenerator
from marljax.workflows.grpo import GrpoWorkflow
from marljax.workflows.magrpo import MagrpoWorkflow

ROW = {
    "task_id": "p0",
    "question": "Double x.",
    "fn_name": "f",
    "inputs": [[1], [2]],
    "outputs": [2, 4],
    "public": 1,
}
GOOD, BAD = "def f(x):\n    return 2 * x", "def f(x):\n    return x"
OVERLONG = {"max_len": 60, "buffer_len": 20, "factor": 1.0}


def dapo(length: int) -> float:
    """DAPO's soft overlong punishment, written out: 0, a ramp over the buffer, then -factor."""
    start = OVERLONG["max_len"] - OVERLONG["buffer_len"]
    return -min(max((length - start) / OVERLONG["buffer_len"], 0.0), 1.0)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(max_workers=2) as p:
        yield SandboxVerifier(p)


def test_grpo_rewards_carry_the_penalty_of_their_length(pool):
    problem = parse_row(ROW, "stdio", "<p0>:1")
    padding = ["", "\n# " + "x" * 20, "\n# " + "x" * 40, ""]  # completions of 26, 49, 69 and 22 bytes

    def script(agent, prompt, k, seed):
        return (GOOD if k < 3 else BAD) + padding[k]

    agents = {"solver": Agent("solver", "p")}
    plain = GrpoWorkflow(group_size=4).rollout([problem], agents, ScriptedGenerator(script), pool, 0)
    shaped = GrpoWorkflow(group_size=4, overlong=OVERLONG).rollout(
        [problem], agents, ScriptedGenerator(script), pool, 0
    )
    lengths = [len(g.completion_ids) for g in shaped.generations]
    assert lengths == [26, 49, 69, 22]
    np.testing.assert_allclose(plain.rewards, [1, 1, 1, 0])
    np.testing.assert_allclose(
        shaped.rewards, plain.rewards + np.array([dapo(n) for n in lengths]), atol=1e-6
    )
    r = shaped.rewards
    np.testing.assert_allclose(shaped.advantages, (r - r.mean()) / (r.std(ddof=1) + 1e-6), atol=1e-5)
    assert plain.advantages[0] == plain.advantages[2] and shaped.advantages[0] > shaped.advantages[2]


def test_a_joint_action_takes_the_mean_penalty_of_its_members(pool):
    problem = parse_row(ROW, "stdio", "<p0>:1")

    def script(agent, prompt, k, seed):  # the helper rambles in its second sample
        if agent.name == "helper":
            return "# helper" + (" padding" * 10 if k == 1 else "")
        return f"```python\n{GOOD}\n```"

    team = {"helper": Agent("helper", "p"), "main": Agent("main", "p")}
    wf = MagrpoWorkflow(group_size=2, task="score", overlong=OVERLONG)
    tree = wf.grow([problem], list(team.values()), ScriptedGenerator(script), pool, seed=0, n=2)
    for j in tree.joints:
        members = [len(j.node.gens[k][c].completion_ids) for k, c in enumerate(j.combo)]
        assert j.reward == pytest.approx(1.0 + np.mean([dapo(n) for n in members]))
    assert tree.joints[1].reward < tree.joints[0].reward == 1.0


def test_the_option_is_checked():
    with pytest.raises(ValidationError, match="buffer_len"):
        GrpoWorkflow(group_size=4, overlong={"max_len": 10, "buffer_len": 20})
    with pytest.raises(ValidationError, match="factor"):
        GrpoWorkflow(group_size=4, overlong={"max_len": 10, "buffer_len": 5, "factor": -1})


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TINY = sorted(CONFIGS.glob("*_tiny.yaml"))  # every registered kind (test_chat_every_workflow checks)


def lengthy():
    """A script of text of no use to any task, 1 to 40 bytes long: its length varies from one
    generation to the next (identical requests in one batch too), so that a length penalty varies
    inside every group."""
    calls = itertools.count()

    def script(agent, prompt, k, seed):
        return "a" * (1 + (7 * next(calls)) % 40)

    return script


@pytest.mark.parametrize("path", TINY, ids=[p.stem for p in TINY])
def test_every_workflow_credits_the_penalty(path, pool):
    """Reward shaping happens once, before credit, for every workflow: the same play with DAPO's
    penalty on (-length / 40 here) lowers the rewards and moves the advantages. (The tool
    workflows of SHARP once added it after credit: the rewards fell, the advantages stayed.)"""
    cfg = load_config(path, [f"run_dir={path.parent}"])
    problems = cfg.data.source.split("train")[:1]
    agents = {n: Agent(n, a.policy, a.role, a.template) for n, a in sorted(cfg.agents.items())}
    penalty = OverlongConfig(max_len=40, buffer_len=40, factor=1.0)
    out = {}
    for name, overlong in (("plain", None), ("penalised", penalty)):
        wf = build_workflow(cfg.workflow.model_copy(update={"overlong": overlong}))
        out[name] = wf.rollout(problems, agents, ScriptedGenerator(lengthy()), pool, seed=0)
    plain, penalised = out["plain"], out["penalised"]
    assert [g.text for g in penalised.generations] == [g.text for g in plain.generations]
    assert np.all(penalised.rewards < plain.rewards)  # every completion has at least one byte
    assert not np.allclose(penalised.advantages, plain.advantages, atol=1e-3)
