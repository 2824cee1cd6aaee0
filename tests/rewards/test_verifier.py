"""Problem accessors, the Verifier over a program runner, and the public-test feedback."""

import pytest

from marljax.rewards import (
    AssertTest,
    ExecutionResult,
    Program,
    SandboxVerifier,
    Status,
    TestResult,
    public_feedback,
)
from marljax.tasks import parse_row

STDIO = {
    "task_id": "inc",
    "question": "Write f(x) returning x + 1.",
    "fn_name": "f",
    "inputs": [[1], [2]],
    "outputs": [2, 3],
    "public": 1,
    "solution": "def f(x):\n    return x + 1\n",
}
MBPP = {
    "task_id": 7,
    "text": "Add one.",
    "test_list": ["assert not (add_one(1) == 3)", "assert add_one(1) == 2"],
}
HUMANEVAL = {
    "task_id": "h/0",
    "prompt": "def g(x):\n",
    "test": "def check(c):\n    assert c(1)\n",
    "entry_point": "g",
}
MATH = {"id": "m", "problem": "1 + 1?", "answer": 2}


def test_problem_accessors():
    stdio, mbpp, human, math = (
        parse_row(r, s, f"<t>:{k}")
        for k, (r, s) in enumerate(
            [(STDIO, "stdio"), (MBPP, "mbpp"), (HUMANEVAL, "humaneval"), (MATH, "math")]
        )
    )
    assert [p.entry_point for p in (stdio, mbpp, human, math)] == ["f", "add_one", "g", None]
    assert [p.is_math for p in (stdio, mbpp, human, math)] == [False, False, False, True]
    assert stdio.solution == STDIO["solution"] and mbpp.solution is None
    assert math.answer == "2" and stdio.answer is None
    stdin = {**STDIO, "fn_name": None, "inputs": ["1\n", "2\n"], "outputs": ["2\n", "3\n"]}
    assert parse_row(stdin, "stdio", "<t>").entry_point is None  # a stdin program
    with pytest.raises(ValueError, match="no program"):
        math.program("x = 1")


class FakeRunner:
    def __init__(self):
        self.seen = []

    def map(self, programs):
        self.seen += [p.code for p in programs]
        return [ExecutionResult(Status.PASSED if "ok" in p.code else Status.WRONG_ANSWER) for p in programs]


def test_runs_each_distinct_program_once():
    runner = FakeRunner()
    verifier = SandboxVerifier(runner)
    progs = [Program(code=c, tests=(AssertTest("assert True"),)) for c in ["ok", "bad", "ok"]]
    out = verifier.run(progs)
    assert runner.seen == ["ok", "bad"] and out[0] is out[2]
    assert verifier.run(progs, keys=[1, 2, 3]) and runner.seen[2:] == ["ok", "bad", "ok"]


def test_math_needs_no_sandbox_and_code_does():
    math = parse_row(MATH, "math", "<t>")
    scores = SandboxVerifier().score([math, math], ["\\boxed{2}", "\\boxed{3}"])
    assert [(s.reward, s.passed, s.result) for s in scores] == [(1.0, True, None), (0.0, False, None)]
    with pytest.raises(ValueError, match="SandboxPool"):
        SandboxVerifier().score([parse_row(STDIO, "stdio", "<t>")], ["```python\nx = 1\n```"])
    with pytest.raises(ValueError, match="SandboxPool"):
        SandboxVerifier().run([Program(code="x = 1", tests=())])


def result(status, *tests):
    return ExecutionResult(
        status,
        tests=tuple(
            TestResult(
                i, split, Status.PASSED if ok else Status.WRONG_ANSWER, input="1", expected="2", actual="3"
            )
            for i, (split, ok) in enumerate(tests)
        ),
    )


def test_public_feedback():
    assert public_feedback(None) == ""
    assert (
        public_feedback(result(Status.PASSED, ("public", True), ("private", True)))
        == "All 1 public tests passed."
    )
    hidden = result(Status.WRONG_ANSWER, ("public", True), ("public", True), ("private", False))
    assert public_feedback(hidden) == "All 2 public tests passed."  # the private failure stays hidden
    assert public_feedback(result(Status.WRONG_ANSWER, ("private", False))) == "No public tests."
    wrong = public_feedback(result(Status.WRONG_ANSWER, ("public", False), ("private", False)))
    assert wrong.startswith("Passed 0 of 1 tests.") and "Expected output: 2" in wrong
    assert "No code" in public_feedback(ExecutionResult(Status.NO_CODE))
