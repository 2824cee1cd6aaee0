"""Coder + tester (or a coder alone) refining code over turns: AT-GRPO's code environment.

Turn 0: the coder writes code, the tester writes ``assert`` tests for the
problem. Turn t >= 1: the coder refines the best code given the public-test
feedback (:func:`marljax.rewards.public_feedback`) and a summary of the
tester's best tests run against that code; the tester refines its tests given
the code and how its tests fared on it. Rewards:

* coder: fraction of all the problem's tests passed;
* tester, with ``n`` asserts (at most ``max_asserts``), ``v`` of them passed
  by the reference solution and ``c`` of those ``v`` failed by this turn's
  best code: ``(v + bonus * c) / n`` (0 with no asserts or no reference).
  Valid tests earn 1 each, valid tests that catch a bug in the code the coder
  carries forward earn ``1 + bonus``. The reference is the problem's
  ``solution``, else a coder candidate of this turn that passes all tests.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from marljax.envs.base import TurnResult, best_branch
from marljax.rewards import (
    AssertTest,
    ExecutionResult,
    Problem,
    Program,
    Verifier,
    extract_code,
    public_feedback,
)

TESTER_TASK = (
    "\n\nDo not solve the problem: write Python `assert` statements that a correct solution "
    "passes and a wrong one fails, in a ```python block."
)


def parse_asserts(text: str, limit: int) -> list[str]:
    """Top-level ``assert`` statements of the answer's code (line by line if it does not parse)."""
    code = extract_code(text).code
    try:
        tree = ast.parse(code)
        found = [ast.get_source_segment(code, n) for n in tree.body if isinstance(n, ast.Assert)]
    except (SyntaxError, ValueError):
        found = []
        for line in code.splitlines():
            try:
                if isinstance(ast.parse(line.strip()).body[0], ast.Assert):
                    found.append(line.strip())
            except (SyntaxError, ValueError, IndexError):
                pass
    return [a for a in found if a][:limit]


def _assert_summary(
    asserts: Sequence[str], result: ExecutionResult | None, whose: str, limit: int = 3
) -> str:
    """How the tester's asserts fared on the code: the count and the first failing ones."""
    if not asserts or result is None:
        return f"{whose} tests: none."
    ok = [t.passed for t in result.tests] if result.tests else [False] * len(asserts)
    lines = [f"{whose} tests on this code: passed {sum(ok)} of {len(asserts)}."]
    if not result.tests and result.error_type:
        lines.append(f"The code failed before the tests ran: {result.error_type}: {result.error_message}")
    for a, t in [(a, t) for a, t in zip(asserts, result.tests) if not t.passed][:limit]:
        lines.append(f"Failed: {a}" + (f" (got {t.actual})" if t.actual is not None else ""))
    return "\n".join(lines)


def _per_test(result: ExecutionResult, n: int) -> np.ndarray:
    """Pass flag per assert (all False when the program failed before its tests ran)."""
    flags = np.array([t.passed for t in result.tests], bool)
    return flags if len(flags) == n else np.zeros(n, bool)


@dataclasses.dataclass(frozen=True)
class CodeState:
    code: str | None = None  # the coder's best code so far
    result: ExecutionResult | None = None  # that code on the problem's tests
    tests: tuple[str, ...] = ()  # the tester's best asserts so far
    test_result: ExecutionResult | None = None  # those asserts on that code


class CodeEnv:
    """Coder + tester (or coder alone) refining code over turns; rewards in the module doc."""

    def __init__(self, coder: str, tester: str | None, bonus: float, max_asserts: int):
        self.roles = (coder,) if tester is None else (coder, tester)
        self.coder, self.tester, self.bonus, self.max_asserts = coder, tester, bonus, max_asserts

    def start(self, problem: Problem) -> CodeState:
        return CodeState()

    def prompt(self, agent: Any, problem: Problem, state: Any, role: str, turn: int) -> Any:
        """`agent`'s prompt at `state`: `request` in its template (`Agent.render_in_context`)."""
        return agent.render_in_context(*self.request(problem, state, role, turn))

    def request(self, problem: Problem, s: CodeState, role: str, turn: int) -> tuple[str, str, str]:
        """(problem text, feedback, history); feedback and history only from turn 1 on."""
        code = f"```python\n{s.code}\n```"
        if role == self.coder:
            if s.code is None:
                return problem.prompt, "", ""
            fb = public_feedback(s.result)
            fb = f"On the public tests: {fb}" if fb else ""
            if self.tester is not None:
                fb += "\n\n" + _assert_summary(s.tests, s.test_result, "The tester's")
            return problem.prompt, fb, f"Your previous code:\n{code}"
        if s.code is None:
            return problem.prompt + TESTER_TASK, "", ""
        tests = "```python\n" + "\n".join(s.tests) + "\n```" if s.tests else "(none)"
        return (
            problem.prompt + TESTER_TASK,
            _assert_summary(s.tests, s.test_result, "Your"),
            f"The coder's current code:\n{code}\nYour previous tests:\n{tests}",
        )

    def step(
        self,
        problems: Sequence[Problem],
        states: Sequence[CodeState],
        texts: Sequence[dict[str, list[str]]],
        verifier: Verifier,
    ) -> list[TurnResult]:
        P, K = len(problems), len(texts[0][self.coder])
        codes = [[extract_code(t).code for t in cand[self.coder]] for cand in texts]
        scores = verifier.score(
            [p for p in problems for _ in range(K)], [t for c in texts for t in c[self.coder]]
        )
        scores = [scores[i * K : (i + 1) * K] for i in range(P)]
        best = [best_branch([s.reward for s in row]) for row in scores]
        tester = self._score_tests(problems, texts, codes, scores, best, verifier) if self.tester else None
        out = []
        for i in range(P):
            b = best[i]
            rewards, passed = (
                {self.coder: [s.reward for s in scores[i]]},
                {self.coder: [s.passed for s in scores[i]]},
            )
            chosen, asserts, test_result = {self.coder: b}, (), None
            if tester is not None:
                rewards[self.tester], passed[self.tester], runs = tester[i]
                chosen[self.tester] = best_branch(rewards[self.tester])
                asserts, test_result = runs[chosen[self.tester]]
            state = CodeState(codes[i][b], scores[i][b].result, tuple(asserts), test_result)
            out.append(TurnResult(rewards, passed, chosen, state, scores[i][b].passed))
        return out

    def _score_tests(self, problems, texts, codes, scores, best, verifier: Verifier):
        """Per problem: tester rewards, all-valid flags, and (asserts, run on the best code) per candidate."""
        jobs, plan = [], []  # sandbox programs; per (i, k): (asserts, ref job index, code job index)
        for i, p in enumerate(problems):
            solution = p.solution
            if solution is None:  # fall back on a coder candidate of this turn that passes every test
                solution = next((codes[i][k] for k, s in enumerate(scores[i]) if s.passed), None)
            ref = None if solution is None else p.program(solution)
            cur = p.program(codes[i][best[i]])
            row = []
            for text in texts[i][self.tester]:
                asserts = parse_asserts(text, self.max_asserts)
                tests = tuple(AssertTest(a) for a in asserts)
                r_job = c_job = None
                if asserts and ref is not None:
                    r_job = len(jobs)
                    jobs.append(Program(code=ref.code, tests=tests, setup=ref.setup))
                if asserts:
                    c_job = len(jobs)
                    jobs.append(Program(code=cur.code, tests=tests, setup=cur.setup))
                row.append((asserts, r_job, c_job))
            plan.append(row)
        # candidates often repeat asserts, and the reference can equal the best code: each runs once
        results = verifier.run(jobs)
        out = []
        for row in plan:
            rewards, passed, runs = [], [], []
            for asserts, r_job, c_job in row:
                n = len(asserts)
                valid = _per_test(results[r_job], n) if r_job is not None else np.zeros(n, bool)
                fails = ~_per_test(results[c_job], n) if c_job is not None else np.zeros(n, bool)
                rewards.append(float((valid.sum() + self.bonus * (valid & fails).sum()) / n) if n else 0.0)
                passed.append(bool(n and valid.all()))
                runs.append((asserts, results[c_job] if c_job is not None else None))
            out.append((rewards, passed, runs))
        return out
