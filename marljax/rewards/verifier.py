"""Scoring answers: code through the sandbox, math through the answer checker.

A workflow holds a `Verifier`; the trainer's is a `SandboxVerifier` over its
`SandboxPool`, tests may pass a fake. Both entry points run each distinct
program once: a group's samples often repeat a program (low-entropy policies,
repeated asserts), and repeats share the first run's result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Protocol

from .extract import extract_code
from .formats import Program
from .math_verify import math_reward
from .problems import Problem
from .results import ExecutionResult


class ProgramRunner(Protocol):
    """What runs programs: a `SandboxPool`, or a fake in tests."""

    def map(self, programs: Sequence[Program]) -> list[ExecutionResult]: ...


@dataclasses.dataclass(frozen=True)
class Score:
    """reward in [0, 1] (fraction of tests passed, or answer correct), passed: all tests
    passed; result: the sandbox's `ExecutionResult` (None for math)."""

    reward: float
    passed: bool
    result: ExecutionResult | None = None


class Verifier(Protocol):
    def run(
        self, programs: Sequence[Program], keys: Sequence[Hashable] | None = None
    ) -> list[ExecutionResult]:
        """Each program's result, in order; programs with equal keys (default: equal programs) run once."""

    def score(
        self, problems: Sequence[Problem], texts: Sequence[str], split: str | None = None
    ) -> list[Score]:
        """`texts[i]` scored against `problems[i]` on all tests (split None) or one split."""


def run_deduplicated(
    pool: ProgramRunner | None, programs: Sequence[Program], keys: Sequence[Hashable] | None = None
) -> list[ExecutionResult]:
    """`pool.map(programs)`, running each distinct key once; its repeats get the same result object.

    keys: one per program, equal for programs that must give the same result; default the
    programs themselves, which must then be hashable (assert tests are; call tests holding
    lists are not, and compare 1 == True, so pass keys for those).  The pool is not used
    when `programs` is empty.
    """
    keys = programs if keys is None else keys
    if len(keys) != len(programs):
        raise ValueError(f"{len(programs)} programs but {len(keys)} keys")
    first: dict = {}
    for key, program in zip(keys, programs):
        first.setdefault(key, program)
    if first and pool is None:
        raise ValueError("running programs needs a SandboxPool")
    ran = dict(zip(first, pool.map(list(first.values())))) if first else {}
    return [ran[key] for key in keys]


def score_texts(
    problems: Sequence[Problem], texts: Sequence[str], pool: ProgramRunner | None, split: str | None = None
) -> list[Score]:
    """Score `texts[i]` against `problems[i]`; code runs in parallel in `pool`, each distinct
    (problem object, extracted program) once, and its repeats share that verdict.

    split: None scores on all tests, "public" / "private" on that split only.
    """
    if len(problems) != len(texts):
        raise ValueError(f"{len(problems)} problems but {len(texts)} texts")
    scores: list[Score | None] = [None] * len(texts)
    code_idx = []
    for i, (p, t) in enumerate(zip(problems, texts)):
        if p.is_math:
            r = math_reward(t, p.answer)
            scores[i] = Score(r, r == 1.0)
        else:
            code_idx.append(i)
    if code_idx:
        if pool is None:
            raise ValueError("code problems need a SandboxPool")
        codes = [extract_code(texts[i]).code for i in code_idx]
        ran = run_deduplicated(
            pool,
            [problems[i].program(c) for i, c in zip(code_idx, codes)],
            [(id(problems[i]), c) for i, c in zip(code_idx, codes)],
        )
        for i, res in zip(code_idx, ran):
            frac = res.pass_fraction(split)
            scores[i] = Score(frac, frac == 1.0, res)
    return scores


class SandboxVerifier:
    """The `Verifier` over a program runner (a `SandboxPool`); without one it scores math only."""

    def __init__(self, pool: ProgramRunner | None = None):
        self.pool = pool

    def run(
        self, programs: Sequence[Program], keys: Sequence[Hashable] | None = None
    ) -> list[ExecutionResult]:
        return run_deduplicated(self.pool, programs, keys)

    def score(
        self, problems: Sequence[Problem], texts: Sequence[str], split: str | None = None
    ) -> list[Score]:
        return score_texts(problems, texts, self.pool, split)
