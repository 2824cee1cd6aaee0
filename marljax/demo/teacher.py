"""The warm start's teachers: the reference solutions, with classic slips at a stated rate.

Imitation copies a teacher's mistakes as faithfully as its skills; a verifier
does not. A teacher writes each task's reference program, but in a `rate`
fraction of the lines that admit one it makes a classic slip: float division
for floor division, `min` for `max`, `c - x` for `x - c`, ... The
warm-started models inherit the slips, and only the sandbox's tests (RL's
reward) tell them which of their two habits is right (a slipped program
fails its tests; tests/demo checks that on real tasks).

`teacher_completion` slips on every kind of line; `habit_completion` only on
the lines of its own operation kinds (`HABITS`: each demo model's teacher has
habits disjoint from the other's), so two models taught by the two habit
teachers make different errors, the heterogeneity MARS2 argues a team needs.
`code_teacher` is the same sloppy teacher as a script for `train.sft_teacher`:
it plays every agent of a code team on "steps" tasks, refinements included.
"""

from __future__ import annotations

import random
import re
from typing import Any

from marljax.tasks.code import SLIP_KINDS, SLIPS, slip, step_reference
from marljax.train.sft import reference_completion

KINDS = SLIP_KINDS  # the operation kind of each of `SLIPS`
# each demo model's teacher slips only on its own kinds: two each of arithmetic and comparison-like,
# so neither habit set is easier to notice from the tests
HABITS = {"qwen3": ("floordiv", "sub", "max", "square"), "llama": ("min", "mul", "mod", "abs")}


def line_kind(line: str) -> str | None:
    """The operation kind of a program line that admits a slip (the first matching pattern, as `slip`)."""
    return next((KINDS[i] for i, (pattern, _) in enumerate(SLIPS) if re.search(pattern, line)), None)


def teacher_completion(problem: Any, rate: float, seed: int = 0) -> str | None:
    """The teacher's answer to `problem`: its reference answer, slipped; the same for the same
    problem and seed."""
    answer = reference_completion(problem)
    if answer is None:
        return None
    return slip(answer, random.Random(f"marljax-teacher:{seed}:{problem.id}"), rate)


def habit_completion(problem: Any, kinds: tuple[str, ...], rate: float, seed: int = 0) -> str | None:
    """A teacher with habits: the reference answer with `slip` applied at `rate` to lines of `kinds` only."""
    answer = reference_completion(problem)
    if answer is None:
        return None
    # the seed string of the MARS2 ladder, where this teacher was first used: its warm starts stay the same
    rng = random.Random(f"ladder-teacher:{seed}:{'+'.join(kinds)}:{problem.id}")
    return "\n".join(slip(s, rng, rate) if line_kind(s) in kinds else s for s in answer.split("\n"))


def code_teacher(slips: float, seed: int = 0):
    """A sloppy teacher for code teams on "steps" tasks, as a `ScriptedGenerator` script: every turn,
    a first attempt or a refinement of an earlier one (the task is read from the prompt), is the
    task's program with each line that admits a classic slip slipped at rate `slips`, drawn anew for
    every call, so a team learns both habits and a refinement is as likely to fix a slip as to keep
    one; only the tests tell which is right."""
    rng = random.Random(f"marljax-code-teacher:{seed}")

    def script(agent: Any, prompt: str, k: int, s: int) -> str:
        program = step_reference(prompt)
        if program is None:
            raise ValueError(f"code_teacher: no steps task in the prompt {prompt[:80]!r}")
        return f"```python\n{slip(program.rstrip(), rng, slips)}\n```"

    return script
