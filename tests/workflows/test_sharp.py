"""SHARP: plans and workers, counterfactual coalition programs, Shapley credit, three-level rewards."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pydantic import ValidationError
from rows_view import each_row

from marljax import kernels
from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import parse_row, synthetic_rows
from marljax.workflows.base import Agent, ScriptedGenerator
from marljax.workflows.sharp import (
    SharpConfig,
    SharpWorkflow,
    coalition_code,
    parse_subtasks,
    process_rewards,
    sampled_coalitions,
    shapley_credit,
    team_value_table,
)

ROW = synthetic_rows(1, seed=0)[0]  # f(x) = x*x % 5; outputs [4, 4, 1, 4, 0, 4, 4, 4, 4, 0, 1, 4]
PROBLEM = parse_row(ROW, "stdio", "<test>:1")
AGENTS = {
    "planner": Agent("planner", "pol_p"),
    "w1": Agent("w1", "pol_1"),
    "w2": Agent("w2", "pol_2"),
    "w3": Agent("w3", "pol_2"),
}
GOOD_PLAN = "1. write a helper g(x) = x * x % 5\n2. write f(x) calling g"
HELPER = "def g(x):\n    return x * x % 5"
# without g, f falls back to 4: right on 8 of the 12 tests
ENTRY = "def f(x):\n    try:\n        return g(x)\n    except NameError:\n        return 4"
BROKEN = "def g(x) return"


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


def script(agent, prompt, k, seed):
    """Sample 0: a good plan, a helper and the entry point (values: {} 0, {w1} 0, {w2} 2/3, {w1, w2} 1).
    Sample 1: no numbered plan, after which w1 writes a syntax error (values: {w2} 2/3, else 0)."""
    if agent.name == "planner":
        return GOOD_PLAN if k == 0 else "do it all"
    good = GOOD_PLAN in prompt
    if agent.name == "w1":
        return fence(HELPER if good else BROKEN)
    return fence(ENTRY if good else "def f(x):\n    return 4")


class RecordingPool:
    def __init__(self, pool):
        self.pool, self.codes = pool, []

    def map(self, programs):
        self.codes += [p.code for p in programs]
        return self.pool.map(programs)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(max_workers=2) as p:
        yield SandboxVerifier(p)


def hand_advantages(rewards):
    """Per agent (column) over the G trajectories of one problem: (r - mean) / (std ddof 1 + 1e-6)."""
    r = np.asarray(rewards, float)
    return (r - r.mean(0)) / (r.std(0, ddof=1) + 1e-6)


def test_two_player_shapley_by_hand_and_the_kernel():
    table = np.array([0.0, 0.2, 0.4, 1.0])  # bit 0: player 1, bit 1: player 2
    assert (
        kernels.coalition_index(jnp.array([True, False])) == 1
        and kernels.coalition_index(jnp.array([False, True])) == 2
    )
    assert shapley_credit(table[None])[0] == pytest.approx([0.4, 0.6])
    tables = np.random.default_rng(0).random((3, 16)).astype(np.float32)
    assert np.allclose(shapley_credit(tables), kernels.shapley_values(jnp.asarray(tables)))


def test_sampled_credit_visits_only_what_it_needs_and_equals_the_kernel():
    tables = np.random.default_rng(1).random((3, 16)).astype(np.float32)
    keys = jnp.stack([jax.random.PRNGKey(k) for k in range(3)])
    needed = sampled_coalitions(4, keys, 2)
    masked = np.full_like(tables, np.nan)
    for n, idx in enumerate(needed):
        masked[n, idx] = tables[n, idx]
        assert 0 in idx and 15 in idx and len(idx) < 16
    got = shapley_credit(masked, "sampled", keys, 2)  # NaN would show if an unvisited entry were read
    for n in range(3):
        table = jnp.asarray(tables[n])
        expect, _ = kernels.sampled_shapley_values(
            lambda c, t=table: t[kernels.coalition_index(c)], 4, keys[n], 2
        )
        assert np.allclose(got[n], expect)
        assert got[n].sum() == pytest.approx(tables[n, 15] - tables[n, 0], abs=1e-5)  # efficiency


def test_coalition_programs_and_the_planner_table():
    codes = ["A = 1", "", "def f(): return A"]
    assert coalition_code(codes, 0b101) == "A = 1\n\ndef f(): return A"
    assert coalition_code(codes, 0b100) == "def f(): return A"
    assert coalition_code(codes, 0b010) == coalition_code(codes, 0) == ""
    # planner = player 0: with it a coalition is worth its workers' program, without it the empty team's
    assert team_value_table(np.array([0.1, 0.2, 0.3, 0.4])).tolist() == pytest.approx(
        [0.1, 0.1, 0.1, 0.2, 0.1, 0.3, 0.1, 0.4]
    )


def test_plan_and_process_rewards():
    assert parse_subtasks("Plan:\n1. read\n2) solve\nStep 3: print\n1. again") == {
        1: "read",
        2: "solve",
        3: "print",
    }
    assert process_rewards(GOOD_PLAN, [fence(HELPER), fence(ENTRY)], "f").tolist() == [1, 1, 1]
    assert process_rewards("1. all", [fence(BROKEN), "x = 1"], "f").tolist() == [0, 0, 0]
    assert process_rewards("1. a\n2. b", ["x = 1", "print(1)"], None).tolist() == [1, 0, 1]  # stdin: any code


def test_rollout_credit_rewards_advantages_and_batching(pool):
    gen, rec = ScriptedGenerator(script, versions={"pol_1": 2}), RecordingPool(pool.pool)
    wf = SharpWorkflow(
        "planner", ["w1", "w2"], group_size=2, global_weight=1.0, shapley_weight=1.0, process_weight=0.5
    )
    out = wf.rollout([PROBLEM], AGENTS, gen, SandboxVerifier(rec), seed=0)
    assert gen.calls == [("pol_p", 1), ("pol_1", 2), ("pol_2", 2)]  # one call per stage, grouped by policy
    # each distinct non-empty coalition program runs once: {w1}, {w2}, {w1, w2} per trajectory
    assert rec.codes == [
        HELPER,
        ENTRY,
        HELPER + "\n\n" + ENTRY,
        BROKEN,
        "def f(x):\n    return 4",
        BROKEN + "\n\ndef f(x):\n    return 4",
    ]
    assert out.metrics["team/programs_run"] == 6
    # players (planner, w1, w2). Trajectory 0: v(P, w2) = 2/3, v(all) = 1, else 0:
    #   phi = (1/6 * 2/3 + 1/3, 1/3 * (1 - 2/3), 1/6 * 2/3 + 1/3) = (4/9, 1/9, 4/9)
    # trajectory 1: v(P, w2) = 2/3, else 0 (the broken helper breaks the whole program):
    #   phi = (1/6 * 2/3, 1/3 * (0 - 2/3), 1/6 * 2/3) = (1/9, -2/9, 1/9)
    outcome = np.array([1.0, 0.0])
    phi = np.array([[4 / 9, 1 / 9, 4 / 9], [1 / 9, -2 / 9, 1 / 9]])
    process = np.array([[1, 1, 1], [0, 0, 1]])
    rewards = outcome[:, None] + phi + 0.5 * process  # w_g R + w_s phi + w_p process
    assert rewards[0] == pytest.approx([1 + 4 / 9 + 0.5, 1 + 1 / 9 + 0.5, 1 + 4 / 9 + 0.5])
    got = np.array([s.reward for s in each_row(out)]).reshape(2, 3)
    assert np.allclose(got, rewards, atol=1e-6)
    assert np.allclose(
        np.array([s.advantage for s in each_row(out)]).reshape(2, 3), hand_advantages(rewards), atol=1e-5
    )
    assert each_row(out)[0].advantage == pytest.approx(np.sqrt(0.5), abs=1e-5)
    for n in range(2):
        for k, s in enumerate(each_row(out)[3 * n : 3 * n + 3]):
            assert s.agent == ["planner", "w1", "w2"][k] and s.policy == AGENTS[s.agent].policy
            assert s.ids == {
                "problem": PROBLEM.id,
                "episode": n,
                "node": k,
                "parent": -1 if k == 0 else 0,
                "depth": min(k, 1),
                "turn": min(k, 1),
            }
            assert s.version == (2 if s.policy == "pol_1" else 0)
    m = out.metrics
    assert m["agent/w1/shapley"] == pytest.approx((1 / 9 - 2 / 9) / 2, abs=1e-6)
    assert m["agent/planner/process"] == 0.5 and m["team/reward"] == 0.5 and m["team/pass_rate"] == 0.5
    assert all(np.isfinite(v) for v in m.values())


def test_workers_see_the_plan_and_their_sub_task(pool):
    prompts = []

    def spy(agent, prompt, k, seed):
        prompts.append((agent.name, prompt))
        return script(agent, prompt, k, seed)

    SharpWorkflow("planner", ["w1", "w2"], group_size=2).rollout(
        [PROBLEM], AGENTS, ScriptedGenerator(spy), pool, 0
    )
    assert [a for a, _ in prompts] == ["planner", "planner", "w1", "w2", "w1", "w2"]
    plan_prompt = prompts[0][1]
    assert "numbered list 1..2" in plan_prompt and "entry point `f`" in plan_prompt
    w1, w2 = prompts[2][1], prompts[3][1]
    assert GOOD_PLAN in w1 and "sub-task 1: write a helper g(x)" in w1 and "worker 1 of 2" in w1
    assert "sub-task 2: write f(x) calling g" in w2
    assert "lists no such sub-task" in prompts[4][1]  # the second plan has no numbered items


def test_sampled_mode_is_efficient_per_trajectory(pool):
    wf = SharpWorkflow(
        "planner",
        ["w1", "w2", "w3"],
        group_size=2,
        shapley="sampled",
        num_permutations=2,
        global_weight=0.0,
        shapley_weight=1.0,
        process_weight=0.0,
    )
    out = wf.rollout([PROBLEM], AGENTS, ScriptedGenerator(script), pool, seed=3)
    credit = np.array([s.reward for s in each_row(out)]).reshape(2, 4)  # reward = phi with these weights
    # w3 repeats w2's entry point; with the good plan the team passes everything, else the broken helper fails it
    assert credit.sum(1) == pytest.approx([1.0, 0.0], abs=1e-5)
    assert out.metrics["team/programs_run"] <= 2 * 7


def test_counterfactual_credit_masks_one_agent_at_a_time(pool):
    wf = SharpWorkflow(
        "planner", ["w1", "w2"], group_size=2, shapley="counterfactual", global_weight=0.0, process_weight=0.0
    )
    out = wf.rollout([PROBLEM], AGENTS, ScriptedGenerator(script), pool, seed=0)
    credit = np.array([s.reward for s in each_row(out)]).reshape(2, 3)  # reward = credit with these weights
    # trajectory 0 (values {} 0, {w1} 0, {w2} 2/3, {w1, w2} 1): v(all) - v(all without k), without
    # the planner as without any worker: (1 - 0, 1 - 2/3, 1 - 0); trajectory 1 (v(all) = 0, {w2} 2/3)
    np.testing.assert_allclose(credit, [[1, 1 / 3, 1], [0, -2 / 3, 0]], atol=1e-6)
    three = SharpWorkflow("planner", ["w1", "w2", "w3"], group_size=2, shapley="counterfactual")
    rec = RecordingPool(pool.pool)
    three.rollout([PROBLEM], AGENTS, ScriptedGenerator(script), SandboxVerifier(rec), seed=0)
    # per trajectory the full team and the three teams of two, not all 7 non-empty coalitions
    assert len(rec.codes) <= 2 * 4


def test_evaluate(pool):
    gen = ScriptedGenerator(script)
    m = SharpWorkflow("planner", ["w1", "w2"]).evaluate([PROBLEM], AGENTS, gen, pool)
    assert m == {"eval/team/pass_at_1": 1.0, "eval/team/reward": 1.0}
    assert gen.calls == [("pol_p", 1), ("pol_1", 1), ("pol_2", 1)]


def test_config():
    cfg = SharpConfig(
        planner="p", workers=["a", "b"], shapley="sampled", num_permutations=4, process_weight=0.3
    )
    wf = SharpWorkflow.from_config(cfg)
    assert wf.cfg == cfg
    assert cfg.check_agents({"p": 0, "a": 0}) == [(("workers", 1), "unknown agent; known: p, a", "b")]
    for bad in (
        {"workers": []},
        {"workers": ["p", "a"], "planner": "p"},
        {"workers": ["a", "a"]},
        {"workers": [f"w{i}" for i in range(9)]},
        {"workers": ["a"], "group_size": 1},
        {},
    ):
        with pytest.raises(ValidationError):
            SharpConfig(**bad)
    SharpConfig(workers=[f"w{i}" for i in range(9)], shapley="sampled")  # many workers: sampled is fine
