"""MAGRPO workflow: tree shapes and ids, returns-to-go and sibling advantages by hand, early stopping,
batching, the coop_code level reward on real sandbox runs, evaluation, and a tiny real-model run."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from rows_view import each_row

from marljax.envs import coop_code
from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import parse_row
from marljax.workflows.base import Agent, ScriptedGenerator
from marljax.workflows.magrpo import MagrpoConfig, MagrpoWorkflow

TEMPLATE = "{role}{problem}\n{history}\n{feedback}"
# f(x) = 2x on x = 0..3 (the first two public): pass fractions 1, 1/2, 1/4, 0.
CODE = {
    "good": "def f(x):\n    return 2 * x",
    "half": "def f(x):\n    return x * x",
    "quarter": "def f(x):\n    return x",
    "zero": "def f(x):\n    return -1",
}
EPS = 1e-6


def code_problem(pid: str = "p0"):
    row = {
        "task_id": pid,
        "question": f"Double x ({pid}).",
        "fn_name": "f",
        "inputs": [[0], [1], [2], [3]],
        "outputs": [0, 2, 4, 6],
        "public": 2,
    }
    return parse_row(row, "stdio", f"<{pid}>:1")


def math_problem(pid: str = "m0"):
    return parse_row({"id": pid, "problem": f"What is 1 + 1? ({pid})", "answer": "2"}, "math", f"<{pid}>:1")


def team(helper_policy: str = "ph", main_policy: str = "pm") -> dict[str, Agent]:
    return {
        "helper": Agent("helper", helper_policy, "H: ", TEMPLATE),
        "main": Agent("main", main_policy, "M: ", TEMPLATE),
    }


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```"


def normalised(credits) -> np.ndarray:
    """(c - mean) / (sample std + eps), written out independently of the kernels."""
    c = np.asarray(credits, np.float64)
    if np.all(c == c[0]):
        return np.zeros_like(c)
    return (c - c.mean()) / (np.sqrt(((c - c.mean()) ** 2).sum() / (len(c) - 1)) + EPS)


def parent_main_code(prompt: str) -> str | None:
    """Which CODE the previous turn's main answer was (None at turn 0)."""
    if "### main" not in prompt:
        return None
    prev = prompt.split("### main", 1)[1]
    return next(name for name, code in CODE.items() if code in prev)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(max_workers=2) as p:
        yield SandboxVerifier(p)


def by_node(samples):
    out: dict = {}
    for s in samples:
        out.setdefault((s.ids["episode"], s.ids["node"], s.agent), []).append(s)
    return out


# ------------------------------------------------------------------ options
def test_config_defaults_and_validation():
    cfg = MagrpoConfig()
    assert (cfg.kind, cfg.agents, cfg.joint, cfg.gamma, cfg.task, cfg.num_turns) == (
        "magrpo",
        ["helper", "main"],
        "aligned",
        0.9,
        "coop_code",
        1,
    )
    for bad in (
        {"group_size": 1},
        {"num_turns": 0},
        {"joint": "diagonal"},
        {"gamma": 1.5},
        {"agents": ["a", "a"], "task": "score"},
        {"agents": ["a", "b", "c"]},
        {"bogus": 1},
    ):
        with pytest.raises(ValidationError):
            MagrpoConfig(**bad)
    assert MagrpoConfig(agents=["a", "b", "c"], task="score").agents == ["a", "b", "c"]


def test_check_agents_names_every_unknown_agent_and_flat_templates():
    from marljax.train.config import AgentConfig

    known = {"helper": AgentConfig(policy="p"), "coder": AgentConfig(policy="p")}
    found = MagrpoConfig(agents=["helper", "main"]).check_agents(known)
    assert [(key, value) for key, _, value in found] == [(("agents", 1), "main")]
    assert "unknown agent" in found[0][1]
    flat = MagrpoConfig(agents=["helper", "coder"], num_turns=2).check_agents(known)
    assert [key for key, _, _ in flat] == [("num_turns",), ("num_turns",)]
    good = {n: AgentConfig(policy="p", template="{problem}\n{feedback}") for n in ("helper", "main")}
    assert MagrpoConfig(num_turns=2).check_agents(good) == []


# ----------------------------------------------------------- coop_code task
def test_uses_result_needs_a_call_inside_the_entry_point_whose_value_is_used():
    used = [
        "def f(x):\n    y = aux(x)\n    return y",
        "def f(x):\n    return g(aux(x)) + 1",
        "def f(x):\n    if aux(x):\n        return 1\n    return 0",
    ]
    not_used = [
        "def f(x):\n    aux(x)\n    return 2 * x",
        "y = aux(3)\ndef f(x):\n    return y",
        "def f(x):\n    return self.aux(x)",
        "def f(x):\n    return aux(x",
        "def g(x):\n    return aux(x)",
    ]
    assert all(coop_code.uses_result(c, "f") for c in used)
    assert not any(coop_code.uses_result(c, "f") for c in not_used)
    assert coop_code.uses_result("print(aux(int(input())))", None)  # a stdin program: whole module
    assert coop_code.defines("x = 1\ndef aux(a):\n    return a", "aux")
    assert not coop_code.defines("class A:\n    def aux(self):\n        pass", "aux")
    assert coop_code.defines("class Solution:\n    def f(self):\n        pass", "f", top_level=False)


AUX2 = "def aux(x):\n    return 2 * x"
LEVEL_CASES = [  # (helper code, main code, reward, passed, levels that count)
    (AUX2, "def f(x):\n    return aux(x)", 1.0, True, {"structure", "syntax", "tests", "cooperation"}),
    ("x = 1", CODE["good"], 0.7, True, {"syntax", "tests"}),  # no aux: no structure
    (AUX2, "def f(x):\n    return (", 0.1, False, {"structure"}),  # does not compile
    (AUX2, CODE["zero"], 0.2, False, {"structure", "syntax"}),
    (AUX2, CODE["half"], 0.2 + 0.3, False, {"structure", "syntax", "tests"}),
    (AUX2, CODE["good"], 0.8, True, {"structure", "syntax", "tests"}),  # aux unused
    (
        AUX2,
        "def f(x):\n    aux(x)\n    return 2 * x",
        0.8,
        True,
        {"structure", "syntax", "tests"},
    ),  # discarded
    ("def aux(x):\n    return -1", "def f(x):\n    return aux(x)", 0.2, False, {"structure", "syntax"}),
    (
        AUX2,
        "def aux(x):\n    return 2 * x\ndef f(x):\n    return aux(x)",
        0.8,
        True,
        {"structure", "syntax", "tests"},
    ),  # main brings its own aux
    ("", "", 0.0, False, set()),
]


def test_coop_level_reward_on_hand_written_pairs(pool):
    problems = [code_problem()] * len(LEVEL_CASES)
    scores = coop_code.score_pairs(
        problems,
        [fenced(h) if h else "" for h, *_ in LEVEL_CASES],
        [fenced(m) if m else "" for _, m, *_ in LEVEL_CASES],
        pool,
    )
    for (h, m, reward, passed, counted), s in zip(LEVEL_CASES, scores):
        assert s.reward == pytest.approx(reward), (h, m, s.levels)
        assert s.passed is passed
        assert {k for k, v in s.levels.items() if v > 0} == counted, (h, m, s.levels)
    assert scores[2].result is None and "does not compile" in scores[2].feedback  # never ran
    assert "Passed 1 of 2 tests." in scores[4].feedback  # public tests only
    assert "Main uses the result of `aux`: yes." in scores[0].feedback
    assert "Write a helper function `aux(...)`" in coop_code.helper_prompt(problems[0])
    assert "`f`" in coop_code.main_prompt(problems[0])


# ---------------------------------------------------------------- the tree
def constant_script(agent, prompt, k, seed):
    return "\\boxed{2}" if agent.name == "main" else f"helper {k}"


@pytest.mark.parametrize(
    "joint, nodes_per_turn, joints_per_turn", [("aligned", [1, 2], [2, 4]), ("cross", [1, 4], [4, 16])]
)
def test_tree_shape_and_ids(joint, nodes_per_turn, joints_per_turn):
    wf = MagrpoWorkflow(group_size=2, joint=joint, num_turns=2, task="score")
    problems = [math_problem("m0"), math_problem("m1")]
    gen = ScriptedGenerator(constant_script, versions={"pm": 3})
    tree = wf.grow(problems, list(team().values()), gen, SandboxVerifier(), seed=0, n=2)
    for e in range(2):
        nodes = [s for s in tree.nodes if s.episode == e]
        assert [sum(s.turn == t for s in nodes) for t in range(2)] == nodes_per_turn
        assert [
            sum(tree.joints[j].node.turn == t for s in nodes for j in s.joints) for t in range(2)
        ] == joints_per_turn
    samples = each_row(wf.rollout(problems, team(), gen, SandboxVerifier(), seed=0))
    assert len(samples) == 2 * sum(nodes_per_turn) * 2 * 2  # episodes x nodes x agents x G
    for e, prob in enumerate(problems):
        mine = [s for s in samples if s.ids["episode"] == e]
        assert {s.ids["problem"] for s in mine} == {prob.id}
        assert sorted({s.ids["node"] for s in mine}) == list(range(sum(nodes_per_turn)))
        for s in mine:
            assert s.ids["depth"] == s.ids["turn"]
            assert s.ids["parent"] == (-1 if s.ids["node"] == 0 else 0)
            assert (s.ids["node"] == 0) == (s.ids["turn"] == 0)
    groups = by_node(samples)
    assert all(len(g) == 2 for g in groups.values())  # G siblings per (episode, node, agent)
    assert {s.version for s in samples if s.agent == "main"} == {3}
    assert {s.version for s in samples if s.agent == "helper"} == {0}
    assert all(s.reward == 1.0 and s.advantage == 0.0 for s in samples)  # constant rewards: no signal


def two_turn_script(agent, prompt, k, seed):
    """Main's code at turn 0 by sample index; at turn 1 by the parent's main code and the index."""
    if agent.name == "helper":
        return f"# helper note {k}"
    children = {
        None: ["half", "zero", "quarter"],
        "half": ["good", "quarter", "zero"],
        "zero": ["half", "half", "good"],
        "quarter": ["zero", "zero", "zero"],
    }
    return fenced(CODE[children[parent_main_code(prompt)][k]])


def test_two_turn_returns_and_sibling_advantages_by_hand(pool):
    wf = MagrpoWorkflow(group_size=3, joint="aligned", num_turns=2, gamma=0.9, task="score")
    problems = [code_problem()]
    seen = []

    def recording(agent, prompt, k, seed):
        seen.append((agent.name, prompt))
        return two_turn_script(agent, prompt, k, seed)

    tree = wf.grow(problems, list(team().values()), ScriptedGenerator(recording), pool, seed=1, n=3)
    returns, _ = wf.tree_credit(tree, 2, 3)
    # Turn 0: half 0.5, zero 0, quarter 0.25; children by parent (mean reward of the child node's joints).
    leaf = {0: [1.0, 0.25, 0.0], 1: [0.5, 0.5, 1.0], 2: [0.0, 0.0, 0.0]}
    root = [0.5 + 0.9 * np.mean(leaf[0]), 0.0 + 0.9 * np.mean(leaf[1]), 0.25 + 0.9 * np.mean(leaf[2])]
    expected = root + leaf[0] + leaf[1] + leaf[2]
    np.testing.assert_allclose(returns, expected, atol=1e-6)
    np.testing.assert_allclose(
        [j.reward for j in tree.joints], [0.5, 0.0, 0.25] + leaf[0] + leaf[1] + leaf[2]
    )

    samples = each_row(wf.rollout(problems, team(), ScriptedGenerator(two_turn_script), pool, seed=1))
    groups = by_node(samples)
    want = {0: normalised(root), 1: normalised(leaf[0]), 2: normalised(leaf[1]), 3: normalised(leaf[2])}
    for node, adv_node in want.items():
        for agent in ("helper", "main"):  # aligned: both agents share their joint action's credit
            got = [s.advantage for s in groups[(0, node, agent)]]
            np.testing.assert_allclose(got, adv_node, atol=1e-5)
    assert [s.reward for s in groups[(0, 1, "main")]] == leaf[0]
    assert {s.ids["parent"] for s in samples if s.ids["node"] > 0} == {0}
    # The child node's prompts carry the parent's joint answer and its public-test feedback.
    later = [p for a, p in seen if a == "main" and "### main" in p and "x * x" in p.split("### main")[1]]
    assert len(later) == 3 and all(p.startswith("M: Double x (p0).") for p in later)  # one prompt, G samples
    assert "### helper\n```python\n# helper note 0" in later[0] and "Passed 1 of 2 tests." in later[0]
    assert "Expected output: 2" in later[0]  # the failing public test f(1)


def cross_script(agent, prompt, k, seed):
    helpers = [AUX2, "def helper2(x):\n    return 2 * x", "def aux(x):\n    return x * x"]
    mains = ["def f(x):\n    return aux(x)", CODE["good"], "def f(x):\n    aux(x)\n    return 2 * x"]
    return fenced((helpers if agent.name == "helper" else mains)[k])


def test_cross_mode_credits_each_agent_by_its_own_choice(pool):
    wf = MagrpoWorkflow(group_size=3, joint="cross", num_turns=1, task="coop_code")
    problems = [code_problem()]
    # Joint reward table [helper choice, main choice], from the levels of the coop_code task.
    table = np.array([[1.0, 0.8, 0.8], [0.1, 0.7, 0.1], [0.7, 0.8, 0.8]])
    tree = wf.grow(problems, list(team().values()), ScriptedGenerator(cross_script), pool, seed=0, n=3)
    assert [j.combo for j in tree.joints] == [(h, m) for h in range(3) for m in range(3)]
    np.testing.assert_allclose([j.reward for j in tree.joints], table.reshape(-1), atol=1e-9)
    samples = each_row(wf.rollout(problems, team(), ScriptedGenerator(cross_script), pool, seed=0))
    groups = by_node(samples)
    np.testing.assert_allclose(
        [s.advantage for s in groups[(0, 0, "helper")]], normalised(table.sum(1)), atol=1e-5
    )
    np.testing.assert_allclose(
        [s.advantage for s in groups[(0, 0, "main")]], normalised(table.sum(0)), atol=1e-5
    )
    np.testing.assert_allclose([s.reward for s in groups[(0, 0, "helper")]], table.mean(1), atol=1e-6)


def scripted_children(children):
    """Main answers by the previous turn's main answer (None at turn 0); the helper adds nothing."""

    def script(agent, prompt, k, seed):
        return "# helper" if agent.name == "helper" else fenced(CODE[children[parent_main_code(prompt)][k]])

    return script


def test_a_perfect_answer_is_never_credited_below_a_sibling_fixed_next_turn(pool):
    # Stopping each joint action on its own gave the perfect answer return 1.0 (advantage -0.71)
    # and its half-right sibling 0.5 + 0.9 * 1.0 = 1.4 (+0.71). The node stops as a whole instead.
    wf = MagrpoWorkflow(group_size=2, num_turns=2, gamma=0.9, early_stop_reward=1.0, task="score")
    gen = ScriptedGenerator(
        scripted_children({None: ["good", "half"], "good": ["good"] * 2, "half": ["good"] * 2})
    )
    tree = wf.grow([code_problem()], list(team().values()), gen, pool, seed=0, n=2)
    assert [(s.id, s.parent, s.turn, s.via) for s in tree.nodes] == [
        (0, -1, 0, -1),
        (1, 0, 1, 0),
        (2, 0, 1, 1),
    ]
    returns, adv = wf.tree_credit(tree, 2, 2)
    np.testing.assert_allclose(returns, [1.0 + 0.9, 0.5 + 0.9, 1.0, 1.0, 1.0, 1.0], atol=1e-6)
    assert adv[0, 1] > 0 > adv[1, 1]  # main's perfect answer above its half-right sibling
    rollout = wf.rollout([code_problem()], team(), gen, pool, seed=0)
    main_root = [s for s in each_row(rollout) if s.agent == "main" and s.ids["node"] == 0]
    assert main_root[0].advantage > 0 > main_root[1].advantage
    assert rollout.metrics["tree/early_stop_rate"] == 0.0


def test_a_node_whose_mean_reward_reaches_the_threshold_stops_as_a_whole(pool):
    wf = MagrpoWorkflow(group_size=2, num_turns=2, gamma=0.9, early_stop_reward=0.75, task="score")
    problems = [code_problem("p0"), code_problem("p1")]

    def script(agent, prompt, k, seed):  # p0: good + half (mean 0.75: stops); p1: half + zero (goes on)
        if agent.name == "helper":
            return "# helper"
        if parent_main_code(prompt) is not None:
            return fenced(CODE["good"])
        return fenced(CODE[(["good", "half"] if "(p0)" in prompt else ["half", "zero"])[k]])

    tree = wf.grow(problems, list(team().values()), ScriptedGenerator(script), pool, seed=0, n=2)
    assert [(s.episode, s.turn) for s in tree.nodes] == [(0, 0), (1, 0), (1, 1), (1, 1)]
    returns, _ = wf.tree_credit(tree, 2, 2)
    np.testing.assert_allclose(
        returns[:4], [1.0, 0.5, 0.5 + 0.9, 0.0 + 0.9], atol=1e-6
    )  # p0 leaves, p1 roots
    rollout = wf.rollout(problems, team(), ScriptedGenerator(script), pool, seed=0)
    assert rollout.metrics["tree/early_stop_rate"] == 0.5  # p0's root stopped, p1's did not
    assert rollout.metrics["tree/nodes"] == 2 and rollout.metrics["tree/joint_actions"] == 4


@pytest.mark.parametrize(
    "policies, expected",
    [
        (("ph", "pm"), [("ph", 1), ("pm", 1), ("ph", 3), ("pm", 3)]),
        (("shared", "shared"), [("shared", 2), ("shared", 6)]),
    ],
)
def test_one_generate_call_per_policy_per_turn(pool, policies, expected):
    class Counting(ScriptedGenerator):
        n_calls = 0

        def generate(self, requests, n, seed):
            self.n_calls += 1
            return super().generate(requests, n, seed)

    gen = Counting(two_turn_script)
    wf = MagrpoWorkflow(group_size=3, num_turns=2, task="score")
    rollout = wf.rollout([code_problem()], team(*policies), gen, pool, seed=0)
    assert gen.n_calls == 2 and gen.calls == expected
    assert {s.policy for s in each_row(rollout)} == set(policies)
    for key in (
        "agent/helper/adv_std",
        "agent/main/reward",
        "team/reward",
        "team/return",
        "team/reward_turn1",
    ):
        assert np.isfinite(rollout.metrics[key])


def test_evaluate_runs_one_greedy_joint_answer_per_turn(pool):
    def script(agent, prompt, k, seed):
        assert k == 0
        if agent.name == "helper":
            return fenced(AUX2)
        if "(p1)" in prompt:  # wrong at first, right (without aux) once it has feedback
            return fenced(CODE["good"] if "### main" in prompt else CODE["zero"])
        return fenced("def f(x):\n    return aux(x)")

    gen = ScriptedGenerator(script)
    wf = MagrpoWorkflow(group_size=2, num_turns=2, early_stop_reward=1.0, task="coop_code")
    out = wf.evaluate([code_problem("p0"), code_problem("p1")], team(), gen, pool)
    assert out == pytest.approx({"eval/main/pass_at_1": 1.0, "eval/team/reward": 0.9, "eval/team/turns": 1.5})
    assert gen.calls == [("ph", 2), ("pm", 2), ("ph", 1), ("pm", 1)]


# -------------------------------------------------------------- real model
class RelabelledGenerator:
    """Real policies' tokens and log-probs with scripted text, so the rewards (and so the
    advantages) are known to vary; the update then trains on the model's own tokens."""

    def __init__(self, inner, script):
        self.inner, self.script = inner, script

    def generate(self, requests, n, seed):
        import dataclasses

        out = self.inner.generate(requests, n, seed)
        return [
            [dataclasses.replace(g, text=self.script(a, p, k, seed)) for k, g in enumerate(gs)]
            for (a, p), gs in zip(requests, out)
        ]


@pytest.mark.slow
def test_tiny_real_policy_trains_on_magrpo_samples(pool):
    """Both agents on one shared tiny model (the reference code's default, and one compile
    instead of two): 2 steps of rollout -> buffer -> update."""
    import jax

    from marljax.train.buffer import ExperienceBuffer
    from marljax.train.config import PolicyConfig, SamplerConfig
    from marljax.train.generation import PolicyGenerator
    from marljax.train.policy import Policy

    cfg = PolicyConfig(
        model={"preset": "tiny-qwen3"}, optimizer={"lr": 1e-3}, buffer={"threshold": 8}, micro_batch_size=8
    )
    policy = Policy("team", cfg)
    before = jax.tree.map(np.array, policy.params)
    gen = RelabelledGenerator(
        PolicyGenerator({"team": policy}, SamplerConfig(max_new_tokens=16), 128), cross_script
    )
    buffer = ExperienceBuffer(cfg.buffer.threshold)
    wf = MagrpoWorkflow(group_size=2, num_turns=1, task="coop_code")
    updates = []
    for step in range(2):
        rollout = wf.rollout(
            [code_problem("p0"), code_problem("p1")], team("team", "team"), gen, pool, seed=step
        )
        assert all(np.isfinite(v) for v in rollout.metrics.values())
        assert rollout.metrics["agent/main/adv_std"] > 0  # (aux used, 1.0) vs (alone without aux, 0.7)
        assert {s.version for s in each_row(rollout)} == {step}
        buffer.add(rollout.rows)
        while buffer.ready(policy.version):
            updates.append(policy.update(buffer.take(policy.version)[0]))
    assert len(updates) == 2 and all(np.isfinite(v) for u in updates for v in u.values())
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, policy.params)
    assert any(jax.tree.leaves(changed))
