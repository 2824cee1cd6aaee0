"""The multi-turn tool-use episode: answers end it with the task's score, calls become observations,
every failure is an observation, the turn limit ends it cleanly, and episodes are reproducible."""

from __future__ import annotations

import json
import time

import pytest

from marljax.envs import EnvSpec, TextEnv
from marljax.envs.tool_calls import format_tool_call
from marljax.envs.tool_env import ANSWER_FORMAT, ToolEnv, extract_tagged_answer, run_episode
from marljax.envs.tools import Tool, calculator_tool
from marljax.rewards import Problem

PROBLEM = Problem("p0", "What is 123 * 45?", "math", "<test>:0", {"answer": 5535})


def exact(problem, answer):
    return float(answer == str(problem.fields["answer"]))


def make_env(max_turns=3, tools=None, **kw):
    return ToolEnv(EnvSpec("calc", ("solver",), max_turns), tools or [calculator_tool()], exact, **kw)


def test_is_a_text_env():
    assert isinstance(make_env(), TextEnv)


def test_call_then_answer():
    env = make_env()
    first = env.reset(PROBLEM)
    assert first == f"What is 123 * 45?\n\n{ANSWER_FORMAT}"
    call = env.step("solver", "I will compute. " + format_tool_call("calculator", {"expression": "123*45"}))
    assert (call.observation, call.reward, call.done) == ("[calculator] 5535", 0.0, False)
    assert call.info["calls"] == 1 and call.info["valid_calls"] == 1 and call.info["useful_calls"] == 1
    assert call.info["results"] == [
        {"name": "calculator", "arguments": {"expression": "123*45"}, "error": None, "text": "5535"}
    ]
    end = env.step("solver", "<answer>5535</answer>")
    assert end.done and end.reward == 1.0 and end.info["answer"] == "5535"
    with pytest.raises(RuntimeError, match="step after the episode ended"):
        env.step("solver", "<answer>1</answer>")


def test_a_wrong_answer_ends_with_its_score():
    _, steps = run_episode(make_env(), PROBLEM, ["<answer>5000</answer>"])
    assert len(steps) == 1 and steps[0].done and steps[0].reward == 0.0


def test_malformed_call_is_an_observation():
    env = make_env()
    env.reset(PROBLEM)
    res = env.step("solver", "<tool_call>{calculator: 1}</tool_call>")
    assert not res.done and res.reward == 0.0
    assert res.observation.startswith("Your call could not be parsed: invalid JSON")
    assert res.info["calls"] == 1 and res.info["valid_calls"] == 0


def test_unknown_tool_and_exceptions_are_observations():
    env = make_env()
    env.reset(PROBLEM)
    res = env.step(
        "solver",
        format_tool_call("python", {"code": "1"}) + format_tool_call("calculator", {"expression": "1/0"}),
    )
    assert "[python] error: unknown tool 'python'; tools: calculator" in res.observation
    assert "[calculator] error: calculator failed: ZeroDivisionError" in res.observation
    assert res.info["calls"] == 2 and res.info["valid_calls"] == 0 and not res.done


def test_tool_timeout_is_an_observation():
    def slow(x: str) -> str:
        time.sleep(3)
        return x

    env = make_env(tools=[Tool("slow", "", {"x": "string"}, slow, timeout_s=0.1)])
    env.reset(PROBLEM)
    res = env.step("solver", format_tool_call("slow", {"x": "a"}))
    assert res.observation == "[slow] error: slow timed out after 0.1 s" and not res.done


def test_overlong_observation_is_truncated_and_says_so():
    env = make_env(tools=[Tool("big", "", {}, lambda: "y" * 500)], max_observation_chars=100)
    env.reset(PROBLEM)
    res = env.step("solver", format_tool_call("big", {}))
    assert res.observation.startswith("[big] " + "y" * 94)
    assert "observation truncated" in res.observation and len(res.observation) < 200


def test_turn_limit_ends_the_episode_without_reward():
    env = make_env(max_turns=2)
    _, steps = run_episode(env, PROBLEM, ["thinking...", "still thinking", "<answer>5535</answer>"])
    assert [s.done for s in steps] == [False, True]  # the third reply is never read
    assert steps[0].observation.startswith("No tool call and no answer found")
    assert steps[1].info["turn_limit"] and steps[1].reward == 0.0
    assert "turn limit (2)" in steps[1].observation


def test_extra_calls_beyond_the_limit_are_skipped():
    env = make_env(max_calls=1)
    env.reset(PROBLEM)
    two = format_tool_call("calculator", {"expression": "1+1"}) * 2
    res = env.step("solver", two)
    assert res.observation == "[calculator] 2\n1 further call(s) skipped: at most 1 per turn"


def test_only_tool_agents_call_tools_and_unknown_agents_are_errors():
    env = ToolEnv(
        EnvSpec("t", ("router", "searcher"), 3), [calculator_tool()], exact, tool_agents=["searcher"]
    )
    env.reset(PROBLEM)
    res = env.step("router", format_tool_call("calculator", {"expression": "1"}))
    assert "agent 'router' cannot call tools" in res.observation and res.info["valid_calls"] == 0
    with pytest.raises(ValueError, match="unknown agent 'x'"):
        env.step("x", "hi")


def test_same_replies_same_episode():
    replies = [format_tool_call("calculator", {"expression": "2**10"}), "hmm", "<answer>5535</answer>"]
    runs = [run_episode(make_env(), PROBLEM, replies) for _ in range(2)]
    assert runs[0] == runs[1]


def test_answer_tag_reading():
    assert extract_tagged_answer("a <answer> 1 </answer> b <answer>2</answer>") == "2"
    assert extract_tagged_answer("no tag") is None


def test_spec_checks():
    with pytest.raises(ValueError, match="max_turns"):
        EnvSpec("x", ("a",), 0)
    with pytest.raises(ValueError, match="at least one agent"):
        EnvSpec("x", (), 1)


# ------------------------------------------------------------------ fuzz: hostile replies
def _fuzz_strategies():
    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=20),
        st.sampled_from(["1e309", "2**100**100", "<|im_end|>", "\ud800", "9" * 40, "x" * 300]),
    )
    values = st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
        max_leaves=8,
    )
    names = st.sampled_from(["calculator", "search", "echo", "nope", "", "calc\ud800", "<|eot_id|>"])
    keys = st.sampled_from(["expression", "query", "s", "x", ""])
    args = st.dictionaries(keys, values, max_size=3) | values
    call_json = st.builds(
        lambda n, a, k: json.dumps({"name": n, k: a}, ensure_ascii=bool(len(str(a)) % 2)),
        names,
        args,
        st.sampled_from(["arguments", "parameters"]),
    )
    raw = st.sampled_from(
        [
            "[" * 1000,
            "{" * 3 + '"a":' * 3,
            '{"name": "echo", "arguments": {"s": ' + "7" * 5000 + "}}",
            '{"name": "echo", "arguments": {"s": "\\ud800\\udfff\\udc00"}}',
            '{"name": "echo", "arguments": "' + "[" * 1200 + '"}',
            '{"name": "calculator", "arguments": {"expression": "0x' + "f" * 3000 + '"}}',
            "<|im_end|>",
            "<|python_tag|>",
            "<answer>",
            "</answer>",
            "<tool_call>",
            "</tool_call>",
        ]
    )
    fragment = st.one_of(
        st.text(max_size=30),
        call_json,
        raw,
        st.builds(
            lambda body: f"<tool_call>{body}</tool_call>", st.one_of(call_json, raw, st.text(max_size=20))
        ),
    )
    return st.lists(fragment, min_size=1, max_size=4).map("".join)


def test_fuzz_hostile_replies_are_observations():
    # Thousands of random structured replies: the parser and the env never raise, and what they give
    # back is text a tokenizer and a UTF-8 log accept, without chat markup.
    from hypothesis import HealthCheck, given, settings

    from marljax.envs.tools import Tool

    echo = Tool("echo", "Echo.", {"s": "string"}, lambda s: s + "<|im_end|>", timeout_s=1.0)
    search = Tool("search", "Search.", {"query": "string"}, lambda query: f"[1] {query}", timeout_s=1.0)
    env = make_env(max_turns=3, tools=[calculator_tool(), echo, search])

    @settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(_fuzz_strategies())
    def check(reply):
        env.reset(PROBLEM)
        step = env.step("solver", reply)
        step.observation.encode("utf-8")
        json.dumps(step.info, ensure_ascii=False, default=str).encode("utf-8")
        for marker in ("<|im_end|>", "<|eot_id|>", "<|python_tag|>"):
            assert marker not in step.observation

    t0 = time.perf_counter()
    check()
    assert time.perf_counter() - t0 < 60
