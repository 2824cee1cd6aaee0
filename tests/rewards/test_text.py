"""Pure-Python parts: output comparison, formats, code extraction, feedback, math, synthetic tasks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marljax.rewards import (
    CallTest,
    ExecutionResult,
    Limits,
    Status,
    TestResult,
    compare_stdout,
    compare_value,
    error_feedback,
    extract_answer,
    extract_code,
    humaneval_program,
    io_program,
    is_equivalent,
    math_reward,
    run_many,
    run_program,
)
from marljax.tasks import make_task, make_tasks


def test_package_does_not_import_jax():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, marljax.rewards; print('jax' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "actual,expected,ok",
    [
        ("3\n", "3", True),
        ("3  \n\n", "3\n", True),
        ("1 2\n3\n", "1 2\n3", True),
        ("1.0\n", "1.00\n", True),
        ("1e2", "100", True),
        ("3\n", "4\n", False),
        ("1 2", "1  2", True),
        ("1 2 3", "1 2", False),
        ("0.1", "0.10000001", False),
        ("", "0", False),
        ("yes", "YES", False),
        ("a\r\nb\r\n", "a\nb", True),
    ],
)
def test_compare_stdout(actual, expected, ok):
    assert compare_stdout(actual, expected) is ok


def test_compare_value_is_exact_with_tuples_as_lists():
    assert compare_value("[1, 2]", (1, 2)) and compare_value("[[1, 2]]", [(1, 2)])
    assert compare_value("2", 2.0) and not compare_value("2.0000001", 2.0)
    assert not compare_value("not json", 1) and compare_value("null", None)


def test_io_program_formats():
    p = io_program("x", ["[1, 2]\n3", "[5]\n0"], ["[3]", "7"], fn_name="f", public=1)
    assert p.tests[0] == CallTest(([1, 2], 3), [3], "public") and p.tests[1].split == "private"
    s = io_program("x", ["1\n"], ["2\n"], private_inputs=["3\n"], private_outputs=["4\n"])
    assert [t.split for t in s.tests] == ["public", "private"] and s.mode == "stdin"


def test_humaneval_program_accepts_full_definitions():
    prob = {
        "prompt": 'from typing import List\n\ndef g(xs: List[int]) -> int:\n    """doc"""\n',
        "entry_point": "g",
        "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n",
    }
    full = "def g(xs: List[int]) -> int:\n    return sum(xs)\n"
    body = "    return sum(xs)\n"
    res = run_many([humaneval_program(prob, full), humaneval_program(prob, body)])
    assert [r.status for r in res] == [Status.PASSED, Status.PASSED]


def test_extract_code():
    text = "Here:\n```python\ndef a():\n    return 1\n```\nand better:\n```py\ndef b():\n    return 2\n```\n"
    ex = extract_code(text)
    assert ex.code == "def b():\n    return 2" and ex.syntax_ok and ex.source == "fence"
    assert extract_code("def c():\n    return 3\n").source == "text"
    bad = extract_code("```python\ndef d(:\n```")
    assert not bad.syntax_ok and "SyntaxError" in bad.error
    assert extract_code("```bash\nls\n```").code == ""
    assert extract_code("").source == "none"
    truncated = extract_code("Sure!\n```python\ndef e():\n    return 5\n")
    assert truncated.code == "def e():\n    return 5" and truncated.syntax_ok
    assert extract_code("```\nx = 1\n```").code == "x = 1"


def _res(status, tests=(), **kw):
    return ExecutionResult(status, tuple(tests), **kw)


def test_feedback_wrong_answer_shows_input_expected_actual():
    r = run_program(io_program("def f(x):\n    return x * 2\n", [[3], [4]], [6, 9], fn_name="f", public=2))
    fb = error_feedback(r)
    assert (
        "Wrong answer" in fb and "Input: 4" in fb and "Expected output: 9" in fb and "Actual output: 8" in fb
    )
    assert "Passed 1 of 2 tests" in fb
    ok = run_program(io_program("def f(x):\n    return x * 2\n", [[3]], [6], fn_name="f"))
    assert ok.passed and error_feedback(ok) == ""


def test_feedback_runtime_error_timeout_and_private_tests_hidden():
    rt = TestResult(
        0,
        "public",
        Status.RUNTIME_ERROR,
        input="1",
        exc_type="ZeroDivisionError",
        message="division by zero",
        traceback="Traceback...\nZeroDivisionError: division by zero",
    )
    fb = error_feedback(_res(Status.RUNTIME_ERROR, [rt]))
    assert "ZeroDivisionError: division by zero" in fb and "Traceback" in fb
    to = TestResult(0, "public", Status.TIMEOUT, input="10**9")
    assert "Time limit exceeded" in error_feedback(_res(Status.TIMEOUT, [to]))
    secret = TestResult(1, "private", Status.WRONG_ANSWER, input="SECRET-INPUT", expected="E", actual="A")
    fb = error_feedback(_res(Status.WRONG_ANSWER, [TestResult(0, "public", Status.PASSED), secret]))
    assert "SECRET-INPUT" not in fb
    # only a held-out test failed: say the public ones passed, nothing about a "failure before the tests"
    assert fb == "All 1 public tests passed."
    long = TestResult(0, "public", Status.WRONG_ANSWER, input="x" * 10_000, expected="y" * 10_000, actual="z")
    assert len(error_feedback(_res(Status.WRONG_ANSWER, [long]), max_chars=500)) <= 500
    assert "No code" in error_feedback(_res(Status.NO_CODE))
    assert "Syntax error" in error_feedback(
        _res(Status.SYNTAX_ERROR, error_type="SyntaxError", error_message="bad")
    )


@pytest.mark.parametrize(
    "text,answer",
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}} wait no \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("x = 3, then y = -7.5", "-7.5"),
        ("total 1,234,567 apples", "1234567"),
        ("no numbers", None),
        ("\\boxed{\\sqrt{\\frac{1}{2}}}", "\\sqrt{\\frac{1}{2}}"),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "a,b,eq",
    [
        ("42", "42.0", True),
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "\\dfrac{1}{2}", True),
        ("-3/6", "-0.5", True),
        ("1,000", "1000", True),
        ("$7$", "7", True),
        ("\\text{5 }", "5", True),
        ("0.333", "1/3", False),
        ("2", "3", False),
        ("x = 4", "4", True),
        ("10^{\\circ}", "10", True),
    ],
)
def test_is_equivalent_exact(a, b, eq):
    assert is_equivalent(a, b) is eq


def test_is_equivalent_symbolic_with_sympy():
    pytest.importorskip("sympy")
    assert is_equivalent("2\\sqrt{2}", "\\sqrt{8}")
    assert is_equivalent("\\frac{\\pi}{2}", "pi/2")
    assert not is_equivalent("\\sqrt{2}", "1.414")
    assert not is_equivalent("__import__('os')", "0")  # never evaluated


def test_math_reward():
    assert math_reward("... hence \\boxed{\\frac{2}{4}}", "0.5") == 1.0
    assert math_reward("I think 7", "8") == 0.0


def test_synthetic_tasks_are_deterministic_and_verifiable(no_leaks):
    assert make_task(3, 2) == make_task(3, 2) and make_task(3, 2) != make_task(4, 2)
    tasks = make_tasks(12, seed=100, difficulty=3) + make_tasks(6, seed=0, difficulty=1) + make_tasks(6, 0, 6)
    programs = [t.program(t.reference) for t in tasks]
    # A solution that memorises the public examples passes them but not the held-out ones.
    cheats = []
    for t in tasks:
        table = {repr(a): o for a, o in t.public}
        cheats.append(t.program(f"def f(*a):\n    return {table!r}.get(repr(tuple(a)), 0)\n"))
    res = run_many(programs + cheats, limits=Limits(test_timeout_s=5))
    assert all(r.passed for r in res[: len(tasks)])
    for r in res[len(tasks) :]:
        assert r.pass_fraction("public") == 1.0
    assert sum(r.pass_fraction("private") < 1.0 for r in res[len(tasks) :]) >= len(tasks) - 2
    assert all(len(t.public) == 4 and len(t.private) == 8 for t in tasks)
    assert "f(" in tasks[0].prompt and str(tasks[0].public[0][1]) in tasks[0].prompt


def test_synthetic_difficulty_knob_and_stdin_variant(no_leaks):
    easy, hard = make_task(1, 1), make_task(1, 8)
    assert easy.reference.count("(") < hard.reference.count("(")
    with pytest.raises(ValueError):
        make_task(0, 0)
    t = make_task(5, 2)
    code = "import sys\n" + t.reference + "print(f(int(sys.stdin.read())))\n"
    assert run_program(t.program(code, io="stdin")).passed
