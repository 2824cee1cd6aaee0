"""SHARP with tools: planner + searching workers on a generated multi-hop question; counterfactual
credit by masking one agent, the tool-process reward, per-agent advantages, merged multi-turn samples."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rows_view import each_row

from marljax.envs.tool_calls import format_tool_call
from marljax.rewards import SandboxVerifier
from marljax.tasks import make_multihop
from marljax.train import rollout_log
from marljax.workflows import REGISTRY
from marljax.workflows.base import Agent, ScriptedGenerator, resolve_alias
from marljax.workflows.sharp import SharpConfig, SharpWorkflow
from marljax.workflows.turns import ToolsConfig


def SharpToolsConfig(**options) -> SharpConfig:
    """SHARP with tools as the old kind `sharp_tools` configures it."""
    return SharpConfig(**resolve_alias({"kind": "sharp_tools", **options}))


def SharpToolsWorkflow(**options) -> SharpWorkflow:
    return SharpWorkflow(SharpToolsConfig(**options))


PROBLEMS, _ = make_multihop(1, seed=5, hops=[2])
AGENTS = {name: Agent(name, "pol", f"{name}: ") for name in ("planner", "w1", "w2")}
PERSON = re.fullmatch(r"In which country was (.+) born\?", PROBLEMS[0].prompt)[1]
ANSWER = PROBLEMS[0].fields["answers"][0]


def script(agent, prompt, k, seed):
    """Planner: sample 0 plans 'find the country', sample 1 tells worker 2 to guess. Worker 1 searches
    the person, then answers the city. Worker 2 guesses when told to; else searches the city it was
    given and answers its country; with no city it answers 'unknown'."""
    if agent.name == "planner":
        return "1. find the city\n2. " + ("find the country" if k == 0 else "guess")
    observations = prompt.count("Observation:")
    if agent.name == "w1":
        if observations == 0:
            return format_tool_call("search", {"query": PERSON})
        return "<answer>" + re.search(r"was born in (\w+)", prompt)[1] + "</answer>"
    if "Your sub-task: guess" in prompt:
        return "<answer>Nowhere</answer>"
    city = re.search(r"Worker 1: (\w+)", prompt)
    if city is None:
        return "<answer>unknown</answer>"
    if observations == 0:
        return format_tool_call("search", {"query": city[1]})
    return "<answer>" + re.search(r"is a city in (\w+)", prompt)[1] + "</answer>"


def hand_advantages(values):
    """(r - mean) / (std ddof 1 + 1e-6) over the two episodes of one problem."""
    v = np.asarray(values, float)
    return (v - v.mean()) / (v.std(ddof=1) + 1e-6)


def test_sharp_tools_is_sharp_with_tools():
    assert "sharp_tools" not in REGISTRY
    cfg = SharpToolsConfig(workers=["w1"])
    assert (cfg.kind, cfg.tools, cfg.shapley, cfg.process_weight) == (
        "sharp",
        ToolsConfig(),
        "counterfactual",
        0.2,
    )
    assert SharpToolsConfig(workers=["w1"], credit="shapley").shapley == "exact"
    with pytest.raises(ValueError, match="qa or math"):
        SharpConfig(workers=["w1"], tools={"task": "plan"})


@pytest.mark.parametrize("multi_turn", ["merged", "per_turn"])
def test_counterfactual_credit_by_hand(multi_turn):
    wf = SharpToolsWorkflow(workers=["w1", "w2"], group_size=2, tools={"multi_turn": multi_turn})
    out = wf.rollout(PROBLEMS, AGENTS, ScriptedGenerator(script), SandboxVerifier(), seed=0)
    # episode 0 answers right; episode 1's worker 2 guesses. Masked runs (v of the team without k):
    # ep 0: no plan -> workers follow the question as a whole and still answer (v 1): planner credit 0;
    #       no worker 1 -> worker 2 has no city (v 0): credit 1; no worker 2 -> the city is the answer (v 0): 1
    # ep 1: no plan -> worker 2 no longer guesses (v 1): planner credit 0 - 1 = -1; the workers: 0 and 0
    # process: both plans list 1..2 (1); worker 1 one useful search (1); worker 2 one in ep 0, none in ep 1
    rewards = {
        "planner": [1 + 0 + 0.2, 0 - 1 + 0.2],
        "w1": [1 + 1 + 0.2, 0 + 0 + 0.2],
        "w2": [1 + 1 + 0.2, 0 + 0 + 0.0],
    }
    m = out.metrics
    assert m["team/reward"] == 0.5 and m["team/pass_rate"] == 0.5
    assert m["agent/planner/credit"] == -0.5 and m["agent/w1/credit"] == 0.5 and m["agent/w2/credit"] == 0.5
    assert m["agent/w2/process"] == 0.5 and m["multiturn/fallbacks"] == 0.0
    per_agent = {name: [] for name in rewards}
    for s in each_row(out):
        per_agent[s.agent].append(s)
    # turns per episode: planner 1; worker 1 two (search, answer); worker 2 two in ep 0, one in ep 1
    expected_samples = {
        "planner": 2,
        "w1": 2 if multi_turn == "merged" else 4,
        "w2": 2 if multi_turn == "merged" else 3,
    }
    assert {k: len(v) for k, v in per_agent.items()} == expected_samples
    for name, want in rewards.items():
        by_episode = {s.ids["episode"]: s for s in per_agent[name]}
        np.testing.assert_allclose([by_episode[e].reward for e in (0, 1)], want, atol=1e-6)
        np.testing.assert_allclose(
            [by_episode[e].advantage for e in (0, 1)], hand_advantages(want), atol=1e-5
        )
    if multi_turn == "merged":
        w1 = next(s for s in per_agent["w1"] if s.ids["episode"] == 0)
        # one sequence: the search call, the tool result (masked), the answer
        text = bytes(w1.completion_ids.astype(np.uint8)).decode()
        assert text.startswith("<tool_call>") and "Observation:" in text and text.endswith("</answer>")
        observed = bytes(w1.completion_ids[~w1.completion_mask].astype(np.uint8)).decode()
        assert observed.startswith("\n\nObservation:\n[search] ") and "<answer>" not in observed
        assert "<tool_call>" not in observed and np.all(w1.sampling_logprobs[~w1.completion_mask] == 0)


def test_shapley_credit_evaluates_every_coalition():
    wf = SharpToolsWorkflow(workers=["w1", "w2"], group_size=2, credit="shapley")
    out = wf.rollout(PROBLEMS, AGENTS, ScriptedGenerator(script), SandboxVerifier(), seed=0)
    # ep 0: v(S) = 1 only when both workers are in S (with or without the plan): Shapley over three
    # players gives the planner 0 and each worker 1/2. ep 1: v = 1 only for {w1, w2} without the
    # plan: planner -1/3, workers 1/6 each.
    m = out.metrics
    assert m["agent/planner/credit"] == pytest.approx((0 - 1 / 3) / 2, abs=1e-6)
    assert m["agent/w1/credit"] == pytest.approx((1 / 2 + 1 / 6) / 2, abs=1e-6)


def test_evaluate_is_one_team_run_per_problem():
    gen = ScriptedGenerator(script)
    m = SharpToolsWorkflow(workers=["w1", "w2"]).evaluate(PROBLEMS, AGENTS, gen, SandboxVerifier())
    assert m == {"eval/team/pass_at_1": 1.0, "eval/team/reward": 1.0}


def test_config_errors():
    with pytest.raises(ValueError, match="different agents"):
        SharpToolsConfig(workers=["planner"])
    with pytest.raises(ValueError, match="extra"):
        SharpToolsConfig(workers=["w1"], tools={"tsk": "qa"})
    found = SharpToolsConfig(workers=["w1", "w9"]).check_agents(AGENTS)
    assert [(k, v) for k, _, v in found] == [(("workers", 1), "w9")]


class ByteTokenizer:
    """Decodes the ScriptedGenerator's byte ids."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(np.asarray(ids, np.uint8)).decode("utf-8", "replace")


def test_rollout_log_shows_the_calls_and_their_results():
    out = SharpToolsWorkflow(workers=["w1", "w2"], group_size=2).rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(script), SandboxVerifier(), seed=0
    )
    records = rollout_log.rollout_records(3, out, {"pol": ByteTokenizer()})
    w1 = [r for r in records if r["agent"] == "w1"]
    assert len(w1) == 2
    for r in w1:
        # one sequence: the call, the search result the agent read, then its answer
        call, result, answer = (
            r["completion"].index(s) for s in ('<tool_call>\n{"name": "search"', "[search] [1]", "<answer>")
        )
        assert call < result < answer
        assert r["trained_len"] < r["completion_len"]
    planner = next(r for r in records if r["agent"] == "planner")
    assert "trained_len" not in planner  # a one-turn completion is trained whole


def test_counterfactual_samples_average_the_masked_teams_runs(monkeypatch):
    """`counterfactual_samples: 2`: each masked team runs twice and is valued by its mean score.
    The second run of every planner-less team is made to answer wrong, so v(team without the
    planner) is (1 + 0) / 2 in both episodes where one run gave 1: the planner's counterfactual
    credit rises by 0.5 (ep 0: 1 - 0.5 instead of 1 - 1; ep 1: 0 - 0.5 instead of 0 - 1)."""
    import types

    from marljax.workflows import sharp

    real, calls = sharp.run_teams, []

    def second_run_wrong(trajs, jobs, workers, task, generator, seed, reuse=None):
        runs = real(trajs, jobs, workers, task, generator, seed, reuse)
        calls.append(seed)
        if len(calls) == 3:  # the actual teams, the first masked runs, then the second masked runs
            wrong = types.SimpleNamespace(answer="Nowhere")
            runs = [r if r.members & 1 else sharp.TeamRun(r.episode, r.members, [None, wrong]) for r in runs]
        return runs

    monkeypatch.setattr(sharp, "run_teams", second_run_wrong)
    one = SharpToolsWorkflow(workers=["w1", "w2"], group_size=2).rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(script), SandboxVerifier(), seed=0
    )
    calls.clear()
    two = SharpToolsWorkflow(workers=["w1", "w2"], group_size=2, counterfactual_samples=2).rollout(
        PROBLEMS, AGENTS, ScriptedGenerator(script), SandboxVerifier(), seed=0
    )
    assert len(calls) == 3 and len(set(calls)) == 3  # each masked run has its own seed

    def planner_rewards(out):
        rows = [s for s in each_row(out) if s.agent == "planner"]
        return [next(s.reward for s in rows if s.ids["episode"] == e) for e in (0, 1)]

    np.testing.assert_allclose(planner_rewards(one), [1 + 0 + 0.2, 0 - 1 + 0.2], atol=1e-6)
    np.testing.assert_allclose(planner_rewards(two), [1 + 0.5 + 0.2, 0 - 0.5 + 0.2], atol=1e-6)
    # the workers' masked teams answered the same in both runs: their rewards do not move
    for name in ("w1", "w2"):
        a = sorted(s.reward for s in each_row(one) if s.agent == name)
        b = sorted(s.reward for s in each_row(two) if s.agent == name)
        np.testing.assert_allclose(a, b, atol=1e-6)
