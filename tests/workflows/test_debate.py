"""The debate workflow (the worked example of adding a workflow): prompts, joint rewards, per-agent
credit, evaluation, and two training steps through the real Trainer on a tiny model."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from rows_view import each_row

from marljax.rewards import SandboxVerifier
from marljax.tasks import parse_row
from marljax.workflows import REGISTRY
from marljax.workflows.base import Agent, ScriptedGenerator
from marljax.workflows.debate import DebateConfig, DebateWorkflow

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PROBLEMS = [
    parse_row({"id": f"q{k}", "problem": f"What is {k} + {k}?", "answer": str(2 * k)}, "math", f"<t>:{k}")
    for k in (1, 2)
]
AGENTS = {"alice": Agent("alice", "pol_a", "A: "), "bob": Agent("bob", "pol_b", "B: ")}


def script(agent, prompt, k, seed):
    """First round: alice is right in debate 0 and wrong in debate 1, bob is always wrong. Revision:
    alice keeps her answer, bob adopts alice's."""
    problem = next(p for p in PROBLEMS if p.prompt in prompt)
    right = int(problem.answer)
    if "Revise" not in prompt:
        return f"\\boxed{{{right if agent.name == 'alice' and k == 0 else right + 1}}}"
    mine = re.search(r"Your answer:\n(.*)", prompt).group(1)
    theirs = re.search(r"The answer of alice:\n(.*)", prompt)
    return mine if agent.name == "alice" else theirs.group(1)


def hand_advantages(rewards, groups):
    """(r - mean) / (std with ddof 1 + 1e-6) within each group."""
    r, out = np.asarray(rewards, float), np.zeros(len(rewards))
    for key in set(groups):
        sel = np.array([g == key for g in groups])
        out[sel] = (r[sel] - r[sel].mean()) / (r[sel].std(ddof=1) + 1e-6)
    return out


def test_registered_under_its_kind():
    assert REGISTRY["debate"] == (DebateConfig, DebateWorkflow)


def test_debaters_see_each_other_and_are_rewarded_jointly():
    prompts = []

    def spy(agent, prompt, k, seed):
        prompts.append((agent.name, prompt))
        return script(agent, prompt, k, seed)

    gen = ScriptedGenerator(spy, versions={"pol_b": 4})
    out = DebateWorkflow(group_size=2).rollout(PROBLEMS, AGENTS, gen, SandboxVerifier(), seed=3)
    assert gen.calls == [("pol_a", 2), ("pol_b", 2), ("pol_a", 4), ("pol_b", 4)]  # one call per round
    revisions = [(a, p) for a, p in prompts if "Revise" in p]
    assert len(revisions) == 8
    bob_first = next(p for a, p in revisions if a == "bob" and PROBLEMS[0].prompt in p)
    assert bob_first.startswith("B: " + PROBLEMS[0].prompt)
    assert "Your answer:\n\\boxed{3}" in bob_first and "The answer of alice:\n\\boxed{2}" in bob_first
    # per debate: alice's first answer, bob's, alice's revision, bob's (nodes 0..3)
    assert [s.agent for s in each_row(out)[:4]] == ["alice", "bob", "alice", "bob"]
    for d in range(4):
        turns = each_row(out)[4 * d : 4 * d + 4]
        assert [s.ids["node"] for s in turns] == [0, 1, 2, 3] and [s.ids["parent"] for s in turns] == [
            -1,
            -1,
            0,
            1,
        ]
        assert [s.ids["turn"] for s in turns] == [0, 0, 1, 1] and {s.ids["episode"] for s in turns} == {d}
        assert {s.ids["problem"] for s in turns} == {PROBLEMS[d // 2].id}
        # debate 0 of each problem: both revisions right (joint 1, passed); debate 1: both wrong
        assert {(s.reward, s.passed) for s in turns} == {(1.0, 1.0) if d % 2 == 0 else (0.0, 0.0)}
    assert {s.version for s in each_row(out) if s.agent == "bob"} == {4}
    assert {s.version for s in each_row(out) if s.agent == "alice"} == {0}
    rewards = [s.reward for s in each_row(out)]
    groups = [(s.ids["problem"], s.agent) for s in each_row(out)]  # each agent's turns on one problem
    np.testing.assert_allclose(
        [s.advantage for s in each_row(out)], hand_advantages(rewards, groups), atol=1e-5
    )
    m = out.metrics
    assert m["team/reward"] == 0.5 and m["team/pass_rate"] == 0.5
    assert m["debate/first_reward"] == 0.25  # alice right in one first answer of two, bob never
    assert m["agent/alice/reward"] == 0.5 and m["agent/bob/pass_rate"] == 0.5  # computed from the rollout
    assert not any(k.startswith("agent/") for k in out.extras)  # the workflow reports no per-agent statistics


def test_evaluate_one_greedy_debate_per_problem():
    gen = ScriptedGenerator(script)
    m = DebateWorkflow().evaluate(PROBLEMS, AGENTS, gen, SandboxVerifier())
    assert m == {
        "eval/alice/pass_at_1": 1.0,
        "eval/bob/pass_at_1": 1.0,
        "eval/team/pass_at_1": 1.0,
        "eval/team/reward": 1.0,
    }
    assert gen.calls == [("pol_a", 2), ("pol_b", 2), ("pol_a", 2), ("pol_b", 2)]


def test_config_checks_the_debaters():
    assert DebateConfig().check_agents(AGENTS) == []
    found = DebateConfig(agents=["alice", "carol"]).check_agents(AGENTS)
    assert [(k, v) for k, _, v in found] == [(("agents", 1), "carol")]
    assert [k for k, _, _ in DebateConfig(agents=["bob", "bob"]).check_agents(AGENTS)] == [("agents", 1)]
    with pytest.raises(ValueError):
        DebateConfig(agents=["alice"])


@pytest.mark.slow
def test_two_steps_through_the_trainer_on_a_tiny_model(tmp_path):
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer
    from marljax.train.metrics import read_metrics

    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "train.steps=2",
        "train.save_every=2",
        "train.eval_every=2",
        "train.log_to=[]",
        "train.progress=false",
        "sampler.max_new_tokens=16",
        "data.source.n_eval=2",
        "workflow.group_size=2",
        "policies.shared.buffer.threshold=16",
    ]
    trainer = Trainer(load_config(CONFIGS / "debate_tiny.yaml", overrides))
    before = trainer.policies["shared"].version
    trainer.run()
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]  # 0: the evaluation before RL
    last = records[-1]
    # the per-agent statistics and the diversity come from the trainer, not from the workflow
    for name in ("alice", "bob"):
        for key in ("reward", "pass_rate", "adv_mean", "adv_std", "amplification", "distinct_programs"):
            assert np.isfinite(last[f"agent/{name}/{key}"]), (name, key)
    assert {"team/reward", "debate/first_reward", "eval/team/pass_at_1", "eval/alice/pass_at_1"} <= set(last)
    assert (
        trainer.policies["shared"].version == before + 2
    )  # 2 problems x 2 debates x 4 turns = one update a step
    assert [r["policy/shared/updates"] for r in records[1:]] == [1.0, 1.0]
