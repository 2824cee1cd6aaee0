"""AT-GRPO workflow: tree shapes, best-branch selection, (problem, turn, agent) groups, feedback, the grid game."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from rows_view import each_row

from marljax.envs.base import best_branch
from marljax.envs.code import parse_asserts
from marljax.envs.grid import (
    GridProblem,
    bfs_distances,
    grid_prompt,
    parse_moves,
    plan_reward,
    run_plan,
    shortest_plan,
)
from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import make_grid_problems, parse_row
from marljax.workflows.at_grpo import AtGrpoConfig, AtGrpoWorkflow
from marljax.workflows.base import Agent, ScriptedGenerator

# ------------------------------------------------------------------ helpers
ROWS = [  # f(x) = x + 1 and f(x) = 2 x on inputs 1..4; the first 3 cases are public
    {
        "task_id": "inc",
        "question": "Write f(x) returning x + 1.",
        "fn_name": "f",
        "inputs": [[1], [2], [3], [4]],
        "outputs": [2, 3, 4, 5],
        "public": 3,
        "solution": "def f(x):\n    return x + 1\n",
    },
    {
        "task_id": "dbl",
        "question": "Write f(x) returning 2 * x.",
        "fn_name": "f",
        "inputs": [[1], [2], [3], [4]],
        "outputs": [2, 4, 6, 8],
        "public": 3,
        "solution": "def f(x):\n    return 2 * x\n",
    },
]
CODES = [
    "def f(x):\n    return x\n",  # inc 0/4, dbl 0/4
    "def f(x):\n    return x + 1 if x < 3 else 0\n",  # inc 2/4, dbl 1/4
    "def f(x):\n    return 2 if x == 1 else 0\n",
]  # inc 1/4, dbl 1/4
TESTS = [
    "assert f(1) == 2\nassert f(2) == 3",
    "assert f(3) == 4\nassert f(1) == 5",
    "assert f(4) == 5\nassert f(3) == 4",
]
# Hand-computed rewards (bonus 0.5). Tester on inc (best code CODES[1] fails f(3), f(4)):
#   T0 valid 2, caught 0 -> 2/2 = 1; T1 valid 1 (f(3)==4), caught 1 -> (1 + .5)/2 = .75; T2 valid 2, caught 2 -> 1.5.
# On dbl (reference 2x): T0 valid 1 (f(1)==2), caught 0 -> .5; T1, T2 valid 0 -> 0.
REWARDS = {
    ("inc", "coder"): [0.0, 0.5, 0.25],
    ("inc", "tester"): [1.0, 0.75, 1.5],
    ("dbl", "coder"): [0.0, 0.25, 0.25],
    ("dbl", "tester"): [0.5, 0.0, 0.0],
}
# (r - mean) / (std_ddof1 + 1e-6), worked out by hand from REWARDS
ADV = {
    ("inc", "coder"): [-1.0, 1.0, 0.0],
    ("inc", "tester"): [-0.218218, -0.872872, 1.091089],
    ("dbl", "coder"): [-1.154701, 0.577350, 0.577350],
    ("dbl", "tester"): [1.154701, -0.577350, -0.577350],
}


def fence(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```"


def code_script(agent, prompt, k, seed):
    return fence(CODES[k] if agent.name == "coder" else TESTS[k])


class Recording(ScriptedGenerator):
    """Also keeps each generate call's requests (one call per turn)."""

    def __init__(self, script, versions=None):
        super().__init__(script, versions)
        self.batches = []

    def generate(self, requests, n, seed):
        self.batches.append(list(requests))
        return super().generate(requests, n, seed)


def code_problems():
    return [parse_row(r, "stdio", f"<test>:{k + 1}") for k, r in enumerate(ROWS)]


def agents(shared: bool):
    return {
        "coder": Agent("coder", "shared" if shared else "pc", "You write code.\n"),
        "tester": Agent("tester", "shared" if shared else "pt", "You write tests.\n"),
    }


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(max_workers=2) as p:
        yield SandboxVerifier(p)


@pytest.fixture(scope="module")
def code_run(pool):
    gen = Recording(code_script, versions={"pc": 3})
    wf = AtGrpoWorkflow("code", num_candidates=3, num_turns=2)
    return wf.rollout(code_problems(), agents(shared=False), gen, pool, seed=7), gen


# ------------------------------------------------------------------ code task
def test_k_candidates_per_agent_per_turn_and_ids(code_run):
    rollout, _ = code_run
    assert len(each_row(rollout)) == 2 * 2 * 2 * 3  # problems x turns x agents x K
    for ep, pid in enumerate(["inc", "dbl"]):
        mine = [s for s in each_row(rollout) if s.ids["episode"] == ep]
        assert {s.ids["problem"] for s in mine} == {pid}
        assert sorted(s.ids["node"] for s in mine) == list(range(12))  # unique within the tree
        for s in mine:
            t, a = s.ids["turn"], ["coder", "tester"].index(s.agent)
            assert s.ids["depth"] == t and s.ids["node"] // 3 == t * 2 + a
            assert s.policy == ("pc" if s.agent == "coder" else "pt")
            assert s.version == (3 if s.agent == "coder" else 0)
        assert all(s.ids["parent"] == -1 for s in mine if s.ids["turn"] == 0)


def test_best_branch_continues_and_parents(code_run):
    rollout, _ = code_run
    # inc: coder best k=1 (0.5), tester best k=2 (1.5); dbl: coder tie .25/.25 -> k=1, tester k=0
    want = {(0, "coder"): 1, (0, "tester"): 3 + 2, (1, "coder"): 1, (1, "tester"): 3 + 0}
    for s in each_row(rollout):
        if s.ids["turn"] == 1:
            assert s.ids["parent"] == want[(s.ids["episode"], s.agent)]
    assert best_branch([0.25, 0.5, 0.5]) == 1 and best_branch([0.0, 0.0]) == 0


def test_rewards_and_group_advantages_hand_computed(code_run):
    rollout, _ = code_run
    for s in each_row(rollout):
        key = (s.ids["problem"], s.agent)
        k = s.ids["node"] % 3
        assert s.reward == pytest.approx(REWARDS[key][k]), (key, s.ids)
        assert s.advantage == pytest.approx(ADV[key][k], abs=1e-5), (key, s.ids)
    m = rollout.metrics
    assert m["agent/coder/reward"] == pytest.approx(
        np.mean(REWARDS[("inc", "coder")] + REWARDS[("dbl", "coder")])
    )
    assert m["agent/tester/pass_rate"] == pytest.approx(2 / 6)
    assert m["at_grpo/turns"] == 2 and m["at_grpo/solved"] == 0


@pytest.mark.parametrize(
    "grouping, pool_size, key",
    [
        ("pooled", 2, lambda s: (s.ids["turn"], s.agent)),  # both problems of the batch together
        ("problem", None, lambda s: s.ids["problem"]),  # turns and agents of a problem together
    ],
)
def test_grouping_option_changes_the_groups(pool, grouping, pool_size, key):
    gen = ScriptedGenerator(code_script)
    wf = AtGrpoWorkflow("code", num_candidates=3, num_turns=2, grouping=grouping, pool_size=pool_size)
    samples = each_row(wf.rollout(code_problems(), agents(shared=False), gen, pool, seed=7))
    groups: dict = {}
    for s in samples:
        groups.setdefault(key(s), []).append(s)
    assert len(groups) == (4 if grouping == "pooled" else 2)
    for members in groups.values():
        r = np.array([s.reward for s in members])
        want = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        np.testing.assert_allclose([s.advantage for s in members], want, atol=1e-5)


def test_grouping_config_checks_pool_size():
    assert AtGrpoConfig().grouping == "problem_turn_agent"
    assert AtGrpoConfig(grouping="pooled", pool_size=4).pool_size == 4
    with pytest.raises(ValueError, match="pool_size"):
        AtGrpoConfig(grouping="pooled")
    with pytest.raises(ValueError, match="pool_size"):
        AtGrpoConfig(pool_size=4)
    with pytest.raises(ValueError):
        AtGrpoConfig(grouping="pooled", pool_size=1)
    with pytest.raises(ValueError):
        AtGrpoConfig(grouping="turn")


def test_feedback_only_from_turn_one(code_run):
    _, gen = code_run
    assert len(gen.batches) == 2
    turn0, turn1 = gen.batches
    for _agent, prompt in turn0:
        assert "Passed" not in prompt and "previous" not in prompt and "tester's tests" not in prompt
    coder_inc = next(p for a, p in turn1 if a.name == "coder" and "x + 1." in p)
    assert "Your previous code" in coder_inc and CODES[1].strip() in coder_inc
    assert "Passed 2 of 3 tests." in coder_inc  # public split only: f(3) fails, the private f(4) is not shown
    assert "Input: 4" not in coder_inc
    assert (
        "The tester's tests on this code: passed 0 of 2." in coder_inc
        and "Failed: assert f(4) == 5" in coder_inc
    )
    tester_inc = next(p for a, p in turn1 if a.name == "tester" and "x + 1." in p)
    assert "Your previous tests" in tester_inc and "assert f(4) == 5\nassert f(3) == 4" in tester_inc
    assert "Your tests on this code: passed 0 of 2." in tester_inc


@pytest.mark.parametrize("shared", [True, False])
def test_one_generate_call_per_policy_per_turn(pool, shared):
    gen = ScriptedGenerator(code_script)
    AtGrpoWorkflow("code", num_candidates=2, num_turns=2).rollout(
        code_problems(), agents(shared), gen, pool, 0
    )
    want = [("shared", 4)] * 2 if shared else [("pc", 2), ("pt", 2)] * 2
    assert gen.calls == want


def test_dr_grpo_centres_without_scaling(pool):
    gen = ScriptedGenerator(code_script)
    r = AtGrpoWorkflow("code", num_candidates=3, num_turns=1, estimator="dr_grpo").rollout(
        code_problems()[:1], {"coder": Agent("coder", "p")} | {"tester": Agent("tester", "p")}, gen, pool, 0
    )
    coder = [s.advantage for s in sorted(each_row(r), key=lambda s: s.ids["node"]) if s.agent == "coder"]
    assert coder == pytest.approx([-0.25, 0.25, 0.0])


def test_evaluate_code_greedy(pool):
    right = ScriptedGenerator(
        lambda a, p, k, s: (
            fence(ROWS[0]["solution"] if "x + 1" in p else ROWS[1]["solution"])
            if a.name == "coder"
            else fence("assert f(1) == 2")
        )
    )
    wf = AtGrpoWorkflow("code", num_candidates=2, num_turns=2)
    assert wf.evaluate(code_problems(), agents(True), right, pool) == {
        "eval/coder/pass_at_1": 1.0,
        "eval/coder/reward": 1.0,
    }
    assert right.calls == [("shared", 4)]  # solved at turn 0: the trees end
    wrong = ScriptedGenerator(code_script)
    out = wf.evaluate(code_problems(), agents(True), wrong, pool)
    assert out["eval/coder/pass_at_1"] == 0.0 and len(wrong.calls) == 2


def test_parse_asserts():
    text = "tests:\n```python\nimport math\nassert f(1) == 2\nx = 3\nassert f(x) == 4, 'msg'\n```"
    assert parse_asserts(text, 8) == ["assert f(1) == 2", "assert f(x) == 4, 'msg'"]
    assert parse_asserts(text, 1) == ["assert f(1) == 2"]
    assert parse_asserts("```python\nassert f(1) == 2\ndef broken(:\nassert g(0)\n```", 8) == [
        "assert f(1) == 2",
        "assert g(0)",
    ]
    assert parse_asserts("no tests", 8) == []


def test_config_checks_agent_names():
    both = {"coder": 1, "tester": 2}
    assert AtGrpoConfig().check_agents(both) == []
    assert AtGrpoConfig(tester=None).check_agents({"coder": 1}) == []
    assert [e[0] for e in AtGrpoConfig().check_agents({"coder": 1})] == [("tester",)]
    assert [e[0] for e in AtGrpoConfig(tester="coder").check_agents(both)] == [("tester",)]
    assert [e[0] for e in AtGrpoConfig(task="plan").check_agents(both)] == [("planner",)]
    assert AtGrpoConfig(task="plan", planner="coder").check_agents(both) == []
    with pytest.raises(ValueError):
        AtGrpoConfig(num_candidates=1)
    wf = AtGrpoWorkflow.from_config(AtGrpoConfig(num_candidates=3, num_turns=4, estimator="dr_grpo"))
    assert (wf.cfg.num_candidates, wf.cfg.num_turns, wf.cfg.estimator, wf.env.roles) == (
        3,
        4,
        "dr_grpo",
        ("coder", "tester"),
    )


# ------------------------------------------------------------------ grid game
# A..      start (0, 0), goal (2, 0); the only path goes right, down the last column, then left:
# ##.      RRDDLL, 6 moves.
# G..
GRID = {"size": 3, "walls": [[1, 0], [1, 1]], "start": [0, 0], "goal": [2, 0]}
GRID_PROBLEM = GridProblem("g", grid_prompt(GRID, (0, 0)), GRID)


def test_bfs_distances_by_hand():
    d = bfs_distances(GRID)
    assert d == {(2, 0): 0, (2, 1): 1, (2, 2): 2, (1, 2): 3, (0, 2): 4, (0, 1): 5, (0, 0): 6}
    assert shortest_plan(GRID) == "RRDDLL" and shortest_plan(GRID, (0, 2)) == "DDLL"


@pytest.mark.parametrize(
    "moves,end,reached,illegal,reward",
    [
        ("RR", (0, 2), False, False, 0.5 * (1 - 4 / 6)),
        ("RRDDLL", (2, 0), True, False, 1.0),
        ("RRDDLLUUU", (2, 0), True, False, 1.0),  # stops at the goal
        ("D", (0, 0), False, True, 0.0),  # first move into a wall
        ("L", (0, 0), False, True, 0.0),  # off the grid
        ("RDR", (0, 1), False, True, 0.5 * (1 - 5 / 6)),  # the wall hit ends the plan: the last R is ignored
        ("RL", (0, 0), False, False, 0.0),  # no progress
        ("", (0, 0), False, False, 0.0),
    ],
)
def test_run_plan_and_reward_by_hand(moves, end, reached, illegal, reward):
    res = run_plan(GRID, (0, 0), moves)
    assert (res.pos, res.reached, res.illegal) == (end, reached, illegal)
    assert plan_reward(GRID, (0, 0), moves) == pytest.approx(reward)
    assert plan_reward(GRID, (0, 1), "LR") == 0.0  # going back then forth: no progress from (0, 1)


def test_parse_moves():
    assert parse_moves("I go right twice.\nMoves: R R, D") == "RRD"
    assert parse_moves("Down, then Right: RRDD.") == "RRDD"
    assert parse_moves("Moves: UL\nMoves: DD") == "DD"
    assert parse_moves("no idea") == ""


def test_make_grid_problems_solvable_and_seeded():
    ps = make_grid_problems(6, seed=3)
    assert [p.fields for p in ps] == [p.fields for p in make_grid_problems(6, seed=3)]
    assert [p.fields for p in ps] != [p.fields for p in make_grid_problems(6, seed=4)]
    for p in ps:
        json.dumps(dict(p.fields))
        f = p.fields
        assert p.schema == "plan" and bfs_distances(f)[tuple(f["start"])] == f["distance"] >= 2
        assert len(f["solution"]) == f["distance"] and plan_reward(f, f["start"], f["solution"]) == 1.0
        assert "A" in p.prompt and "G" in p.prompt


def plan_script(agent, prompt, k, seed):
    if "Moves so far" not in prompt:
        return ["Moves: R", "Moves: RR", "Moves: D"][k]
    return ["Moves: DD", "Moves: DDLL", "Moves: L"][k]


def test_plan_tree_multi_turn():
    gen = Recording(plan_script)
    wf = AtGrpoWorkflow("plan", num_candidates=3, num_turns=3)
    r = wf.rollout([GRID_PROBLEM], {"planner": Agent("planner", "p")}, gen, None, seed=1)
    assert [(s.ids["turn"], s.ids["node"], s.ids["parent"]) for s in each_row(r)] == [
        (0, 0, -1),
        (0, 1, -1),
        (0, 2, -1),
        (1, 3, 1),
        (1, 4, 1),
        (1, 5, 1),
    ]  # solved at turn 1: no turn 2
    assert [s.reward for s in each_row(r)] == pytest.approx([1 / 12, 1 / 6, 0.0, 0.25, 1.0, 0.0])
    turn1 = gen.batches[1][0][1]
    assert "..A" in turn1 and "Moves so far: RR" in turn1 and "4 moves from G" in turn1
    assert r.metrics["at_grpo/turns"] == 2 and r.metrics["at_grpo/solved"] == 1.0
    # turn 0: [1/12, 1/6, 0] -> mean 1/12, std 1/12 -> [0, 1, -1]; turn 1: [.25, 1, 0] -> mean 5/12, std .520416
    assert [s.advantage for s in each_row(r)] == pytest.approx(
        [0, 1, -1, -0.320256, 1.120897, -0.800641], rel=1e-4, abs=1e-6
    )  # eps 1e-6 in std + eps


def test_plan_ties_go_to_the_lowest_index_and_evaluate():
    gen = Recording(lambda a, p, k, s: "Moves: R")
    r = AtGrpoWorkflow("plan", num_candidates=2, num_turns=2).rollout(
        [GRID_PROBLEM], {"planner": Agent("planner", "p")}, gen, None, seed=0
    )
    assert [s.ids["parent"] for s in each_row(r) if s.ids["turn"] == 1] == [0, 0]
    assert all(s.advantage == 0 for s in each_row(r))  # identical candidates: no comparison signal
    wf = AtGrpoWorkflow("plan", num_candidates=2, num_turns=2)
    solve = ScriptedGenerator(lambda a, p, k, s: "Moves: RRDDLL")
    assert (
        wf.evaluate([GRID_PROBLEM], {"planner": Agent("planner", "p")}, solve, None)["eval/planner/success"]
        == 1
    )
    stuck = ScriptedGenerator(lambda a, p, k, s: "Moves: D")
    assert (
        wf.evaluate([GRID_PROBLEM], {"planner": Agent("planner", "p")}, stuck, None)["eval/planner/success"]
        == 0
    )


def test_plan_task_rejects_code_problems():
    with pytest.raises(ValueError, match="schema 'plan'"):
        AtGrpoWorkflow("plan").rollout(
            code_problems(), {"planner": Agent("planner", "p")}, ScriptedGenerator(plan_script), None, 0
        )


def test_coder_alone_gets_public_feedback_only(pool):
    gen = Recording(code_script)
    wf = AtGrpoWorkflow("code", tester=None, num_candidates=3, num_turns=2)
    r = wf.rollout(code_problems()[:1], {"coder": Agent("coder", "p")}, gen, pool, 0)
    assert {s.agent for s in each_row(r)} == {"coder"} and len(each_row(r)) == 6
    prompt = gen.batches[1][0][1]
    assert "Passed 2 of 3 tests." in prompt and "tester" not in prompt


# ------------------------------------------------------------------ real model
class OverrideText:
    """A real generator whose texts are replaced by `code_script`'s: the tokens and log-probs stay the
    policy's, but the rewards (hence the advantages) vary, which a random tiny model cannot ensure."""

    def __init__(self, inner):
        self.inner = inner

    def generate(self, requests, n, seed):
        out = self.inner.generate(requests, n, seed)
        return [
            [dataclasses.replace(g, text=code_script(a, p, k, seed)) for k, g in enumerate(gens)]
            for (a, p), gens in zip(requests, out)
        ]


@pytest.mark.slow
def test_tiny_real_policy_trains_two_steps(pool):
    import jax

    from marljax.train.buffer import ExperienceBuffer
    from marljax.train.config import PolicyConfig, SamplerConfig
    from marljax.train.generation import PolicyGenerator
    from marljax.train.policy import Policy

    cfg = PolicyConfig(
        model={"preset": "tiny-qwen3"}, optimizer={"lr": 1e-3}, buffer={"threshold": 8}, micro_batch_size=8
    )
    policy = Policy("shared", cfg)  # one policy for both roles (role prompts)
    before = jax.tree.map(np.asarray, policy.params)
    buffer = ExperienceBuffer(8)
    # prompts cut to their last 128 tokens: one padded shape for both turns, so one compile each
    gen = OverrideText(
        PolicyGenerator({"shared": policy}, SamplerConfig(max_new_tokens=16), max_prompt_len=128)
    )
    wf = AtGrpoWorkflow("code", num_candidates=2, num_turns=2)
    updates = []
    for step in range(2):
        version = policy.version
        rollout = wf.rollout(code_problems(), agents(shared=True), gen, pool, seed=step)
        assert len(each_row(rollout)) == 16 and all(np.isfinite(v) for v in rollout.metrics.values())
        assert all(len(s.completion_ids) > 0 and s.version == version for s in each_row(rollout))
        buffer.add(rollout.rows)
        while buffer.ready(policy.version):
            updates.append(policy.update(buffer.take(policy.version)[0]))
    assert len(updates) == 4 and all(np.isfinite(u["loss"]) for u in updates), updates
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, policy.params)
    assert all(jax.tree.leaves(changed))
