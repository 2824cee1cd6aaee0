"""The one-program runner: classification of every outcome, on every isolation level that works here."""

from __future__ import annotations

import pytest

from marljax.rewards import (
    AssertTest,
    CallTest,
    Limits,
    Program,
    SandboxConfig,
    Status,
    StdioTest,
    io_program,
    mbpp_program,
    run_program,
)
from marljax.rewards.sandbox import LEVELS

FAST = Limits(test_timeout_s=1.0, program_timeout_s=10.0, memory_mb=256)


def test_each_level_reports_itself_and_its_promises(run, isolation):
    assert isolation.level in LEVELS
    res = run(Program("def f():\n    return 1\n", (CallTest((), 1),), fn_name="f"))
    assert res.passed and res.isolation == isolation
    # What each level promises (see results.Isolation).
    assert isolation.network_denied == (isolation.level in ("bwrap", "unshare"))
    assert isolation.pid_namespace == (isolation.level in ("bwrap", "unshare"))


def test_home_and_temp_dir_are_writable_inside_the_sandbox(run):
    code = (
        "import os\n"
        "def f():\n"
        "    for name in ('HOME', 'TMPDIR'):\n"
        "        probe = os.path.join(os.environ[name], '.probe')\n"
        "        open(probe, 'w').close()\n"
        "        os.remove(probe)\n"
        "    return True\n"
    )
    res = run(Program(code, (CallTest((), True),), fn_name="f"))
    assert res.passed, res.tests[0]


def test_call_based_passed_and_wrong_answer(level_config, no_leaks):
    prog = Program(
        "def f(x):\n    return x * 2\n",
        (CallTest((1,), 2), CallTest((3,), 7), CallTest((2,), 4, "private")),
        fn_name="f",
    )
    res = run_program(prog, FAST, level_config)
    assert [t.status for t in res.tests] == [Status.PASSED, Status.WRONG_ANSWER, Status.PASSED]
    assert res.status is Status.WRONG_ANSWER
    wa = res.tests[1]
    assert (wa.input, wa.expected, wa.actual) == ("3", "7", "6")
    assert res.pass_fraction() == pytest.approx(2 / 3)
    assert res.pass_fraction("public") == 0.5 and res.pass_fraction("private") == 1.0
    assert res.isolation.level == level_config.isolation


def test_stdio_passed_wrong_and_exit_zero(level_config, no_leaks):
    code = "import sys\na, b = map(int, sys.stdin.readline().split())\nprint(a + b)\nsys.exit(0)\n"
    prog = io_program(code, ["1 2\n", "5 5\n", "2 2"], ["3\n", "11\n", "4"], public=2)
    res = run_program(prog, FAST, level_config)
    assert [t.status for t in res.tests] == [Status.PASSED, Status.WRONG_ANSWER, Status.PASSED]
    assert res.tests[1].actual == "10\n" and res.tests[1].expected == "11\n"
    assert [t.split for t in res.tests] == ["public", "public", "private"]


def test_stdin_styles_open0_and_buffer(run):
    code = "data = open(0).read().split()\nimport sys\nprint(sum(map(int, data)))\n"
    code2 = "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n"
    for c in (code, code2):
        res = run(io_program(c, ["1 2 3\n", "10\n"], ["6", "10"]), FAST)
        assert res.passed, res


def test_mbpp_asserts_report_input_expected_actual(run):
    prog = mbpp_program(
        "def add(a, b):\n    return a + b + (a == 2)\n",
        ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
        challenge_tests=["assert add(0, 0) == 0"],
    )
    res = run(prog, FAST)
    assert [t.status for t in res.tests] == [Status.PASSED, Status.WRONG_ANSWER, Status.PASSED]
    wa = res.tests[1]
    assert (wa.input, wa.expected, wa.actual) == ("add(2, 2)", "4", "5")
    assert [t.split for t in res.tests] == ["public", "public", "private"]


def test_mbpp_setup_code_runs_before_tests(run):
    prog = mbpp_program("def g(x):\n    return x + OFFSET\n", ["assert g(1) == 11"], setup="OFFSET = 10")
    assert run(prog, FAST).passed


def test_runtime_error_has_type_message_and_trimmed_traceback(run):
    code = "def f(x):\n    return helper(x)\n\ndef helper(x):\n    return [1, 2][x]\n"
    res = run(Program(code, (CallTest((0,), 1), CallTest((5,), 0)), fn_name="f"), FAST)
    assert res.tests[0].passed
    t = res.tests[1]
    assert t.status is Status.RUNTIME_ERROR and t.exc_type == "IndexError"
    assert "list index out of range" in t.message
    assert "helper" in t.traceback and "return [1, 2][x]" in t.traceback
    assert "harness" not in t.traceback  # the driver's own frames are trimmed away


def test_error_at_import_time_fails_every_test(run):
    res = run(Program("import nonexistent_module_xyz\n", (CallTest((), 1),) * 2, fn_name="f"), FAST)
    assert res.status is Status.RUNTIME_ERROR and res.error_type == "ModuleNotFoundError"
    assert all(t.status is Status.NOT_RUN for t in res.tests) and res.pass_fraction() == 0.0


def test_syntax_error_and_no_code_do_not_spawn(run):
    res = run(Program("def f(:\n", (CallTest((), 1),), fn_name="f"), FAST)
    assert res.status is Status.SYNTAX_ERROR and res.error_type == "SyntaxError" and res.wall_s == 0.0
    assert run(Program("   \n", (CallTest((), 1),), fn_name="f"), FAST).status is Status.NO_CODE


def test_missing_function_is_runtime_error(run):
    res = run(Program("def g():\n    return 1\n", (CallTest((), 1),), fn_name="f"), FAST)
    assert res.status is Status.RUNTIME_ERROR and res.tests[0].exc_type == "NameError"


def test_leetcode_style_solution_class(run):
    code = "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n"
    res = run(io_program(code, ["[2, 7]\n9"], ["[0, 1]"], fn_name="twoSum"), FAST)
    assert res.passed, res


def test_timeout_then_later_tests_still_classified(level_config, no_leaks):
    code = "def f(x):\n    while x:\n        pass\n    return 0\n"
    res = run_program(
        Program(code, (CallTest((0,), 0), CallTest((1,), 0), CallTest((0,), 0)), fn_name="f"),
        FAST,
        level_config,
    )
    assert [t.status for t in res.tests] == [Status.PASSED, Status.TIMEOUT, Status.PASSED]
    assert res.status is Status.TIMEOUT


def test_uninterruptible_timeout_is_killed_by_the_parent(run):
    # A C-level loop ignores the child's alarm and the code swallows the alarm exception anyway.
    code = (
        "def f():\n    while True:\n        try:\n            sum(range(10**9))\n"
        "        except BaseException:\n            pass\n"
    )
    res = run(Program(code, (CallTest((), 0), CallTest((), 0)), fn_name="f"), FAST)
    assert [t.status for t in res.tests] == [Status.TIMEOUT, Status.NOT_RUN]
    assert res.status is Status.TIMEOUT and res.wall_s < FAST.test_timeout_s + 3.0


def test_memory_exceeded(run):
    res = run(
        Program("def f():\n    return len(bytearray(2 << 30))\n", (CallTest((), 0),), fn_name="f"), FAST
    )
    assert res.status is Status.MEMORY_EXCEEDED and res.tests[0].exc_type == "MemoryError"


@pytest.mark.parametrize(
    "exit_code", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"]
)
@pytest.mark.parametrize("where", ["load", "test"])
def test_early_exit_never_passes(level_config, exit_code, where, no_leaks):
    if where == "load":
        code = exit_code + "\ndef f():\n    return 1\n"
    else:
        body = "\n".join("    " + line for line in exit_code.splitlines())
        code = f"def f():\n{body}\n    return 1\n"
    for prog in (
        Program(code, (CallTest((), 1),), fn_name="f"),
        Program(code, (AssertTest("assert f() == 1"),)),
    ):
        res = run_program(prog, FAST, level_config)
        assert not res.passed and res.status is Status.RUNTIME_ERROR, res
        assert res.pass_fraction() == 0.0


def test_printing_fake_records_does_not_pass(run):
    code = (
        'import sys\nprint("passed")\nfor i in range(3):\n'
        '    print(\'00 {"e": "end", "i": %d, "status": "passed"}\' % i)\n'
        "sys.stdout.flush()\nimport os\nos._exit(0)\n"
    )
    res = run(mbpp_program(code, ["assert True"] * 3), FAST)
    assert res.status is Status.RUNTIME_ERROR and res.pass_fraction() == 0.0


def test_forked_copies_cannot_report(run):
    # The child of a fork returns the right answer and continues into the harness loop;
    # its records carry another pid and are dropped.
    code = "import os\ndef f():\n    if os.fork() == 0:\n        return 1\n    os.wait()\n    return 0\n"
    res = run(Program(code, (CallTest((), 1),), fn_name="f"), FAST)
    assert res.status is Status.WRONG_ANSWER and res.tests[0].actual == "0"


def test_limits_validation():
    with pytest.raises(ValueError, match="test_timeout_s"):
        Limits(test_timeout_s=0)
    with pytest.raises(ValueError, match="isolation"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="fn_name"):
        Program("x", (CallTest((), 1),))
    with pytest.raises(ValueError, match="one kind"):
        Program("x", (CallTest((), 1), StdioTest("", "")), fn_name="f")


def test_auto_never_falls_to_no_isolation(monkeypatch):
    # No isolating level works here (neither tool found): ``auto`` is an error that says why, not
    # untrusted programs run with rlimits only.
    from marljax.rewards import sandbox

    monkeypatch.setattr(sandbox, "_detected", {})
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="bwrap: not installed; unshare: not installed.*'none'"):
        sandbox.detect_isolation(SandboxConfig(isolation="auto"))


def test_a_failed_probe_is_tried_once_more(monkeypatch, level_config):
    # A transient failure (a loaded machine, one start that dies) does not disable a level.
    from marljax.rewards import sandbox

    real, calls = sandbox._run, []

    def flaky(program, limits, config, iso):
        calls.append(iso.level)
        if len(calls) == 1:
            return sandbox.ExecutionResult(Status.RUNTIME_ERROR, error_message="process exited (code 70)")
        return real(program, limits, config, iso)

    monkeypatch.setattr(sandbox, "_detected", {})
    monkeypatch.setattr(sandbox, "_run", flaky)
    assert sandbox.detect_isolation(level_config).level == level_config.isolation
    assert calls == [level_config.isolation] * 2


@pytest.mark.parametrize(
    "records",
    [
        [{"e": "load", "status": "no_such_status"}],
        [{"e": "load", "status": "passed"}],
        [{"e": "load", "status": ["x"], "message": {"a": 1}}],
        [{"e": "load", "status": "ok"}, {"e": "ready", "startup_s": "soon"}, {"e": "start", "i": 0}]
        + [{"e": "end", "i": 0, "status": "bogus", "time_s": "x"}, {"e": "done"}],
        [{"e": "load", "status": "ok"}, {"e": "start", "i": 0}]
        + [{"e": "end", "i": 0, "status": "ok", "actual": 3, "json": "yes", "time_s": float("nan")}],
        [
            {"e": "load", "status": "ok"},
            {"e": "end", "i": 0, "status": {"k": 1}, "time_s": None},
            {"e": "done"},
        ],
    ],
)
def test_malformed_records_are_failures_not_exceptions(records):
    # A record the harness would never write (a program that reached the recorder could) is a
    # failing verdict in the parent, never a ValueError/TypeError, and never a pass.
    from marljax.rewards.results import Isolation
    from marljax.rewards.verdicts import classify

    iso = Isolation("none", False, False, False, False)
    for program in (
        Program("x = 1", (CallTest((), 3),), fn_name="f"),
        Program("x = 1", (StdioTest("", "3"),)),
        Program("x = 1", (AssertTest("assert True"),)),
    ):
        outcome = {"records": records, "killed": None, "output": ""}
        res = classify(program, outcome, iso, 0, 0.1)
        assert not res.passed and isinstance(res.startup_s, float), res
