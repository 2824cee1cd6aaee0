"""Dr. MAS's search orchestrator: the router routes, the search agent searches with the tool, the
answer agent answers from the notes; every turn gets the team's reward, normalised per agent."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rows_view import each_row

from marljax.envs.tool_calls import format_tool_call
from marljax.rewards import SandboxVerifier
from marljax.tasks import make_multihop
from marljax.workflows import REGISTRY
from marljax.workflows.base import Agent, ScriptedGenerator, resolve_alias
from marljax.workflows.dr_mas import DrMasConfig, DrMasWorkflow
from marljax.workflows.search_rounds import router_choice
from marljax.workflows.turns import ToolsConfig


def DrMasSearchConfig(**options) -> DrMasConfig:
    """Dr. MAS's search orchestrator as the old kind `dr_mas_search` configures it."""
    return DrMasConfig(**resolve_alias({"kind": "dr_mas_search", **options}))


def DrMasSearchWorkflow(**options) -> DrMasWorkflow:
    return DrMasWorkflow(DrMasSearchConfig(**options))


PROBLEMS, _ = make_multihop(1, seed=5, hops=[2])
AGENTS = {name: Agent(name, f"pol_{name}", f"{name}: ") for name in ("router", "searcher", "answerer")}
PERSON = re.fullmatch(r"In which country was (.+) born\?", PROBLEMS[0].prompt)[1]


def make_script():
    """Episode 0: search the person, then the city, then answer. Episode 1: the router answers at
    once, so the answer agent has no notes and answers 'unknown'. (Each round's requests come in
    episode order: the router's first-round prompts are episode 0's, then episode 1's.)"""
    first_round = []

    def script(agent, prompt, k, seed):
        if agent.name == "router" and prompt.count("Notes:") == 1:
            first_round.append(prompt)
            if len(first_round) % 2 == 0:
                return "answer"
        return answer_or_search(agent, prompt)

    return script


def answer_or_search(agent, prompt):
    if agent.name == "router":
        return "answer" if "is a city in" in prompt else "search"
    if agent.name == "searcher":
        city = re.search(r"was born in (\w+)", prompt)
        return format_tool_call("search", {"query": city[1] if city else PERSON})
    country = re.search(r"is a city in (\w+)", prompt)
    return f"<answer>{country[1] if country else 'unknown'}</answer>"


def test_dr_mas_search_is_dr_mas_with_tools():
    assert "dr_mas_search" not in REGISTRY
    cfg = DrMasSearchConfig()
    assert (cfg.kind, cfg.router, cfg.tools) == ("dr_mas", "router", ToolsConfig())
    found = cfg.check_agents({"router": 1, "searcher": 1})
    assert [(k, v) for k, _, v in found] == [(("answerer",), "answerer")]
    with pytest.raises(ValueError, match="needs a router"):
        DrMasConfig(tools={})


def test_route_parsing():
    assert router_choice("I will search. No, answer.", True) == "answer"
    assert router_choice("SEARCH", True) == "search"
    assert router_choice("hmm", False) == "search" and router_choice("hmm", True) == "answer"
    assert router_choice("answer, then research_more", False) == "answer"  # whole words only


@pytest.mark.parametrize("multi_turn", ["merged", "per_turn"])
def test_one_searching_episode_and_one_that_answers_at_once(multi_turn):
    gen = ScriptedGenerator(make_script())
    wf = DrMasSearchWorkflow(group_size=2, max_rounds=4, process_weight=0.5, tools={"multi_turn": multi_turn})
    out = wf.rollout(PROBLEMS, AGENTS, gen, SandboxVerifier(), seed=0)
    # episode 0: router search, search (person); router search, search (city); router answer, answer
    # episode 1: router answer, answer
    by = {(s.ids["episode"], s.agent): [] for s in each_row(out)}
    for s in each_row(out):
        by[(s.ids["episode"], s.agent)].append(s)
    merged = multi_turn == "merged"
    assert {k: len(v) for k, v in by.items()} == {
        (0, "router"): 1 if merged else 3,
        (0, "searcher"): 1 if merged else 2,
        (0, "answerer"): 1,
        (1, "router"): 1,
        (1, "answerer"): 1,
    }
    m = out.metrics
    assert m["team/reward"] == 0.5 and m["dr_mas/rounds"] == 2.0 and m["tools/calls_per_episode"] == 1.0
    # rewards: R (1 in episode 0, 0 in 1); the searcher's turns add 0.5 * process (two useful calls: 1)
    assert {s.reward for s in by[(0, "router")] + by[(0, "answerer")]} == {1.0}
    assert {s.reward for s in by[(0, "searcher")]} == {1.5}
    assert {s.reward for s in by[(1, "router")] + by[(1, "answerer")]} == {0.0}
    # agent-wise normalisation on the problem: the searcher acted in one episode only: one value
    for s in each_row(out):
        if s.agent == "searcher":
            assert s.advantage == 0.0
    answers = [by[(e, "answerer")][0] for e in (0, 1)]
    np.testing.assert_allclose([a.advantage for a in answers], [0.70710, -0.70710], atol=1e-4)
    routers = [s.reward for e in (0, 1) for s in by[(e, "router")]]
    mean, sd = np.mean(routers), np.std(routers, ddof=1)
    np.testing.assert_allclose(
        [s.advantage for e in (0, 1) for s in by[(e, "router")]],
        (np.array(routers) - mean) / (sd + 1e-6),
        atol=1e-5,
    )
    if merged:
        router = by[(0, "router")][0]
        assert (~router.completion_mask).sum() > 0  # the notes between its turns are masked
        text = bytes(router.completion_ids[router.completion_mask].astype(np.uint8)).decode()
        assert text == "searchsearchanswer"


def test_singleton_raw_gives_the_lone_search_turn_its_reward():
    """`singleton: raw` (Dr. MAS's reference): the searcher, whose one merged sample is alone in its
    problem group, trains on its raw reward R + 0.5 * process = 1.5 instead of 0; the groups of
    two keep their normalised advantages."""
    options = {"group_size": 2, "max_rounds": 4, "process_weight": 0.5}
    zero = DrMasSearchWorkflow(**options).rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(make_script()), SandboxVerifier(), seed=0
    )
    raw = DrMasSearchWorkflow(**options, singleton="raw").rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(make_script()), SandboxVerifier(), seed=0
    )
    searcher = [s.agent == "searcher" for s in each_row(raw)]
    assert sum(searcher) == 1
    np.testing.assert_array_equal(raw.rewards, zero.rewards)
    np.testing.assert_allclose(raw.advantages[searcher], [1.5])
    np.testing.assert_allclose(zero.advantages[searcher], [0.0])
    others = ~np.array(searcher)
    np.testing.assert_array_equal(raw.advantages[others], zero.advantages[others])
    assert DrMasSearchConfig().singleton == "zero"


def test_global_normalization_puts_every_agent_of_a_problem_in_one_group():
    """`normalization: global` with tools: each problem's rows, whatever their agent, are one GRPO
    group (it was silently the per-agent normalisation)."""
    options = {"group_size": 2, "max_rounds": 4, "process_weight": 0.5}
    out = DrMasSearchWorkflow(**options, normalization="global").rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(make_script()), SandboxVerifier(), seed=0
    )
    problem = np.array([i["problem"] for i in out.ids])
    for p in np.unique(problem):
        r = out.rewards[problem == p]
        expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if len(r) > 1 else np.zeros(1)
        np.testing.assert_allclose(out.advantages[problem == p], expected, rtol=1e-5, atol=1e-6)
    per_agent = DrMasSearchWorkflow(**options).rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(make_script()), SandboxVerifier(), seed=0
    )
    assert np.abs(per_agent.advantages - out.advantages).max() > 1e-3


def test_the_last_round_always_answers():
    def searcher_forever(agent, prompt, k, seed):
        if agent.name == "router":
            return "search"
        return (
            format_tool_call("search", {"query": PERSON})
            if agent.name == "searcher"
            else "<answer>x</answer>"
        )

    out = DrMasSearchWorkflow(group_size=2, max_rounds=2).rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(searcher_forever), SandboxVerifier(), seed=0
    )
    assert out.metrics["dr_mas/rounds"] == 2.0 and out.metrics["dr_mas/search_turns"] == 1.0
    assert sum(s.agent == "answerer" for s in each_row(out)) == 2


def test_evaluate():
    m = DrMasSearchWorkflow().evaluate(PROBLEMS, AGENTS, ScriptedGenerator(make_script()), SandboxVerifier())
    assert m == {"eval/team/pass_at_1": 1.0, "eval/team/reward": 1.0}


def test_config_errors():
    with pytest.raises(ValueError, match="different agents"):
        DrMasSearchConfig(router="a", searcher="a", answerer="b")
    with pytest.raises(ValueError, match="qa or math"):
        DrMasSearchConfig(tools={"task": "plan"})


def test_a_corpus_file_is_searched_for_every_problem(tmp_path):
    from marljax.workflows.turns import TaskTools

    path = tmp_path / "corpus.jsonl"
    path.write_text('{"title": "Zorb", "text": "Zorb is a city in Quux."}\n')
    task = TaskTools(ToolsConfig(corpus=str(path)))
    (search,) = task.tools(PROBLEMS[0])  # the problem's own passages are not searched
    assert search.fn(query="Zorb") == "[1] Zorb: Zorb is a city in Quux."
    assert task.tools(PROBLEMS[0])[0].fn(query=PERSON) == "no results"
