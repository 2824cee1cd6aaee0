"""Typed results of running a program against its tests."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(enum.StrEnum):
    """Outcome class of one test or of a whole program.

    ``not_run`` only appears on tests: the program was killed (e.g. an earlier
    test timed out) before the test could run.  It counts as a failure.
    """

    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_EXCEEDED = "memory_exceeded"
    SYNTAX_ERROR = "syntax_error"
    NO_CODE = "no_code"
    NOT_RUN = "not_run"

    def __str__(self) -> str:  # "passed", not "Status.PASSED"
        return self.value


@dataclass(frozen=True)
class Isolation:
    """Which isolation was in force for a run.

    level: ``"bwrap"`` (bubblewrap: fresh net/pid/ipc/uts namespaces, read-only
      view of the system, only the working directory writable),
      ``"unshare"`` (util-linux unshare: fresh net/pid/mount namespaces and a
      minimal root like bubblewrap's, /sandbox a sized tmpfs), or ``"none"`` (rlimits,
      scrubbed environment and process-group kill only).
    network_denied: the program has no network interface but loopback-down.
    pid_namespace: processes it starts die with it and cannot see the host's.
    privileges_dropped: it runs as a throw-away uid (so RLIMIT_NPROC caps its
      process count and it cannot write files the parent's user owns).
    fs_confined: writes outside its working directory cannot reach the host
      (other than through files world-writable by any uid).
    """

    level: str
    network_denied: bool
    pid_namespace: bool
    privileges_dropped: bool
    fs_confined: bool
    note: str = ""


@dataclass(frozen=True)
class TestResult:
    """One test.  ``input``/``expected``/``actual`` are text (``repr`` or raw stdout)."""

    __test__ = False  # not a pytest test class

    index: int
    split: str
    status: Status
    input: str | None = None
    expected: str | None = None
    actual: str | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    time_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED


@dataclass(frozen=True)
class ExecutionResult:
    """A whole program.

    status: ``passed`` iff every test passed; otherwise the status of the first
      failing test (or of the load phase: ``syntax_error``, ``runtime_error``
      at import time, ...).
    error_*: details of a program-level failure (load phase, early exit, a
      signal, an output flood) when no single test carries them.
    timings: ``wall_s`` (spawn to reap, parent clock), ``startup_s`` (child
      interpreter + isolation until ready, child clock), ``tests_s`` (sum of
      per-test times).
    """

    status: Status
    tests: tuple[TestResult, ...] = ()
    isolation: Isolation | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_traceback: str | None = None
    wall_s: float = 0.0
    startup_s: float = 0.0
    tests_s: float = 0.0
    exit_code: int | None = None
    output_tail: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    def pass_fraction(self, split: str | None = None) -> float:
        """Fraction of tests passed (all tests, or one split); 0.0 with no tests."""
        tests = [t for t in self.tests if split is None or t.split == split]
        if not tests:
            return 1.0 if (self.passed and split is None) else 0.0
        return sum(t.passed for t in tests) / len(tests)

    def first_failure(self, split: str | None = None) -> TestResult | None:
        for t in self.tests:
            if (split is None or t.split == split) and not t.passed:
                return t
        return None
