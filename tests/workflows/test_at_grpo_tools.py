"""AT-GRPO with a tool agent and a plan agent: tool-process rewards, the checker's findings reach
the plan agent, best branches continue, groups keyed by (problem, turn, agent); grid and math."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rows_view import each_row

from marljax.envs.tool_calls import format_tool_call
from marljax.rewards import SandboxVerifier
from marljax.tasks import make_arithmetic, make_grid_problems
from marljax.workflows import REGISTRY
from marljax.workflows.at_grpo import AtGrpoConfig, AtGrpoWorkflow
from marljax.workflows.base import Agent, ScriptedGenerator, resolve_alias
from marljax.workflows.turns import ToolsConfig


def AtGrpoToolsConfig(**options) -> AtGrpoConfig:
    """AT-GRPO with tools as the old kind `at_grpo_tools` configures it."""
    return AtGrpoConfig(**resolve_alias({"kind": "at_grpo_tools", **options}))


def AtGrpoToolsWorkflow(**options) -> AtGrpoWorkflow:
    return AtGrpoWorkflow(AtGrpoToolsConfig(**options))


GRID = make_grid_problems(1, seed=3)[0]
AGENTS = {"tool_agent": Agent("tool_agent", "p", "T: "), "plan_agent": Agent("plan_agent", "p", "P: ")}


def grid_script(agent, prompt, k, seed):
    """Tool agent: k0 checks the shortest plan, k1 calls nothing, k2 writes a broken call, k3 calls an
    unknown tool. Plan agent: k0 commits the full plan when the notes say it reaches the goal, k1 its
    first move, k2 nothing, k3 the full plan only once it has been checked (like k0)."""
    solution = GRID.fields["solution"]
    if agent.name == "tool_agent":
        return [
            format_tool_call("check_plan", {"moves": solution}),
            "no idea",
            "<tool_call>{oops</tool_call>",
            format_tool_call("solve", {}),
        ][k]
    checked = "reaches the goal" in prompt
    return [
        f"Moves: {solution}" if checked else "Moves: U",
        f"Moves: {solution[0]}",
        "",
        "Moves: " + solution,
    ][k]


def hand_advantages(rewards):
    r = np.asarray(rewards, float)
    return (r - r.mean()) / (r.std(ddof=1) + 1e-6)


def test_at_grpo_tools_is_at_grpo_with_tools():
    assert "at_grpo_tools" not in REGISTRY
    cfg = AtGrpoToolsConfig()
    assert (cfg.kind, cfg.tool_agent, cfg.planner) == ("at_grpo", "tool_agent", "plan_agent")
    assert cfg.tools == ToolsConfig(task="plan", multi_turn="per_turn")
    found = cfg.check_agents({"tool_agent": 1})
    assert [(k, v) for k, _, v in found] == [(("planner",), "plan_agent")]


def test_grid_turn_by_hand():
    prompts = []

    def spy(agent, prompt, k, seed):
        prompts.append((agent.name, prompt))
        return grid_script(agent, prompt, k, seed)

    out = AtGrpoToolsWorkflow(num_turns=2).rollout(
        [GRID], AGENTS, ScriptedGenerator(spy), SandboxVerifier(), seed=0
    )
    d = GRID.fields["distance"]
    tool = [s for s in each_row(out) if s.agent == "tool_agent"]
    plan = [s for s in each_row(out) if s.agent == "plan_agent"]
    # solved at turn 0: no second turn
    assert len(tool) == 4 and len(plan) == 4 and {s.ids["turn"] for s in each_row(out)} == {0}
    assert [s.reward for s in tool] == [1.0, 0.0, 0.0, 0.0]
    np.testing.assert_allclose([s.reward for s in plan], [1.0, 0.5 / d, 0.0, 1.0])
    for group in (tool, plan):
        np.testing.assert_allclose(
            [s.advantage for s in group], hand_advantages([s.reward for s in group]), atol=1e-5
        )
    # the plan agent saw the best tool candidate's finding, with the call that produced it
    plan_prompt = next(p for a, p in prompts if a == "plan_agent")
    assert (
        f"[check_plan] {{'moves': '{GRID.fields['solution']}'}} -> reaches the goal after {d} moves"
        in plan_prompt
    )
    # the tool agent's prompt describes the tool (raw text: the plain description)
    tool_prompt = next(p for a, p in prompts if a == "tool_agent")
    assert '"name": "check_plan"' in tool_prompt
    assert [s.ids["node"] for s in tool] == [0, 1, 2, 3] and [s.ids["node"] for s in plan] == [4, 5, 6, 7]
    assert {s.ids["parent"] for s in plan} == {0}  # the best tool candidate
    m = out.metrics
    assert m["team/reward"] == 1.0 and m["team/pass_rate"] == 1.0 and m["tools/call_frac"] == 0.75


def test_a_tool_check_is_worth_how_far_the_checked_moves_get():
    """Plan task: half the tool agent's reward is its process reward, half the grid reward of the best
    move string it checked (a one-move check runs as well as a whole path but scores less)."""
    solution, d = GRID.fields["solution"], GRID.fields["distance"]
    calls = [
        format_tool_call("check_plan", {"moves": solution}),
        format_tool_call("check_plan", {"moves": solution[0]}),
        format_tool_call("check_plan", {"moves": solution[0]})
        + format_tool_call("check_plan", {"moves": solution}),
        format_tool_call("check_plan", {"moves": ""}),
    ]

    def script(agent, prompt, k, seed):
        return calls[k] if agent.name == "tool_agent" else "Moves: "

    out = AtGrpoToolsWorkflow(num_turns=1).rollout(
        [GRID], AGENTS, ScriptedGenerator(script), SandboxVerifier(), 0
    )
    tool = [s.reward for s in each_row(out) if s.agent == "tool_agent"]
    # every call ran and returned a finding (process reward 1); the best check decides the rest
    np.testing.assert_allclose(tool, [1.0, 0.5 + 0.5 * (0.5 / d), 1.0, 0.5])


def test_a_second_turn_starts_where_the_best_plan_ended():
    """Turn 0: the plan agent's best candidate takes the first move of the shortest path. Turn 1: the
    checker runs from the new cell, and the rest of the path solves the grid."""
    solution, d = GRID.fields["solution"], GRID.fields["distance"]
    rest = solution[1:]

    def two_turns(agent, prompt, k, seed):
        second = "Turn 1, plan agent moved" in prompt
        if agent.name == "tool_agent":
            return format_tool_call("check_plan", {"moves": rest}) if second and k == 0 else "nothing"
        if second:
            return f"Moves: {rest}" if k == 0 else ""
        return f"Moves: {solution[0]}" if k == 0 else ""

    prompts = []

    def spy(agent, prompt, k, seed):
        prompts.append((agent.name, prompt))
        return two_turns(agent, prompt, k, seed)

    out = AtGrpoToolsWorkflow(num_turns=2, num_candidates=2).rollout(
        [GRID], AGENTS, ScriptedGenerator(spy), SandboxVerifier(), seed=0
    )
    plan = {(s.ids["turn"], s.ids["node"]): s.reward for s in each_row(out) if s.agent == "plan_agent"}
    assert plan == pytest.approx({(0, 2): 0.5 / d, (0, 3): 0.0, (1, 6): 1.0, (1, 7): 0.0})
    assert f"reaches the goal after {d - 1} moves" in [p for a, p in prompts if a == "plan_agent"][-1]
    assert out.metrics["team/pass_rate"] == 1.0 and out.metrics["team/reward"] == 1.0
    turn1_tool = [s for s in each_row(out) if s.agent == "tool_agent" and s.ids["turn"] == 1]
    assert {s.ids["parent"] for s in turn1_tool} == {2}  # the best plan of turn 0


def test_math_with_the_python_tool():
    problems = make_arithmetic(1, seed=2)
    a, b, c = (int(x) for x in re.findall(r"\d+", problems[0].prompt))

    def script(agent, prompt, k, seed):
        if agent.name == "tool_agent":
            return format_tool_call("python", {"code": f"print({a} * {b} - {c})"}) if k == 0 else "hmm"
        found = re.search(r"output:\n(-?\d+)", prompt)
        return f"<answer>{found[1]}</answer>" if found and k == 0 else "<answer>0</answer>"

    wf = AtGrpoToolsWorkflow(num_candidates=2, tools={"task": "math", "multi_turn": "per_turn"})
    out = wf.rollout(problems, AGENTS, ScriptedGenerator(script), SandboxVerifier(), seed=0)
    assert [s.reward for s in each_row(out)] == [1.0, 0.0, 1.0, 0.0]
    assert problems[0].fields["answer"] == a * b - c


def test_the_math_tool_agent_is_rewarded_for_a_right_output():
    """PettingLLMs rewards its math tool agent by whether its code's output is the answer: a call
    that runs but prints a wrong number, a program that fails after printing the answer, and a
    right call followed by another call all earn 0 (the old process reward gave each of them 1)."""
    problems = make_arithmetic(1, seed=2)
    a, b, c = (int(x) for x in re.findall(r"\d+", problems[0].prompt))
    right = format_tool_call("python", {"code": f"print({a} * {b} - {c})"})
    tool_calls = [
        right,  # 1
        format_tool_call("python", {"code": f"print({a} * {b} + {c})"}),  # runs, wrong: 0
        format_tool_call("calculator", {"expression": f"{a} * {b} - {c}"}),  # 1
        right + format_tool_call("calculator", {"expression": "1 + 1"}),  # the last call is wrong: 0
        format_tool_call("python", {"code": f"print({a} * {b} - {c})\n1 / 0"}),  # fails: 0
    ]

    def script(agent, prompt, k, seed):
        if agent.name == "tool_agent":
            return tool_calls[k]
        return f"<answer>{a * b - c}</answer>"

    wf = AtGrpoToolsWorkflow(num_candidates=5, tools={"task": "math", "multi_turn": "per_turn"})
    out = wf.rollout(problems, AGENTS, ScriptedGenerator(script), SandboxVerifier(), seed=0)
    tool = [s for s in each_row(out) if s.agent == "tool_agent"]
    assert [s.reward for s in tool] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert [s.passed for s in tool] == [1.0, 0.0, 1.0, 0.0, 0.0]
    # one group (problem, turn 0, tool agent): mean 0.4, std (ddof 1) sqrt(0.3)
    np.testing.assert_allclose([s.advantage for s in tool], hand_advantages([1, 0, 1, 0, 0]), atol=1e-5)
    np.testing.assert_allclose(tool[0].advantage, 0.6 / np.sqrt(0.3), atol=1e-4)


def test_a_tool_output_is_its_result_and_a_failed_or_truncated_one_is_not_scored():
    from marljax.envs.tool_calls import ToolCall
    from marljax.envs.tools import Observation, Tool, ToolBox, python_tool
    from marljax.workflows.tool_tree import tool_output

    tools = [
        python_tool(),
        Tool("calculator", "a value", {"expression": "string"}, lambda expression: "12"),
        Tool("wordy", "a long text", {}, lambda: Observation("x" * 50, "7")),
    ]
    box = ToolBox(tools, max_observation_chars=40)
    ran = box.run(ToolCall("python", {"code": "print(3 + 4)"}))
    assert ran.text == "verdict: ok\noutput:\n7\n" and tool_output(ran) == "7\n"
    failed = box.run(ToolCall("python", {"code": "print('7')\nprint(1 / 0)"}))
    assert failed.text.startswith("verdict: runtime_error") and tool_output(failed) is None
    assert tool_output(box.run(ToolCall("calculator", {"expression": "3 * 4"}))) == "12"
    cut = box.run(ToolCall("wordy", {}))
    assert cut.truncated and cut.result == "7" and tool_output(cut) is None
    assert tool_output(box.run(ToolCall("nothing", {}))) is None


def test_evaluate():
    m = AtGrpoToolsWorkflow().evaluate([GRID], AGENTS, ScriptedGenerator(grid_script), SandboxVerifier())
    assert m == {"eval/team/pass_at_1": 1.0, "eval/team/reward": 1.0}


def test_config_errors():
    with pytest.raises(ValueError, match="different agents"):
        AtGrpoToolsConfig(tool_agent="a", plan_agent="a")
    with pytest.raises(ValueError, match="plan or math"):
        AtGrpoToolsConfig(tools={"task": "qa", "multi_turn": "per_turn"})
    with pytest.raises(ValueError, match="per_turn"):
        AtGrpoToolsConfig(tools={"task": "plan"})
    with pytest.raises(ValueError, match="grid problems"):
        AtGrpoToolsWorkflow().rollout(make_arithmetic(1), AGENTS, ScriptedGenerator(grid_script), None, 0)
