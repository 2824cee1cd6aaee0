"""Test specifications: HumanEval, MBPP and stdin/stdout or call-based cases.

A :class:`Program` is what the sandbox runs: untrusted ``code``, optional
trusted ``setup`` code run after it, and a tuple of tests of one kind:

* :class:`AssertTest` - a snippet of test code run in the program's namespace
  (HumanEval's ``check(candidate)``, one MBPP ``assert``).  Judged in a process the
  program cannot reach, which calls the program's functions over a pipe (``judge.py``).
* :class:`StdioTest` - feed ``input`` on stdin, compare stdout with ``output``
  (LiveCodeBench / CodeContests / APPS "standard input" problems).
* :class:`CallTest` - call ``fn_name(*args)`` (or ``Solution().fn_name``) and
  compare the JSON-encoded return value with ``output`` (LiveCodeBench
  "functional" / APPS call-based problems).

For stdio and call tests the expected output stays in the parent: the child
reports what the program produced and :func:`compare_stdout` /
:func:`compare_value` decide.  Every test carries a ``split`` (``"public"`` or
``"private"``); feedback only ever describes public tests.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

SPLITS = ("public", "private")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


@dataclass(frozen=True)
class AssertTest:
    code: str
    split: str = "public"

    def __post_init__(self) -> None:
        _check_split(self.split)


@dataclass(frozen=True)
class StdioTest:
    input: str
    output: str
    split: str = "public"

    def __post_init__(self) -> None:
        _check_split(self.split)
        if not isinstance(self.input, str) or not isinstance(self.output, str):
            raise TypeError("StdioTest input and output must be str")


@dataclass(frozen=True)
class CallTest:
    args: tuple
    output: Any
    split: str = "public"

    def __post_init__(self) -> None:
        _check_split(self.split)
        object.__setattr__(self, "args", tuple(self.args))
        json.dumps(list(self.args))  # args travel to the child as JSON


_MODE_OF = {AssertTest: "assert", StdioTest: "stdin", CallTest: "call"}


@dataclass(frozen=True)
class Program:
    """Untrusted ``code`` plus trusted ``setup`` and ``tests`` (all one kind)."""

    code: str
    tests: tuple = ()
    setup: str = ""
    fn_name: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tests", tuple(self.tests))
        kinds = {type(t) for t in self.tests}
        if len(kinds) > 1:
            raise ValueError(
                f"all tests of a program must be one kind, got {sorted(k.__name__ for k in kinds)}"
            )
        for t in self.tests:
            if type(t) not in _MODE_OF:
                raise TypeError(f"unknown test type {type(t).__name__}")
        if kinds == {CallTest} and not self.fn_name:
            raise ValueError("call-based tests need fn_name")

    @property
    def mode(self) -> str:
        return _MODE_OF[type(self.tests[0])] if self.tests else "assert"

    def with_code(self, code: str) -> Program:
        return Program(code=code, tests=self.tests, setup=self.setup, fn_name=self.fn_name)


# ------------------------------------------------------------------ builders
def humaneval_program(problem: Mapping[str, Any], completion: str, split: str = "public") -> Program:
    """HumanEval: ``prompt + completion`` then ``check(entry_point)``.

    ``completion`` may be a body continuation (like ``canonical_solution``) or
    a full definition of the entry point (common for chat models); in the
    second case it is appended after the prompt so helpers and imports from
    the prompt stay available and the new definition wins.
    """
    prompt, entry = problem["prompt"], problem["entry_point"]
    if re.search(rf"^(async\s+)?def\s+{re.escape(entry)}\s*\(", completion, re.M):
        code = prompt + "\n    pass\n\n" + completion
    else:
        code = prompt + completion
    test = AssertTest(problem["test"] + f"\n\ncheck({entry})\n", split=split)
    return Program(code=code, tests=(test,))


def mbpp_program(
    code: str,
    test_list: Sequence[str],
    setup: str = "",
    challenge_tests: Sequence[str] = (),
    test_imports: Sequence[str] = (),
) -> Program:
    """MBPP: each ``assert`` is one public test; ``challenge_test_list`` are private."""
    setup_code = "\n".join(list(test_imports) + ([setup] if setup else []))
    tests = [AssertTest(t, "public") for t in test_list]
    tests += [AssertTest(t, "private") for t in challenge_tests]
    return Program(code=code, tests=tuple(tests), setup=setup_code)


def io_program(
    code: str,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    fn_name: str | None = None,
    public: int | None = None,
    private_inputs: Sequence[Any] = (),
    private_outputs: Sequence[Any] = (),
) -> Program:
    """LiveCodeBench / CodeContests / APPS style cases.

    Without ``fn_name``: each input is stdin text and each output the expected
    stdout.  With ``fn_name``: each input is either a list of positional
    arguments or (LiveCodeBench functional format) a string of one JSON value
    per line; each output is the expected return value (or its JSON text).
    ``public``: how many of ``inputs`` are public (default all); the rest, and
    ``private_inputs``, are private.
    """
    if len(inputs) != len(outputs) or len(private_inputs) != len(private_outputs):
        raise ValueError("inputs and outputs must have the same length")
    n_pub = len(inputs) if public is None else public
    pairs = [(i, o, "public" if k < n_pub else "private") for k, (i, o) in enumerate(zip(inputs, outputs))]
    pairs += [(i, o, "private") for i, o in zip(private_inputs, private_outputs)]
    tests = []
    for inp, out, split in pairs:
        if fn_name is None:
            tests.append(StdioTest(str(inp), str(out), split))
        else:
            args = (
                [json.loads(line) for line in inp.splitlines() if line.strip()]
                if isinstance(inp, str)
                else list(inp)
            )
            if isinstance(out, str):
                with contextlib.suppress(json.JSONDecodeError):
                    out = json.loads(out)
            tests.append(CallTest(tuple(args), out, split))
    return Program(code=code, tests=tuple(tests), fn_name=fn_name)


def load_humaneval(path) -> list[dict]:
    """Read ``HumanEval.jsonl(.gz)`` into a list of problem dicts."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------- comparison
def _tokens_equal(a: str, b: str) -> bool:
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x == y:
            continue
        try:
            if Decimal(x) != Decimal(y):
                return False
        except (InvalidOperation, ValueError):
            return False
    return True


def _lines(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def compare_stdout(actual: str, expected: str) -> bool:
    """Judge-style stdout comparison.

    Lines are compared after dropping trailing whitespace and trailing blank
    lines; a line that differs as text still matches when its whitespace-split
    tokens are equal strings or equal decimal numbers (``1.0`` == ``1.00``),
    which is what LiveCodeBench's stdio grader accepts.  No float tolerance.
    """
    a, e = _lines(actual), _lines(expected)
    if len(a) != len(e):
        return False
    return all(x == y or _tokens_equal(x, y) for x, y in zip(a, e))


def _normalise(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items()}
    return value


def compare_value(actual_json: str, expected: Any) -> bool:
    """Exact equality of a JSON-decoded return value with ``expected`` (tuples as lists)."""
    try:
        actual = json.loads(actual_json)
    except (json.JSONDecodeError, TypeError):
        return False
    return _normalise(actual) == _normalise(expected)
