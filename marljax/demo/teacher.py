"""The warm start's teacher: the reference solutions, with classic slips at a stated rate.

Imitation copies a teacher's mistakes as faithfully as its skills; a verifier
does not. The demo's teacher writes each task's reference program, but in a
`rate` fraction of the lines that admit one it makes a classic slip: float
division for floor division, `min` for `max`, `c - x` for `x - c`, ... The
warm-started models inherit the slips, and only the sandbox's tests (RL's
reward) tell them which of their two habits is right (a slipped program
fails its tests; tests/demo checks that on real tasks).
"""

from __future__ import annotations

import random
import re
from typing import Any

from marljax.train.sft import reference_completion

# (line pattern, slipped replacement); at most one slip per line
SLIPS = (
    (r"x = x // (\d)", r"x = x / \1"),  # float division
    (r"x = x - (\d)", r"x = \1 - x"),  # operands swapped
    (r"x = max\(x, (\d)\)", r"x = min(x, \1)"),  # larger <-> smaller
    (r"x = min\(x, (\d)\)", r"x = max(x, \1)"),
    (r"x = x \* (\d)", r"x = x ** \1"),  # power for product
    (r"x = x % (\d)", r"x = x // \1"),  # quotient for remainder
    (r"x = x \* x", r"x = x * 2"),  # doubled, not squared
    (r"x = abs\(x\)", r"x = -x"),  # negated, not absolute
)


def slip(code: str, rng: random.Random, rate: float) -> str:
    """`code` with each line that has a slip replaced by it with probability `rate`."""
    lines = code.split("\n")
    for k, line in enumerate(lines):
        for pattern, wrong in SLIPS:
            if re.search(pattern, line):
                if rng.random() < rate:
                    lines[k] = re.sub(pattern, wrong, line)
                break
    return "\n".join(lines)


def teacher_completion(problem: Any, rate: float, seed: int = 0) -> str | None:
    """The teacher's answer to `problem`: its reference answer, slipped; the same for the same
    problem and seed."""
    answer = reference_completion(problem)
    if answer is None:
        return None
    return slip(answer, random.Random(f"marljax-teacher:{seed}:{problem.id}"), rate)
