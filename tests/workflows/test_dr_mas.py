"""Dr. MAS orchestrator: turn order, loop termination, routing, verdict rewards, agent-wise advantages."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from pydantic import ValidationError
from rows_view import each_row

from marljax import kernels
from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import parse_row, synthetic_rows
from marljax.workflows.base import Agent, ScriptedGenerator
from marljax.workflows.dr_mas import DrMasConfig, DrMasWorkflow, parse_route, parse_verdict

ROWS = synthetic_rows(2, seed=0)  # p0: f(x) = x*x % 5, p1: f(x) = min(x, 8) // 4; 4 public + 8 private tests
PROBLEMS = [parse_row(r, "stdio", f"<test>:{k + 1}") for k, r in enumerate(ROWS)]
# p0: `return 4` passes 3/4 public and 8/12 of all tests; p1: a table of the public cases passes 4/12.
WRONG = ["def f(x):\n    return 4\n", "def f(x):\n    return {19: 2, -56: -14, 55: 2, 24: 2}.get(x, 0)\n"]
AGENTS = {
    "solver": Agent("solver", "pol_s"),
    "verifier": Agent("verifier", "pol_v"),
    "router": Agent("router", "pol_r"),
}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(max_workers=2) as p:
        yield SandboxVerifier(p)


def fence(code: str) -> str:
    return f"```python\n{code}```"


def script(route: str = "hmm"):
    """Solver: sample 0 right, sample 1 wrong, every revision wrong. Verifier: ACCEPT iff the public
    tests passed (wrong on p1's table). Router: always `route`."""

    def run(agent, prompt, k, seed):
        i = next(i for i, p in enumerate(PROBLEMS) if p.prompt in prompt)
        if agent.name == "solver":
            right = k == 0 and "Reviewer comments" not in prompt
            return fence(ROWS[i]["solution"] if right else WRONG[i])
        if agent.name == "verifier":
            return "ACCEPT" if "All 4 public tests passed." in prompt else "REVISE: check f(-31)"
        return route

    return run


def hand_advantages(rewards, groups):
    """(r - mean) / (std with ddof 1 + 1e-6) within each group; 0 for a group of one."""
    r, g, out = np.asarray(rewards, float), np.asarray(groups), np.zeros(len(rewards))
    for key in set(groups):
        sel = g == key
        if sel.sum() > 1:
            out[sel] = (r[sel] - r[sel].mean()) / (r[sel].std(ddof=1) + 1e-6)
    return out


def turns_of(rollout, episode):
    return [
        s.agent
        for s in sorted(
            (s for s in each_row(rollout) if s.ids["episode"] == episode), key=lambda s: s.ids["turn"]
        )
    ]


def test_parsers():
    assert parse_verdict("ACCEPT") == (True, "")
    assert parse_verdict("revise: the loop is off by one") == (False, "the loop is off by one")
    assert parse_verdict("I would not ACCEPT this. REVISE") == (
        True,
        "this. REVISE",
    )  # first verdict word wins
    assert parse_verdict("looks fine") == (False, "looks fine")  # no verdict word: REVISE
    assert parse_verdict("ACCEPTED") == (False, "ACCEPTED")  # whole words only
    names = ["solver", "verifier"]
    assert parse_route("Next: the VERIFIER, then the solver", names) == "verifier"
    assert parse_route("solver2 or solver_x", names) is None
    assert parse_route("(solver)", names) == "solver"
    assert parse_route("", names) is None


def test_render_appends_context_the_template_has_no_place_for():
    plain, placed = Agent("a", "p"), Agent("a", "p", "R:", "{role}{problem}|{feedback}|{history}")
    assert plain.render_in_context("P", feedback="F", history="H") == "P\n\nH\n\nF"
    assert placed.render_in_context("P", feedback="F", history="H") == "R:P|F|H"


def test_default_order_accept_and_max_loops(pool):
    gen = ScriptedGenerator(script(), versions={"pol_s": 3})
    wf = DrMasWorkflow(max_loops=2, group_size=2)
    out = wf.rollout(PROBLEMS, AGENTS, gen, pool, seed=5)
    # p0: e0 right -> ACCEPT; e1 wrong -> REVISE -> (wrong) revision -> REVISE -> max_loops.
    # p1: e2 right -> ACCEPT; e3 public-only table -> ACCEPT (a wrong verdict).
    assert [turns_of(out, n) for n in range(4)] == [
        ["solver", "verifier"],
        ["solver", "verifier"] * 2,
        ["solver", "verifier"],
        ["solver", "verifier"],
    ]
    # One generate call per stage, one policy per stage here; the first batches G per problem prompt.
    assert gen.calls == [("pol_s", 2), ("pol_v", 4), ("pol_s", 1), ("pol_v", 1)]
    for s in each_row(out):
        t = s.ids["turn"]
        assert s.ids == {
            "problem": PROBLEMS[s.ids["episode"] // 2].id,
            "episode": s.ids["episode"],
            "node": t,
            "parent": t - 1,
            "depth": t,
            "turn": t,
        }
        assert s.policy == AGENTS[s.agent].policy and s.version == (3 if s.policy == "pol_s" else 0)
    rewards = [s.reward for s in each_row(out)]
    # solver turns carry the final program's pass fraction, verifier turns their verdict's correctness
    assert np.allclose(rewards, [1, 1, 2 / 3, 1, 2 / 3, 1, 1, 1, 1 / 3, 0])
    groups = [s.ids["episode"] // 2 * 2 + (s.agent == "verifier") for s in each_row(out)]  # (problem, agent)
    assert np.allclose([s.advantage for s in each_row(out)], hand_advantages(rewards, groups), atol=1e-5)
    # e.g. p0's solver turns {1, 2/3, 2/3}: (2/9) / (sqrt(3) / 9) = 1.1547
    assert each_row(out)[0].advantage == pytest.approx(2 / np.sqrt(3), abs=1e-5)
    m = out.metrics
    assert m["team/reward"] == pytest.approx((1 + 2 / 3 + 1 + 1 / 3) / 4)
    assert m["team/pass_rate"] == 0.5 and m["team/accept_rate"] == 0.75 and m["team/loops"] == 1.25
    assert m["agent/verifier/reward"] == pytest.approx(4 / 5)
    # amplification per problem: mean over each agent's samples of (var_pk + (mu_pk - mu_p)^2) / var_p,
    # over the problems where the agent's own rewards vary (agent-wise advantages 0 elsewhere)
    r = np.asarray(rewards)
    verifier = np.array([s.agent == "verifier" for s in each_row(out)])
    problem = np.array([s.ids["episode"] // 2 for s in each_row(out)])
    for name, mine in (("solver", ~verifier), ("verifier", verifier)):
        f = [
            (r[sel].var() + (r[sel].mean() - r[problem == p].mean()) ** 2) / r[problem == p].var()
            for p in (0, 1)
            for sel in [(problem == p) & mine]
            if np.ptp(r[sel]) > 0
            for _ in range(sel.sum())
        ]
        assert m[f"agent/{name}/amplification"] == pytest.approx(np.mean(f), rel=1e-5)
    assert all(np.isfinite(v) for v in m.values())


def test_verifier_sees_public_feedback_and_solver_the_comments(pool):
    seen = []

    def spy(agent, prompt, k, seed):
        seen.append((agent.name, prompt))
        return script()(agent, prompt, k, seed)

    DrMasWorkflow(max_loops=2, group_size=2).rollout(PROBLEMS[:1], AGENTS, ScriptedGenerator(spy), pool, 0)
    reviews = [p for a, p in seen if a == "verifier"]
    assert "All 4 public tests passed." in reviews[0] and "Passed 3 of 4 tests." in reviews[1]
    assert WRONG[0].strip() in reviews[1]
    assert not any(str(x) in reviews[1] for (x,) in ROWS[0]["inputs"][4:])  # private tests never leak
    revisions = [p for a, p in seen if a == "solver" and "Reviewer comments" in p]
    assert len(revisions) == 1 and "check f(-31)" in revisions[0] and WRONG[0].strip() in revisions[0]


def test_global_normalization_is_global_advantages_per_problem(pool):
    out = DrMasWorkflow(max_loops=2, group_size=2, normalization="global").rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(script()), pool, seed=5
    )
    r = jnp.asarray([s.reward for s in each_row(out)], jnp.float32)
    problem = np.array([s.ids["episode"] // 2 for s in each_row(out)])
    expect = sum(
        np.where(problem == p, np.asarray(kernels.global_advantages(r, mask=jnp.asarray(problem == p))), 0.0)
        for p in range(2)
    )
    assert np.allclose([s.advantage for s in each_row(out)], expect, atol=1e-6)
    assert np.allclose(expect, hand_advantages(np.asarray(r), problem), atol=1e-5)


def test_router_names_the_next_agent_and_budgets_bound_it(pool):
    gen = ScriptedGenerator(script(route="The SOLVER should go again"))
    out = DrMasWorkflow(router="router", max_loops=2, group_size=2).rollout(
        PROBLEMS[:1], AGENTS, gen, pool, 1
    )
    # S, router -> S (solver budget now spent: the router is not asked again), V, V (both spent)
    for n in range(2):
        assert turns_of(out, n) == ["solver", "router", "solver", "verifier", "verifier"]
    assert gen.calls == [("pol_s", 1), ("pol_r", 2), ("pol_s", 2), ("pol_v", 2), ("pol_v", 2)]
    assert out.metrics["agent/router/parse_rate"] == 1.0
    router_rewards = [s.reward for s in each_row(out) if s.agent == "router"]
    assert router_rewards == pytest.approx([2 / 3, 2 / 3])  # the team's outcome (revisions are wrong)


def test_unparseable_route_falls_back_to_the_default_order(pool):
    out = DrMasWorkflow(router="router", max_loops=2, group_size=2).rollout(
        PROBLEMS[:1], AGENTS, ScriptedGenerator(script(route="no idea")), pool, 1
    )
    assert turns_of(out, 0) == ["solver", "router", "verifier"]  # ACCEPT ends it
    assert turns_of(out, 1) == ["solver", "router", "verifier", "router", "solver", "verifier"]
    assert out.metrics["agent/router/parse_rate"] == 0.0
    assert {"agent/router/amplification", "agent/router/adv_mean"} <= set(out.metrics)


def test_evaluate_one_greedy_episode_per_problem(pool):
    gen = ScriptedGenerator(script())
    m = DrMasWorkflow(group_size=4).evaluate(PROBLEMS, AGENTS, gen, pool)
    assert m["eval/team/pass_at_1"] == 1.0 and m["eval/verifier/accuracy"] == 1.0
    assert gen.calls == [("pol_s", 2), ("pol_v", 2)]


def test_config():
    cfg = DrMasConfig(solver="s", verifier="v", router="r", max_loops=3, group_size=2, normalization="global")
    wf = DrMasWorkflow.from_config(cfg)
    assert wf.names == {"solver": "s", "verifier": "v", "router": "r"} and wf.cfg.max_loops == 3
    assert cfg.check_agents({"s": 0, "v": 0}) == [(("router",), "unknown agent; known: s, v", "r")]
    for bad in (
        {"verifier": "solver"},
        {"max_loops": 0},
        {"group_size": 1},
        {"normalization": "batch"},
        {"unknown": 1},
    ):
        with pytest.raises(ValidationError):
            DrMasConfig(**bad)


@pytest.mark.slow
def test_tiny_real_models_through_buffers_and_updates(pool):
    import jax

    from marljax.train.buffer import ExperienceBuffer
    from marljax.train.config import PolicyConfig, SamplerConfig
    from marljax.train.generation import PolicyGenerator
    from marljax.train.policy import Policy

    cfg = PolicyConfig(
        model={"preset": "tiny-qwen3"}, optimizer={"lr": 1e-3}, buffer={"threshold": 8}, micro_batch_size=8
    )
    policy = Policy("main", cfg)  # one LLM shared by both agents (role prompts), as Dr. MAS allows
    before = jax.tree.map(np.array, policy.params)
    agents = {"solver": Agent("solver", "main", "Answer: "), "verifier": Agent("verifier", "main", "Check: ")}
    # math: a random tiny model sometimes ends on a 7, so rewards vary from the first step
    problems = [
        parse_row({"id": f"q{k}", "problem": f"Question {k}: answer 7", "answer": "7"}, "math", f"<t>:{k}")
        for k in range(4)
    ]
    gen = PolicyGenerator({"main": policy}, SamplerConfig(max_new_tokens=16), max_prompt_len=256)
    buffer, wf, updates = ExperienceBuffer(32), DrMasWorkflow(max_loops=1, group_size=8), []
    for step in range(2):
        out = wf.rollout(problems, agents, gen, pool, seed=step)
        assert len(each_row(out)) == 64 and all(np.isfinite(v) for v in out.metrics.values())
        buffer.add(out.rows)
        while buffer.ready(policy.version):
            updates.append(policy.update(buffer.take(policy.version)[0]))
    assert len(updates) == 4 and all(np.isfinite(v) for u in updates for v in u.values())
    assert any(s.advantage != 0 for s in each_row(out))
    assert any(
        not np.array_equal(a, np.asarray(b))
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(policy.params))
    )


def test_as_chat_a_revision_continues_the_solvers_conversation(pool):
    solver = Agent("solver", "pol_s", role="Solve. ")
    agents = {**AGENTS, "solver": solver}
    seen = []

    def spy(agent, prompt, k, seed):
        seen.append((agent.name, prompt))
        return script()(agent, prompt, k, seed)

    DrMasWorkflow(max_loops=2, group_size=2).rollout(PROBLEMS[:1], agents, ScriptedGenerator(spy), pool, 0)
    first = [p for a, p in seen if a == "solver" and "Reviewer comments" not in p][0]
    revisions = [p for a, p in seen if a == "solver" and "Reviewer comments" in p]
    assert revisions
    for prompt in revisions:
        roles = [r for r, _ in prompt.messages]
        assert roles == ["system", "user", "assistant", "user"]
        assert prompt.messages[:2] == first.messages  # the conversation the solver started
        assert prompt.messages[2][1] == fence(WRONG[0])  # its own latest answer, as it wrote it
        assert prompt.messages[3][1].startswith("Reviewer comments:\n")
        assert fence(WRONG[0]).strip() not in prompt.messages[3][1]  # not repeated in the user turn
