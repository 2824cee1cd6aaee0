"""Turn a sandboxed run's records, output and exit status into an ``ExecutionResult``.

Only records carrying the run's nonce count (see ``sandbox.py``); stdio and call
tests are judged here, in the parent, against outputs the child never saw.
"""

from __future__ import annotations

import json
import signal

from .formats import AssertTest, CallTest, Program, StdioTest, compare_stdout, compare_value
from .results import ExecutionResult, Isolation, Status, TestResult

_LOAD_FAILURES = frozenset(
    {Status.SYNTAX_ERROR, Status.RUNTIME_ERROR, Status.TIMEOUT, Status.MEMORY_EXCEEDED}
)


def _seconds(value) -> float:
    """A record's duration: a finite non-negative number, else 0 (records are read, never trusted)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf"):
        return float(value)
    return 0.0


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _status(value) -> Status:
    """A record's status; anything unknown is a runtime error."""
    try:
        return Status(value)
    except (ValueError, TypeError):
        return Status.RUNTIME_ERROR


def not_run(program: Program) -> tuple[TestResult, ...]:
    return tuple(TestResult(i, t.split, Status.NOT_RUN) for i, t in enumerate(program.tests))


def _signal_of(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if returncode > 128:  # bwrap / shells report 128 + signal
        return returncode - 128
    return None


def classify(
    program: Program, outcome: dict, iso: Isolation, returncode: int | None, wall: float
) -> ExecutionResult:
    records = outcome["records"]
    killed = outcome["killed"]
    load = next((r for r in records if r.get("e") == "load"), None)
    ready = next((r for r in records if r.get("e") == "ready"), None)
    ends: dict[int, dict] = {}
    for r in records:
        if r.get("e") == "end" and isinstance(r.get("i"), int):
            ends.setdefault(r["i"], r)
    started = [r["i"] for r in records if r.get("e") == "start" and isinstance(r.get("i"), int)]
    done = any(r.get("e") == "done" for r in records)
    tail = outcome["output"][-2000:]
    sig = _signal_of(returncode) if not killed else None
    common = dict(
        isolation=iso,
        wall_s=wall,
        exit_code=returncode,
        output_tail=tail,
        startup_s=_seconds(ready.get("startup_s")) if ready else 0.0,
        extra={"spawn_s": outcome.get("spawn_s", 0.0), "collect_s": outcome.get("collect_s", 0.0)},
    )

    # Why the process stopped, when it stopped early.
    def abnormal() -> tuple[Status, str, str]:
        if killed == "timeout":
            return Status.TIMEOUT, "Timeout", "time limit exceeded"
        if killed == "output":
            return Status.RUNTIME_ERROR, "OutputLimitExceeded", "process wrote more than the output limit"
        if killed == "records":
            return Status.RUNTIME_ERROR, "ProtocolError", "result channel flooded"
        if sig == signal.SIGXCPU:
            return Status.TIMEOUT, "Timeout", "CPU time limit exceeded"
        if sig == signal.SIGKILL:
            return Status.RUNTIME_ERROR, "Killed", "killed by SIGKILL (by itself, or the kernel's OOM killer)"
        if sig is not None:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            return Status.RUNTIME_ERROR, name, f"process died with {name}"
        return (
            Status.RUNTIME_ERROR,
            "EarlyExit",
            f"process exited (code {returncode}) before the tests finished",
        )

    if load is not None and load.get("status") != "ok":
        st = _status(load.get("status"))
        return ExecutionResult(
            st if st in _LOAD_FAILURES else Status.RUNTIME_ERROR,  # a load never passes
            not_run(program),
            error_type=_text(load.get("exc_type")),
            error_message=_text(load.get("message")),
            error_traceback=_text(load.get("traceback")),
            **common,
        )

    tests: list[TestResult] = []
    prog_err = None if done else abnormal()
    tests_s = 0.0
    for i, spec in enumerate(program.tests):
        rec = ends.get(i)
        if rec is not None:
            tests_s += _seconds(rec.get("time_s"))
            tests.append(_test_result(i, spec, rec, program.mode))
        elif i in started:  # it was running when the process stopped
            st, et, msg = prog_err
            tests.append(TestResult(i, spec.split, st, input=_input_text(spec), exc_type=et, message=msg))
        else:
            tests.append(
                TestResult(
                    i, spec.split, Status.NOT_RUN, message="not run: the process ended before this test"
                )
            )
    failures = [t for t in tests if not t.passed]
    if failures and failures[0].status is not Status.NOT_RUN:
        status = failures[0].status
    elif prog_err is not None:
        status = prog_err[0]
    else:
        status = Status.PASSED
    err = prog_err or (None, None, None)
    return ExecutionResult(
        status, tuple(tests), error_type=err[1], error_message=err[2], tests_s=tests_s, **common
    )


def _input_text(spec) -> str:
    if isinstance(spec, StdioTest):
        return spec.input
    if isinstance(spec, CallTest):
        return ", ".join(json.dumps(a) for a in spec.args)
    return spec.code.strip()


def _test_result(i: int, spec, rec: dict, mode: str) -> TestResult:
    status = rec.get("status")
    t = _seconds(rec.get("time_s"))
    if status == "ok" and not isinstance(spec, AssertTest):  # stdio / call: the parent judges
        actual = _text(rec.get("actual")) or ""
        if isinstance(spec, StdioTest):
            ok = compare_stdout(actual, spec.output)
            expected = spec.output
        else:
            ok = rec.get("json") is True and compare_value(actual, spec.output)
            expected = json.dumps(spec.output)
        if ok:
            return TestResult(i, spec.split, Status.PASSED, time_s=t)
        return TestResult(
            i,
            spec.split,
            Status.WRONG_ANSWER,
            input=_input_text(spec),
            expected=expected,
            actual=actual,
            time_s=t,
        )
    st = _status(status)
    if st in (Status.NOT_RUN, Status.NO_CODE) or (st is Status.PASSED and not isinstance(spec, AssertTest)):
        st = Status.RUNTIME_ERROR  # the child never judges stdio/call tests, and a test it ran did run
    return TestResult(
        i,
        spec.split,
        st,
        input=_text(rec.get("input")) or (None if st is Status.PASSED else _input_text(spec)),
        expected=_text(rec.get("expected")),
        actual=_text(rec.get("actual")),
        exc_type=_text(rec.get("exc_type")),
        message=_text(rec.get("message")),
        traceback=_text(rec.get("traceback")),
        time_s=t,
    )
