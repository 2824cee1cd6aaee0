"""MARS2 tree-search workflow and MARS2-T+ (arXiv 2602.07848): structural tests with scripted agents."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from rows_view import each_row

from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import parse_row, synthetic_rows
from marljax.workflows.base import Agent, ScriptedGenerator
from marljax.workflows.mars2 import Mars2Config, Mars2Workflow, refine_prompt, search_eval
from marljax.workflows.mars2_search import (
    CONT,
    GEN,
    Beta,
    Node,
    RewardAverage,
    Tree,
    depth_gamma,
    select_final,
)

WRONG = "```python\ndef f(x):\n    return -12345\n```"
REFINE_MARK = "Previous attempt:"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(max_workers=2) as p:
        yield SandboxVerifier(p)


def make_problems(n, seed=0):
    return [
        parse_row(r, "stdio", f"<test>:{k + 1}")
        for k, r in enumerate(synthetic_rows(n, seed=seed, difficulty=1))
    ]


def fenced(code):
    return f"```python\n{code}```"


def problem_of(problems, prompt):
    return next(p for p in problems if p.prompt in prompt)


def overfit_code(p):
    """Passes the public tests by table lookup, fails the private ones."""
    f = p.fields
    table = {a[0]: o for a, o in zip(f["inputs"][: f["public"]], f["outputs"][: f["public"]])}
    return f"def f(x):\n    return {table!r}.get(x, -12345)\n"


def miss_one_public_code(p):
    """The reference solution except on the first public input: public 3/4, private all passed."""
    x0 = p.fields["inputs"][0][0]
    assert [x0] not in p.fields["inputs"][p.fields["public"] :]  # x0 is not also a private input
    body = p.fields["solution"].split("\n", 1)[1]
    return f"def f(x):\n    if x == {x0}:\n        return -12345\n{body}"


def ref_advantages(rewards):
    """(r - mean) / (sample std + 1e-6), 0 for a constant or single-node tree: plain Python."""
    if len(rewards) < 2 or len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    m, s = statistics.mean(rewards), statistics.stdev(rewards)
    return [(r - m) / (s + 1e-6) for r in rewards]


class CountingGenerator(ScriptedGenerator):
    """Also counts `generate` invocations (rounds) and keeps every (agent, prompt) request."""

    def __init__(self, script, versions=None):
        super().__init__(script, versions)
        self.rounds, self.requests = [], []

    def generate(self, requests, n, seed):
        self.requests += [(a.name, q) for a, q in requests]
        before = len(self.calls)
        out = super().generate(requests, n, seed)
        self.rounds.append(self.calls[before:])
        return out


# ------------------------------------------------------------------ the search itself (pure)
def test_posterior_counts_after_known_rewards():
    t = Tree(["a", "b"], max_nodes=10)
    for kind, agent, r in [(GEN, "a", 0.25), (GEN, "a", 1.0), (CONT, "a", 0.5), (GEN, "b", 0.0)]:
        node = Node(len(t.nodes), agent, kind, -1 if kind == GEN else 0, 0 if kind == GEN else 1)
        t.nodes.append(node)
        t.record(node, r, r == 1.0)
    assert (t.posteriors[GEN]["a"].a, t.posteriors[GEN]["a"].b) == (0.5 + 0.25 + 1.0, 0.5 + 0.75 + 0.0)
    assert (t.posteriors[CONT]["a"].a, t.posteriors[CONT]["a"].b) == (1.0, 1.0)
    assert (t.posteriors[GEN]["b"].a, t.posteriors[GEN]["b"].b) == (0.5, 1.5)
    assert (t.posteriors[CONT]["b"].a, t.posteriors[CONT]["b"].b) == (0.5, 0.5)
    with pytest.raises(ValueError, match="already scored"):
        t.record(t.nodes[0], 0.0, False)


def test_reward_average_prior_and_state_roundtrip():
    avg = RewardAverage()
    for r in (1.0, 0.5, 0.0, 0.5):
        avg.add("a", r)
    assert avg.mean("a") == 0.5 and avg.mean("new") == 0.5
    avg.add("b", 1.0)
    assert avg.prior("b", 4.0) == (4.0, 1e-3)  # mean 1: b0 floored
    again = RewardAverage()
    again.load_state_dict(json.loads(json.dumps(avg.state_dict())))
    assert again.state_dict() == avg.state_dict() and again.prior("a", 2.0) == (1.0, 1.0)
    t = Tree(["a", "b"], 4, priors={"a": again.prior("a", 2.0), "b": (3.0, 0.25)})
    assert t.posteriors[GEN]["b"] == Beta(3.0, 0.25) and t.posteriors[CONT]["a"] == Beta(1.0, 1.0)


def test_depth_weights():
    g = depth_gamma()
    assert [round(g(d), 10) for d in (0, 1, 2, 9, 10, 30)] == [0.98, 0.93, 0.88, 0.53, 0.5, 0.5]
    assert depth_gamma([0.9, 0.7])(0) == 0.9 and depth_gamma([0.9, 0.7])(5) == 0.7
    assert depth_gamma({"start": 0.9, "step": 0.1, "floor": 0.6})(2) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        depth_gamma([1.5])
    t = Tree(["a"], 10)
    assert t.weight(0) == 1.0  # c_0 = 0
    for i, d in enumerate([0, 0, 0, 1]):
        t.nodes.append(Node(i, "a", GEN if d == 0 else CONT, -1 if d == 0 else 0, d))
    assert t.weight(0) == pytest.approx(0.98**3) and t.weight(1) == pytest.approx(0.93) and t.weight(2) == 1.0


def scored_tree(priors=None):
    t = Tree(["a", "b"], 10, priors=priors)
    t.nodes.append(Node(0, "a", GEN, -1, 0))
    t.record(t.nodes[0], 0.25, False)
    return t


@pytest.mark.parametrize("seed", range(5))
def test_choice_follows_extreme_posteriors(seed):
    rng = np.random.default_rng(seed)
    t = scored_tree()
    t.posteriors[GEN]["b"] = Beta(100, 1)
    for k, p in [("a", GEN), ("a", CONT), ("b", CONT)]:
        t.posteriors[p][k] = Beta(1, 100)
    assert t.choose(rng) == (GEN, "b", -1)
    t.posteriors[GEN]["b"], t.posteriors[CONT]["a"] = Beta(1, 100), Beta(100, 1)
    assert t.choose(rng) == (CONT, "a", 0)


def test_choice_matches_the_documented_rule_draw_by_draw():
    """Re-derive `choose` from the module docstring with the same seeded draws."""
    t = Tree(["a", "b"], 10)
    for i, (kind, agent, parent, depth, r, solved) in enumerate(
        [(GEN, "a", -1, 0, 0.5, False), (GEN, "b", -1, 0, 1.0, True), (CONT, "b", 0, 1, 0.0, False)]
    ):
        t.nodes.append(Node(i, agent, kind, parent, depth))
        t.record(t.nodes[-1], r, solved)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        s0 = rng.beta(1.0, 1.0) * 0.93**1  # node 0 (r .5): child at depth 1, one node there
        s2 = rng.beta(0.5, 1.5) * 1.0  # node 2 (r 0): child at depth 2, none there; node 1 is solved
        target = (0, 1) if s0 >= s2 else (2, 2)
        w_gen, w_cont = 0.98**2, 0.93 ** (1 if target[1] == 1 else 0)
        arms = [
            (rng.beta(1.0, 1.0) * w_gen, (GEN, "a", -1)),
            (rng.beta(0.5, 0.5) * w_cont, (CONT, "a", target[0])),
            (rng.beta(1.5, 0.5) * w_gen, (GEN, "b", -1)),
            (rng.beta(0.5, 1.5) * w_cont, (CONT, "b", target[0])),
        ]
        assert t.choose(np.random.default_rng(seed)) == max(arms, key=lambda x: x[0])[1]


def test_select_final_by_score_ties_to_earliest_or_latest():
    nodes = [Node(i, "a", GEN, -1, 0, reward=r) for i, r in enumerate([0.5, 1.0, 0.25, 1.0])]
    assert select_final(nodes).index == 1
    assert select_final(nodes, scores=[3.0, 0.0, 3.0, 1.0]).index == 0
    assert select_final(nodes, ties="latest").index == 3
    assert select_final(nodes, scores=[3.0, 0.0, 3.0, 1.0], ties="latest").index == 2


# ------------------------------------------------------------------ the workflow with scripted agents
def team(heterogeneous=True, names=("alpha", "beta")):
    return {n: Agent(n, f"pol_{n}" if heterogeneous else "shared") for n in names}


def test_feedback_only_in_refinement_prompts(pool):
    problems = make_problems(2)
    gen = CountingGenerator(lambda a, q, k, s: WRONG)
    wf = Mars2Workflow(max_nodes=6, expansions_per_round=2)
    out = wf.rollout(problems, team(), gen, pool, seed=3)
    refine = [q for _, q in gen.requests if REFINE_MARK in q]
    fresh = [q for _, q in gen.requests if REFINE_MARK not in q]
    assert refine and fresh and len(gen.requests) == 12
    assert all(q in {p.prompt for p in problems} for q in fresh)  # GEN prompt: the problem only
    assert all(
        "Feedback on the public tests" in q and "Wrong answer." in q and "return -12345" in q for q in refine
    )
    assert not any("Feedback" in q or "Wrong answer" in q for q in fresh)
    assert {s.ids["depth"] > 0 for s in each_row(out)} == {True, False}
    # without feedback the refinement prompt still shows the previous program, but no feedback
    gen = CountingGenerator(lambda a, q, k, s: WRONG)
    Mars2Workflow(max_nodes=6, use_feedback=False).rollout(problems, team(), gen, pool, seed=3)
    refine = [q for _, q in gen.requests if REFINE_MARK in q]
    assert refine and not any("Feedback" in q or "Wrong answer" in q for q in refine)


def test_refine_prompt_uses_template_slots():
    p = make_problems(1)[0]
    plain = refine_prompt(Agent("a", "p", "ROLE: "), p, "CODE", "FB")
    assert plain.startswith("ROLE: " + p.prompt) and "CODE" in plain and "FB" in plain
    slotted = refine_prompt(
        Agent("a", "p", "", "{problem}\n<H>{history}</H><F>{feedback}</F>"), p, "CODE", "FB"
    )
    assert (
        slotted.count("CODE") == 1
        and slotted.count("FB") == 1
        and "<F>Feedback on the public tests:\nFB</F>" in slotted
    )


def test_refine_prompt_feedback_right_after_the_problem_is_its_own_paragraph():
    # the shipped configs' "{role}{problem}{feedback}": the problem part ends with the refine note
    p = make_problems(1)[0]
    prompt = refine_prompt(Agent("a", "p", "", "{problem}{feedback}"), p, "CODE", "FB")
    assert "Reply with the complete program.\n\nFeedback on the public tests:\nFB" in prompt, prompt


def test_max_nodes_ids_and_one_group_per_tree(pool):
    """alpha writes the reference solution (reward 1), beta a wrong program (0); no early stop."""
    problems = make_problems(3)

    def script(agent, prompt, k, seed):
        return fenced(problem_of(problems, prompt).fields["solution"]) if agent.name == "alpha" else WRONG

    wf = Mars2Workflow(max_nodes=7, expansions_per_round=3, stop_on_solve=False)
    gen = CountingGenerator(script, versions={"pol_alpha": 3})
    agents = team()
    out = wf.rollout(problems, agents, gen, pool, seed=11)
    assert len(gen.rounds) == 3 and out.metrics["mars2/rounds"] == 3  # 3 + 3 + 1 expansions per tree
    by_tree = {}
    for s in each_row(out):
        by_tree.setdefault(s.ids["episode"], []).append(s)
    assert sorted(by_tree) == [0, 1, 2]
    for i, ss in by_tree.items():
        assert (
            [s.ids["node"] for s in ss] == list(range(7)) == [s.ids["turn"] for s in ss]
        )  # max_nodes exactly
        assert all(s.ids["problem"] == problems[i].id for s in ss)
        for s in ss:
            assert s.policy == agents[s.agent].policy and s.version == (3 if s.agent == "alpha" else 0)
            assert s.reward == (1.0 if s.agent == "alpha" else 0.0)
            parent = s.ids["parent"]
            assert (parent == -1) == (s.ids["depth"] == 0)
            if parent >= 0:
                assert parent < s.ids["node"] and s.ids["depth"] == ss[parent].ids["depth"] + 1
                assert ss[parent].reward < 1.0  # only failed nodes are refined
        np.testing.assert_allclose(
            [s.advantage for s in ss], ref_advantages([s.reward for s in ss]), atol=1e-5
        )
    # the reference itself, by hand: rewards [1, 0, 0] -> mean 1/3, sample std sqrt(1/3)
    assert ref_advantages([1.0, 0.0, 0.0]) == pytest.approx([1.1547, -0.57735, -0.57735], abs=1e-4)
    for name in agents:
        assert math.isfinite(out.metrics[f"agent/{name}/nodes"])
    assert out.metrics["mars2/nodes_per_tree"] == 7 and out.metrics["mars2/solved"] == float(
        np.mean([any(s.reward == 1 for s in ss) for ss in by_tree.values()])
    )


def test_agent_normalization_groups_each_agents_nodes_of_a_tree(pool):
    """normalization=agent (Dr. MAS inside MARS2 trees): alpha is right every other time, beta never;
    each agent's nodes of a tree are normalised by their own statistics, so beta's are not pushed down."""
    problems = make_problems(3)
    calls = itertools.count()

    def script(agent, prompt, k, seed):
        if agent.name == "alpha" and next(calls) % 2:
            return fenced(problem_of(problems, prompt).fields["solution"])
        return WRONG

    wf = Mars2Workflow.from_config(
        Mars2Config(max_nodes=7, expansions_per_round=3, stop_on_solve=False, normalization="agent")
    )
    out = wf.rollout(problems, team(), CountingGenerator(script), pool, seed=11)
    groups = {}
    for s in each_row(out):
        groups.setdefault((s.ids["episode"], s.agent), []).append(s)
    assert {agent for _, agent in groups} == {"alpha", "beta"}
    for (_, agent), ss in groups.items():
        np.testing.assert_allclose(
            [s.advantage for s in ss], ref_advantages([s.reward for s in ss]), atol=1e-5
        )
        assert agent == "alpha" or all(s.reward == 0 and s.advantage == 0 for s in ss)
    assert any(s.advantage > 0 for s in each_row(out)) and any(s.advantage < 0 for s in each_row(out))
    with pytest.raises(ValueError, match="normalization"):
        Mars2Workflow(normalization="team")


def test_kind_normalization_groups_fresh_solutions_apart_from_refinements(pool):
    """normalization=kind: a tree's fresh solutions (parent -1) and its refinements are two groups;
    fresh solutions are right every other time, refinements always, so within the refinements'
    group there is nothing to credit, while one group per tree would push them up."""
    problems = make_problems(3)
    calls = itertools.count()

    def script(agent, prompt, k, seed):
        if REFINE_MARK in prompt or next(calls) % 2:
            return fenced(problem_of(problems, prompt).fields["solution"])
        return WRONG

    config = dict(max_nodes=7, expansions_per_round=3, stop_on_solve=False)
    wf = Mars2Workflow.from_config(Mars2Config(normalization="kind", **config))
    out = wf.rollout(problems, team(), CountingGenerator(script), pool, seed=11)
    groups = {}
    for s in each_row(out):
        groups.setdefault((s.ids["episode"], s.ids["parent"] >= 0), []).append(s)
    assert {refined for _, refined in groups} == {False, True}
    for (_, refined), ss in groups.items():
        np.testing.assert_allclose(
            [s.advantage for s in ss], ref_advantages([s.reward for s in ss]), atol=1e-5
        )
        assert not refined or all(s.reward == 1 and s.advantage == 0 for s in ss)
    tree = Mars2Workflow.from_config(Mars2Config(normalization="tree", **config))
    calls = itertools.count()
    out = tree.rollout(problems, team(), CountingGenerator(script), pool, seed=11)
    assert all(s.advantage > 0 for s in each_row(out) if s.ids["parent"] >= 0)


def test_stop_on_solve(pool):
    problems = make_problems(2)
    gen = CountingGenerator(lambda a, q, k, s: fenced(problem_of(problems, q).fields["solution"]))
    out = Mars2Workflow(max_nodes=8, expansions_per_round=2).rollout(problems, team(), gen, pool, seed=0)
    assert len(each_row(out)) == 4 and len(gen.rounds) == 1  # every first-round node solves its tree
    assert all(s.advantage == 0.0 for s in each_row(out))  # constant rewards in each tree


@pytest.mark.parametrize("heterogeneous", [True, False])
def test_one_generate_call_per_policy_per_round(pool, heterogeneous):
    problems = make_problems(3)
    gen = CountingGenerator(lambda a, q, k, s: WRONG)
    out = Mars2Workflow(max_nodes=4, expansions_per_round=2).rollout(
        problems, team(heterogeneous), gen, pool, 5
    )
    assert len(gen.rounds) == 2 and len(each_row(out)) == 12
    for calls in gen.rounds:
        policies = [p for p, _ in calls]
        assert len(policies) == len(set(policies))  # one batch per policy
        assert sum(n for _, n in calls) == 6  # 3 trees x 2 expansions, all in this one call
        if not heterogeneous:
            assert calls == [("shared", 6)]


def test_reward_average_state_is_kept_and_used(pool):
    problems = make_problems(2)
    wf = Mars2Workflow(
        ["beta", "alpha"], max_nodes=3, prior="reward_average", prior_strength=2.0, stop_on_solve=False
    )
    out = wf.rollout(problems, team(), CountingGenerator(lambda a, q, k, s: WRONG), pool, 1)
    state = json.loads(json.dumps(wf.state_dict()))
    counts = state["reward_average"]["count"]
    assert sum(counts.values()) == 6 and all(v == 0.0 for v in state["reward_average"]["total"].values())
    fresh = Mars2Workflow(prior="reward_average", prior_strength=2.0)
    fresh.load_state_dict(state)
    agents = team()
    priors = fresh.priors([agents["alpha"], agents["beta"]])
    for name in agents:
        assert priors[name] == ((1e-3, 2.0) if counts.get(name) else (1.0, 1.0))
    assert out.metrics["agent/alpha/nodes"] + out.metrics["agent/beta/nodes"] == 3


# ------------------------------------------------------------------ MARS2-T+ and evaluate
def tplus_script(problems):
    """Problem 0: a fresh solution misses one public test but passes every private one; a
    refinement overfits the public tests. Problem 1: the reference solution."""

    def script(agent, prompt, k, seed):
        p = problem_of(problems, prompt)
        if p is problems[1]:
            return fenced(p.fields["solution"])
        return fenced(overfit_code(p) if REFINE_MARK in prompt else miss_one_public_code(p))

    return script


def test_tplus_picks_by_public_score_and_scores_on_private(pool):
    problems = make_problems(2, seed=0)
    agents = [Agent("solo", "p")]
    gen = CountingGenerator(tplus_script(problems))
    out = search_eval(problems, agents, gen, pool, max_nodes=8, seed=0)
    # problem 0: the overfit refinement has public score 1 > 3/4, so it is chosen and fails the
    # private tests; the fresh solution passes them (oracle). Problem 1 is solved at once.
    assert any(REFINE_MARK in q and problems[0].prompt in q for _, q in gen.requests)
    assert out["eval/search/pass_at_1"] == 0.5 and out["eval/search/oracle"] == 1.0
    assert out["eval/search/solo/chosen"] == 1.0 and out["eval/search/solo/nodes"] == out["eval/search/nodes"]
    # every fresh solution passes the private tests, the one refinement (problem 0's overfit) does not
    assert out["eval/search/gen_success"] == 1.0 and out["eval/search/cont_success"] == 0.0
    assert out["eval/search/gen_nodes"] + out["eval/search/cont_nodes"] == out["eval/search/nodes"]
    assert out["eval/search/cont_nodes"] == 0.5  # one refinement over two trees
    # a reward model that prefers the first node of each tree picks the fresh solutions

    def first(problem, texts, reports):
        return [1.0] + [0.0] * (len(texts) - 1)

    again = search_eval(
        problems, agents, CountingGenerator(tplus_script(problems)), pool, max_nodes=8, reward_model=first
    )
    assert again["eval/search/pass_at_1"] == 1.0


def test_tplus_feedback_option(pool):
    """use_feedback=False: refinement prompts carry the previous program but no public-test feedback."""
    problems = make_problems(2, seed=0)
    for use_feedback in (True, False):
        gen = CountingGenerator(tplus_script(problems))
        search_eval(problems, [Agent("solo", "p")], gen, pool, max_nodes=4, seed=0, use_feedback=use_feedback)
        refines = [q for _, q in gen.requests if REFINE_MARK in q]
        assert refines and all(("Feedback on the public tests" in q) == use_feedback for q in refines)


def test_evaluate_greedy_per_agent_and_search(pool):
    problems = make_problems(2, seed=0)
    agents = team(names=("alpha", "beta"))

    def script(agent, prompt, k, seed):
        return tplus_script(problems)(agent, prompt, k, seed) if agent.name == "alpha" else WRONG

    gen = CountingGenerator(script)
    out = Mars2Workflow(max_nodes=6).evaluate(problems, agents, gen, pool)
    assert len(gen.rounds) == 1 and sorted(gen.rounds[0]) == [("pol_alpha", 2), ("pol_beta", 2)]
    assert out == {
        "eval/alpha/pass_at_1": 0.5,
        "eval/alpha/reward": pytest.approx((11 / 12 + 1) / 2),
        "eval/beta/pass_at_1": 0.0,
        "eval/beta/reward": 0.0,
    }
    wf = Mars2Workflow(max_nodes=6, eval_search=True, select="reward_model")
    with pytest.raises(ValueError, match="reward_model"):
        wf.evaluate(problems, agents, CountingGenerator(script), pool)
    wf.reward_model = lambda problem, texts, reports: [0.0] * len(texts)
    out = wf.evaluate(problems, agents, CountingGenerator(script), pool)
    assert {"eval/search/pass_at_1", "eval/search/oracle", "eval/search/alpha/nodes"} <= set(out)
    assert 0.0 <= out["eval/search/pass_at_1"] <= out["eval/search/oracle"] <= 1.0
    assert out["eval/search/alpha/nodes"] + out["eval/search/beta/nodes"] == out["eval/search/nodes"]


def test_eval_search_samples_with_the_training_generator_unless_told_otherwise(pool):
    # evaluation's generator is greedy by default, under which every fresh node of one agent would be
    # the same program: the search takes the training sampling's generator where the trainer gives it
    problems, agents = make_problems(2, seed=0), team(names=("alpha", "beta"))

    def script(agent, prompt, k, seed):
        return WRONG  # nothing passes: every tree spends its whole budget

    for option, searcher in (("train", "training"), ("eval", "evaluation")):
        gens = {"evaluation": CountingGenerator(script), "training": CountingGenerator(script)}
        wf = Mars2Workflow(max_nodes=4, eval_search=True, eval_search_sampling=option)
        out = wf.evaluate(problems, agents, gens["evaluation"], pool, train_generator=gens["training"])
        assert out["eval/search/nodes"] == 4.0
        single_shot = 2 * len(problems)  # one answer per agent and problem
        searched = 4 * len(problems)
        expected = {"evaluation": single_shot, "training": 0}
        expected[searcher] += searched
        assert {k: len(g.requests) for k, g in gens.items()} == expected, option
    # called without a training generator (outside a trainer), the search uses evaluation's
    alone = CountingGenerator(script)
    Mars2Workflow(max_nodes=4, eval_search=True).evaluate(problems, agents, alone, pool)
    assert len(alone.requests) == 2 * len(problems) + 4 * len(problems)


# ------------------------------------------------------------------ options
def test_config_options_and_agent_checks():
    cfg = Mars2Config(agents=["alpha", "beta"], max_nodes=5, depth_gamma=[0.9, 0.8], prior="reward_average")
    wf = Mars2Workflow.from_config(cfg)
    assert wf.cfg.max_nodes == 5 and wf.cfg.depth_gamma == [0.9, 0.8] and wf.cfg.prior == "reward_average"
    assert Mars2Workflow.from_config(Mars2Config()).cfg.depth_gamma.model_dump() == {
        "start": 0.98,
        "step": 0.05,
        "floor": 0.5,
    }
    for bad in (
        {"max_nodes": 1},
        {"expansions_per_round": 0},
        {"prior": "flat"},
        {"depth_gamma": {"start": 2}},
        {"unknown": 1},
        {"max_nodes": True},
    ):
        with pytest.raises(ValueError):
            Mars2Config(**bad)
    with pytest.raises(ValueError):
        Mars2Workflow(depth_gamma=[0.0])
    found = Mars2Config(agents=["alpha", "gamma", "alpha"]).check_agents({"alpha": 1, "beta": 2})
    assert [(k, v) for k, _, v in found] == [(("agents", 1), "gamma"), (("agents", 2), "alpha")]
    assert Mars2Config().check_agents({"alpha": 1}) == []


# ------------------------------------------------------------------ a tiny real model
@pytest.mark.slow
def test_two_steps_with_tiny_real_policy(pool):
    import jax

    from marljax.train.buffer import ExperienceBuffer
    from marljax.train.config import PolicyConfig, SamplerConfig
    from marljax.train.generation import PolicyGenerator
    from marljax.train.policy import Policy

    # math rows whose answer is 7 (a random tiny model sometimes ends with a 7); the entropy
    # bonus makes every update move the weights even when a tree's rewards are all equal.
    # One shared policy for both agents keeps the compile time of this CPU test down.
    problems = [
        parse_row({"id": f"q{k}", "problem": f"Question {k}: answer 7", "answer": "7"}, "math", "<t>:1")
        for k in range(2)
    ]
    cfg = PolicyConfig(
        model={"preset": "tiny-qwen3"},
        optimizer={"lr": 1e-3},
        buffer={"threshold": 6},
        micro_batch_size=8,
        loss={"entropy_coef": 0.01},
    )
    policy = Policy("shared", cfg)
    before = jax.tree.map(np.array, policy.params)
    buffer = ExperienceBuffer(6)
    agents = {"alpha": Agent("alpha", "shared"), "beta": Agent("beta", "shared", "You check answers. ")}
    gen = PolicyGenerator({"shared": policy}, SamplerConfig(max_new_tokens=16))
    wf = Mars2Workflow(max_nodes=3, expansions_per_round=2, stop_on_solve=False, prior="reward_average")
    for step in range(2):
        out = wf.rollout(problems, agents, gen, pool, seed=step)
        assert len(each_row(out)) == 6 and all(math.isfinite(v) for v in out.metrics.values())
        assert all(math.isfinite(s.advantage) and s.completion_ids.size > 0 for s in each_row(out))
        assert {s.policy for s in each_row(out)} == {"shared"} and {s.version for s in each_row(out)} == {
            step
        }
        buffer.add(out.rows)
        while buffer.ready(policy.version):
            stats = policy.update(buffer.take(policy.version)[0])
            assert all(math.isfinite(v) for v in stats.values())
    assert policy.version == 2
    moved = jax.tree.leaves(
        jax.tree.map(lambda a, b: bool(np.any(a != np.asarray(b))), before, policy.params)
    )
    assert any(moved)
    assert sum(wf.state_dict()["reward_average"]["count"].values()) == 12


@pytest.mark.parametrize("reward", ["fraction", "pass"])
def test_binary_reward_option_for_mars2_and_grpo(pool, reward):
    """A program that passes 4 of 12 tests (the public ones) earns 1/3 with "fraction", 0 with "pass"."""
    from marljax.workflows.grpo import GrpoWorkflow

    problems = make_problems(2)

    def script(a, prompt, k, seed):
        return fenced(overfit_code(problem_of(problems, prompt)))

    agents = {"a": Agent("a", "p")}
    expected = 4 / 12 if reward == "fraction" else 0.0
    tree = Mars2Workflow(max_nodes=2, expansions_per_round=2, reward=reward).rollout(
        problems, agents, ScriptedGenerator(script), pool, seed=0
    )
    grpo = GrpoWorkflow(group_size=2, reward=reward).rollout(
        problems, agents, ScriptedGenerator(script), pool, 0
    )
    for rollout in (tree, grpo):
        assert [s.reward for s in each_row(rollout)] == pytest.approx([expected] * 4)
    with pytest.raises(ValueError, match="reward"):
        GrpoWorkflow(reward="half")


def test_a_judge_agent_selects_the_t_plus_answer_from_the_config(pool):
    """select: reward_model with workflow.judge: the judge agent scores every candidate of a tree
    from the problem, the candidate and its public-test report; its scores pick the answer."""
    problems = make_problems(2, seed=0)
    agents = {**team(), "critic": Agent("critic", "pol_critic", role="Judge. ")}
    seen = []

    def script(agent, prompt, k, seed):
        if agent.name != "critic":
            return tplus_script(problems)(agent, prompt, k, seed)
        seen.append(prompt)
        # the critic trusts a candidate that looks up a table of the public cases least
        return "Score: 2" if ".get(x, -12345)" in prompt else "I'd say 9/10"

    kw = dict(max_nodes=8, eval_search=True, agents=["alpha", "beta"], select="reward_model")
    out = Mars2Workflow(**kw, judge="critic").evaluate(problems, agents, CountingGenerator(script), pool)
    by_public = Mars2Workflow(**{**kw, "select": "public_score"}).evaluate(
        problems, agents, CountingGenerator(script), pool
    )
    assert by_public["eval/search/pass_at_1"] == 0.5  # the overfit refinement wins on public tests
    assert out["eval/search/pass_at_1"] == 1.0 == out["eval/search/oracle"]
    assert seen and all(p.startswith("Judge. Below are a programming problem") for p in seen)
    assert any("Public tests: passed 75% of them" in p for p in seen)
    assert any("Public tests: passed 100% of them" in p for p in seen)
    from marljax.train.config import ConfigError, load_config

    config = Path(__file__).resolve().parents[2] / "configs" / "mars2_tiny.yaml"
    cfg = load_config(config, ["workflow.select=reward_model", "workflow.judge=bob", "workflow.ties=latest"])
    assert (cfg.workflow.judge, cfg.workflow.ties) == ("bob", "latest")
    with pytest.raises(
        ConfigError, match=r"workflow\.judge: unknown agent; known: alice, bob \(got 'nobody'\)"
    ):
        load_config(config, ["workflow.judge=nobody"])
