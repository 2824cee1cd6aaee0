"""The helper + main coding task of MAGRPO (Liu et al. 2025, arXiv 2508.04652).

Two agents write one program together: the helper writes an auxiliary
function ``aux(...)``, the main agent writes the problem's entry point (e.g.
``f``), which should call ``aux``. Both act at the same time from their own
prompts, so they only cooperate if training teaches them to. The program is
``helper code + main code``, run against the problem's tests in the sandbox.

Level reward in [0, 1] (the paper's levels: structure, syntax, tests,
cooperation; the weights are ours, additive)::

    r = 0.1 * structure     helper defines top-level aux, main defines the entry point
      + 0.1 * syntax        the combined code compiles
      + 0.6 * tests         fraction of all tests passed (0 when it does not compile)
      + 0.2 * cooperation   inside the entry point main calls aux and uses its value
                            (not a bare expression statement), main does not define
                            aux itself, the helper does, and at least one test passes

The last condition keeps "call aux and fail" from earning the bonus. A pair
is `passed` when the combined program passes every test.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Sequence

from marljax.rewards import ExecutionResult, Problem, Verifier, error_feedback, extract_code

AUX = "aux"
WEIGHTS = {"structure": 0.1, "syntax": 0.1, "tests": 0.6, "cooperation": 0.2}


def helper_prompt(problem: Problem) -> str:
    """The helper's {problem} text: the task plus its part of the work."""
    entry = problem.entry_point
    target = f"the main function `{entry}`" if entry else "the main program"
    own = f" Do not write `{entry}`." if entry else ""
    return (
        f"{problem.prompt}\n\nYou are the helper. Write a helper function `{AUX}(...)` that {target} "
        f"can use; choose its arguments.{own} Reply with `{AUX}` in a ```python block."
    )


def main_prompt(problem: Problem) -> str:
    """The main agent's {problem} text: the task plus the promise of a helper."""
    entry = problem.entry_point
    what = f"Write the function `{entry}`" if entry else "Write the program"
    return (
        f"{problem.prompt}\n\nYou are the main agent. {what}. A teammate writes a helper function "
        f"`{AUX}(...)` that is defined before your code: call it and use its result. Do not define "
        f"`{AUX}` yourself. Reply in a ```python block."
    )


def defines(code: str, name: str, top_level: bool = True) -> bool:
    """Whether `code` has a `def name(` (at column 0 when `top_level`); text-based, so it also
    answers for code that does not parse."""
    indent = "" if top_level else r"[ \t]*"
    return re.search(rf"^{indent}(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def uses_result(code: str, entry: str | None, callee: str = AUX) -> bool:
    """Whether `entry`'s body (the whole module when None) calls `callee` and uses the value:
    any call that is not the whole of an expression statement counts (assigned, returned,
    passed on, part of an expression)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    scope: ast.AST | None = tree
    if entry is not None:
        scope = next(
            (
                n
                for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry
            ),
            None,
        )
        if scope is None:
            return False
    discarded = {id(n.value) for n in ast.walk(scope) if isinstance(n, ast.Expr)}
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == callee
        and id(n) not in discarded
        for n in ast.walk(scope)
    )


def _compile_error(code: str) -> str | None:
    try:
        compile(code, "<program>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@dataclasses.dataclass(frozen=True)
class CoopScore:
    """reward in [0, 1]; passed: every test of the combined program passed; levels: each
    level's contribution to the reward; feedback: text for the next turn; result: the sandbox's."""

    reward: float
    passed: bool
    levels: dict[str, float]
    feedback: str
    result: ExecutionResult | None = None


def _feedback(
    entry: str | None,
    has_aux: bool,
    has_entry: bool,
    error: str | None,
    result: ExecutionResult | None,
    coop: bool,
) -> str:
    lines = [f"Helper defines `{AUX}`: {'yes' if has_aux else 'no'}."]
    if entry:
        lines.append(f"Main defines `{entry}`: {'yes' if has_entry else 'no'}.")
    if error is not None:
        lines.append(f"The combined code does not compile: {error}")
    elif result is not None:
        lines.append("All tests passed." if result.passed else error_feedback(result))
    lines.append(f"Main uses the result of `{AUX}`: {'yes' if coop else 'no'}.")
    return "\n".join(lines)


def score_pairs(
    problems: Sequence[Problem], helper_texts: Sequence[str], main_texts: Sequence[str], verifier: Verifier
) -> list[CoopScore]:
    """Level rewards of `(helper_texts[i], main_texts[i])` on `problems[i]`; all programs that
    compile run in one batch."""
    if not len(problems) == len(helper_texts) == len(main_texts):
        raise ValueError(
            f"{len(problems)} problems, {len(helper_texts)} helper and {len(main_texts)} main texts"
        )
    if any(p.is_math for p in problems):
        raise ValueError("the coop_code task needs code problems, got a math problem")
    parts = []
    for p, h, m in zip(problems, helper_texts, main_texts):
        hc, mc = extract_code(h).code, extract_code(m).code
        combined = (hc + "\n\n" + mc).strip("\n")
        error = _compile_error(combined) if combined.strip() else "no code"
        parts.append((p, hc, mc, combined, error))
    runnable = [k for k, part in enumerate(parts) if part[4] is None]
    results: dict[int, ExecutionResult] = {}
    if runnable:
        # samples often repeat a (helper, main) pair: run each (problem, combined code) once
        ran = verifier.run(
            [parts[k][0].program(parts[k][3]) for k in runnable],
            [(id(parts[k][0]), parts[k][3]) for k in runnable],
        )
        results = dict(zip(runnable, ran))
    scores = []
    for k, (p, hc, mc, _combined, error) in enumerate(parts):
        entry = p.entry_point
        has_aux = defines(hc, AUX)
        has_entry = defines(mc, entry, top_level=False) if entry else bool(mc.strip())
        result = results.get(k)
        frac = result.pass_fraction() if result is not None else 0.0
        coop = has_aux and not defines(mc, AUX, top_level=False) and uses_result(mc, entry)
        levels = {
            "structure": WEIGHTS["structure"] * (has_aux and has_entry),
            "syntax": WEIGHTS["syntax"] * (error is None),
            "tests": WEIGHTS["tests"] * frac,
            "cooperation": WEIGHTS["cooperation"] * (coop and frac > 0),
        }
        scores.append(
            CoopScore(
                float(sum(levels.values())),
                frac == 1.0,
                levels,
                _feedback(entry, has_aux, has_entry, error, result, coop),
                result,
            )
        )
    return scores
