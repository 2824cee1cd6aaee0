"""Refinement examples for the warm start: a broken attempt, its real sandbox feedback, the fix.

MARS2 asks agents to refine earlier nodes ("Previous attempt ... Feedback on
the public tests ..."). A tiny model that only saw plain prompts in SFT
meets that format for the first time during RL; these pairs teach it the
format (and give the tokenizer its words). Each attempt is the task's
reference with one deliberate fault, run in the sandbox like any program.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from marljax.rewards import error_feedback, score_texts
from marljax.train.sft import reference_completion
from marljax.workflows.base import Agent
from marljax.workflows.mars2 import refine_prompt


def break_program(code: str, rng: random.Random, names: bool = False) -> str:
    """`code` with one fault: a wrong constant, a dropped or garbled step, an unknown name
    (the last only when `names`, as its traceback makes long prompts)."""
    lines = code.splitlines()
    steps = [k for k, line in enumerate(lines) if line.strip().startswith("x = ")]
    k = rng.choice(steps)
    fault = rng.choice(["constant", "drop", "syntax"] + (["name"] if names else []))
    if fault == "constant" and re.search(r"\d", lines[k]):
        lines[k] = re.sub(r"\d", lambda m: str((int(m.group()) + rng.randint(1, 8)) % 10), lines[k], count=1)
    elif fault == "drop" and len(steps) > 1:
        del lines[k]
    elif fault == "syntax" or not names:
        lines[k] = lines[k].rsplit(" ", 1)[0]
    else:  # every step reads x on its right-hand side
        lhs, rhs = lines[k].split("= ", 1)
        lines[k] = lhs + "= " + re.sub(r"\bx\b", "y", rhs, count=1)
    return "\n".join(lines) + "\n"


def refine_examples(
    problems: Sequence[Any],
    agent: Agent,
    pool: Any,
    seed: int = 0,
    target: Callable[[Any], str | None] = reference_completion,
) -> list[tuple[str, str]]:
    """(refinement prompt, `target` answer) for each problem whose broken attempt fails its tests."""
    rng = random.Random(seed)
    attempts = [break_program(p.fields["solution"], rng) for p in problems]
    scores = score_texts(problems, [f"```python\n{a}```" for a in attempts], pool)
    return [
        (refine_prompt(agent, p, a, error_feedback(s.result)), target(p))
        for p, a, s in zip(problems, attempts, scores)
        if not s.passed and s.result is not None
    ]
