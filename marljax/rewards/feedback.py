"""Error feedback for refinement steps (MARS2, arXiv 2602.07848).

When a node's program fails, the next agent refines it given structured
feedback: for a wrong answer the failing input, the expected and the actual
output; for a runtime error the exception type and (trimmed) traceback; for a
timeout a note.  Only *public* tests are described (private tests are the
held-out reward and must never leak into prompts); use it only at refinement
steps, never as part of the reward.
"""

from __future__ import annotations

from .results import ExecutionResult, Status, TestResult


def _clip(text: str | None, n: int) -> str:
    text = "" if text is None else str(text)
    if len(text) <= n:
        return text
    head = max(0, n - 20)
    return text[:head] + f"... [{len(text) - head} more chars]"


def _describe(t: TestResult, field_chars: int) -> str:
    if t.status is Status.WRONG_ANSWER:
        lines = ["Wrong answer.", f"Input: {_clip(t.input, field_chars)}"]
        if t.expected is not None:
            lines.append(f"Expected output: {_clip(t.expected, field_chars)}")
        if t.actual is not None:
            lines.append(f"Actual output: {_clip(t.actual, field_chars)}")
        elif t.message:
            lines.append(f"Assertion message: {_clip(t.message, field_chars)}")
        return "\n".join(lines)
    if t.status is Status.TIMEOUT:
        return (
            f"Time limit exceeded on input: {_clip(t.input, field_chars)}\n"
            "The program did not finish in time: look for infinite loops or a too slow algorithm."
        )
    if t.status is Status.MEMORY_EXCEEDED:
        return (
            f"Memory limit exceeded on input: {_clip(t.input, field_chars)}\n"
            "The program used too much memory."
        )
    head = f"Runtime error: {t.exc_type or 'error'}: {_clip(t.message, field_chars)}"
    lines = [head]
    if t.input:
        lines.append(f"Input: {_clip(t.input, field_chars)}")
    if t.traceback:
        lines.append("Traceback:\n" + _clip(t.traceback, 2 * field_chars))
    return "\n".join(lines)


def error_feedback(
    result: ExecutionResult,
    max_chars: int = 2000,
    field_chars: int = 400,
    split: str | None = "public",
    max_failures: int = 1,
) -> str:
    """Refinement prompt text for a failed ``result`` ('' when it passed).

    ``split``: which tests may be described (default public only; ``None`` all).
    ``max_failures``: how many failing tests to describe (MARS2 uses the first).
    The whole text is capped at ``max_chars``.
    """
    if result.passed:
        return ""
    st = result.status
    if st is Status.NO_CODE:
        text = "No code was found in the answer. Reply with a complete Python program in a ```python block."
    elif st is Status.SYNTAX_ERROR:
        text = (
            f"Syntax error: {result.error_type or 'SyntaxError'}: {_clip(result.error_message, field_chars)}"
        )
        if result.error_traceback:
            text += "\n" + _clip(result.error_traceback, 2 * field_chars)
    else:
        visible = [t for t in result.tests if split is None or t.split == split]
        failed = [t for t in visible if not t.passed and t.status is not Status.NOT_RUN]
        parts = []
        hidden_only = visible and not failed and all(t.passed for t in visible) and not result.error_traceback
        if hidden_only:
            # every test we may describe passed; only held-out tests failed, and they stay hidden
            return _clip(f"All {len(visible)} {split or ''} tests passed.".replace("  ", " "), max_chars)
        if not failed or result.error_traceback:
            # A program-level failure (an error while loading, an early exit, a flood of output).
            detail = f"{result.error_type or st.value}: {_clip(result.error_message, field_chars)}"
            parts.append(("The program failed before the tests ran. " if not failed else "") + detail)
            if result.error_traceback:
                parts.append("Traceback:\n" + _clip(result.error_traceback, 2 * field_chars))
        n_pass = sum(t.passed for t in visible)
        if visible:
            parts.insert(0, f"Passed {n_pass} of {len(visible)} tests.")
        for t in failed[:max_failures]:
            parts.append(_describe(t, field_chars))
        if not visible and not parts:
            parts.append(f"The program failed ({st.value}).")
        text = "\n\n".join(parts)
    return _clip(text, max_chars)


def public_feedback(result: ExecutionResult | None) -> str:
    """What a team may be told about a program between turns: its public tests only ('' for math).

    Unlike `error_feedback` it also reports success ("All 3 public tests passed.") and says when
    a problem has no public tests, so that every turn gets a line about the last program.
    """
    if result is None:
        return ""
    if result.status in (Status.NO_CODE, Status.SYNTAX_ERROR):
        return error_feedback(result)
    public = [t for t in result.tests if t.split == "public"]
    if not public:
        return "No public tests."
    if all(t.passed for t in public):
        return f"All {len(public)} public tests passed."
    return error_feedback(result)
