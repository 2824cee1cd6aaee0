"""Synthetic verifiable coding tasks, deterministic from a seed: the ``synthetic`` source.

"Write ``f(x)`` matching these input/output examples": a hidden integer
function is composed of ``difficulty`` random primitive operations (add,
multiply, floor-divide, modulo, square, abs, max/min with a constant, a parity
branch); from difficulty 3 on, half the tasks take a list and sum or count a
hidden per-element function.  Some examples are shown in the prompt (public
tests); held-out examples are private tests.  Tasks run through the same
sandbox as every other program (``task.program(code)``), and each task's
``reference`` solution passes all of its tests.

``make_step_task`` is the easier "steps" style the embedded demo trains tiny
models on: the prompt states each operation in words ("multiply x by 3, then
take the larger of x and 5") and the reference applies them one line each,
so a small model can learn the phrase-to-line mapping on a laptop CPU. The
words define the function, so the prompt shows no examples (their numbers
only distract a tiny model from the constants it must copy); the public tests
still drive feedback and answer selection.

Outputs are computed in the parent by composing Python closures, never by
``eval`` of generated text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from marljax.rewards import Problem
from marljax.rewards.formats import CallTest, Program, StdioTest

from .rows import parse_row
from .sources import GeneratedSource, register_source


@dataclass(frozen=True)
class SyntheticTask:
    task_id: str
    prompt: str
    fn_name: str
    reference: str  # a correct solution (source of ``fn_name``)
    public: tuple  # ((args, output), ...) shown in the prompt
    private: tuple  # held out
    difficulty: int
    seed: int

    def program(self, code: str, io: str = "call") -> Program:
        """Tests for ``code``: call-based (default) or stdin/stdout (one argument per line)."""
        if io == "call":
            tests = [CallTest(a, o, "public") for a, o in self.public] + [
                CallTest(a, o, "private") for a, o in self.private
            ]
            return Program(code=code, tests=tuple(tests), fn_name=self.fn_name)
        if io == "stdin":

            def fmt(args):
                return (
                    "\n".join(" ".join(map(str, a)) if isinstance(a, list) else str(a) for a in args) + "\n"
                )

            tests = [StdioTest(fmt(a), f"{o}\n", "public") for a, o in self.public] + [
                StdioTest(fmt(a), f"{o}\n", "private") for a, o in self.private
            ]
            return Program(code=code, tests=tuple(tests))
        raise ValueError(f"io must be 'call' or 'stdin', got {io!r}")


def _ops(rng: random.Random) -> tuple[str, Callable[[int], int]]:
    """One primitive op: (template with {} for the inner expression, function)."""
    kind = rng.choice(["add", "mul", "floordiv", "mod", "square", "abs", "max", "min", "parity"])
    c = rng.randint(2, 9)
    if kind == "add":
        c = rng.choice([-1, 1]) * c
        return f"({{}} + {c})", lambda v: v + c
    if kind == "mul":
        c = rng.choice([-1, 1]) * c
        return f"({{}} * {c})", lambda v: v * c
    if kind == "floordiv":
        return f"({{}} // {c})", lambda v: v // c
    if kind == "mod":
        return f"({{}} % {c})", lambda v: v % c
    if kind == "square":
        return "({} * {})", lambda v: v * v
    if kind == "abs":
        return "abs({})", abs
    if kind == "max":
        return f"max({{}}, {c})", lambda v: max(v, c)
    if kind == "min":
        return f"min({{}}, {c})", lambda v: min(v, c)
    d = rng.randint(1, 5)
    return (
        f"(({{v}}) // 2 if ({{v}}) % 2 == 0 else ({{v}}) * 3 + {d})",
        lambda v: v // 2 if v % 2 == 0 else v * 3 + d,
    )


def _compose(rng: random.Random, depth: int) -> tuple[str, Callable[[int], int]]:
    expr, fn = "x", (lambda v: v)
    for _ in range(depth):
        tmpl, op = _ops(rng)
        expr = tmpl.format(v=expr) if "{v}" in tmpl else tmpl.replace("{}", expr)
        fn = (lambda f, g: lambda v: g(f(v)))(fn, op)
    return expr, fn


def make_task(seed: int, difficulty: int = 2, n_public: int = 4, n_private: int = 8) -> SyntheticTask:
    """One task; the same ``(seed, difficulty, n_public, n_private)`` always gives the same task."""
    if not 1 <= difficulty <= 10:
        raise ValueError(f"difficulty must be in 1..10, got {difficulty!r}")
    if n_public < 1 or n_private < 0:
        raise ValueError("need n_public >= 1 and n_private >= 0")
    rng = random.Random(f"marljax-synthetic:{seed}:{difficulty}")
    span = 5 * difficulty + 5
    use_list = difficulty >= 3 and rng.random() < 0.5
    n = n_public + n_private
    if use_list:
        expr, g = _compose(rng, difficulty - 1)
        agg = rng.choice(["sum", "count"])
        if agg == "sum":
            body = f"sum({expr} for x in xs)"

            def fn(xs, g=g):
                return sum(g(v) for v in xs)

            what = "a list of integers `xs`"
        else:
            k = rng.randint(2, 4)
            body = f"sum(1 for x in xs if {expr} % {k} == 0)"

            def fn(xs, g=g, k=k):
                return sum(1 for v in xs if g(v) % k == 0)

            what = "a list of integers `xs`"
        reference = f"def f(xs):\n    return {body}\n"
        seen, args = set(), []
        while len(args) < n:
            xs = [rng.randint(-span, span) for _ in range(rng.randint(0, 3 + difficulty))]
            if tuple(xs) not in seen:
                seen.add(tuple(xs))
                args.append((xs,))
        sig = "f(xs)"
    else:
        expr, fn1 = _compose(rng, difficulty)
        fn = fn1
        reference = f"def f(x):\n    return {expr}\n"
        values = rng.sample(range(-span * 4, span * 4 + 1), n)
        args = [(v,) for v in values]
        what = "an integer `x`"
        sig = "f(x)"
    cases = tuple((a, fn(*a)) for a in args)
    public, private = cases[:n_public], cases[n_public:]
    shown = "\n".join(f"f({', '.join(map(repr, a))}) == {o!r}" for a, o in public)
    prompt = (
        f"Write a Python function `{sig}` that takes {what} and returns an integer, "
        f"matching these examples:\n{shown}\n"
        "It will also be checked on held-out inputs. Reply with the function in a ```python block."
    )
    return SyntheticTask(
        task_id=f"synthetic/{difficulty}/{seed}",
        prompt=prompt,
        fn_name="f",
        reference=reference,
        public=public,
        private=private,
        difficulty=difficulty,
        seed=seed,
    )


def make_tasks(n: int, seed: int = 0, difficulty: int = 2, **kwargs) -> list[SyntheticTask]:
    """``n`` tasks with seeds ``seed .. seed + n - 1``."""
    return [make_task(seed + k, difficulty, **kwargs) for k in range(n)]


# (phrase, statement, function) makers of the "steps" style; c is a constant 2..9
_STEPS = {
    "add": lambda c: (f"add {c} to x", f"x = x + {c}", lambda v: v + c),
    "sub": lambda c: (f"subtract {c} from x", f"x = x - {c}", lambda v: v - c),
    "mul": lambda c: (f"multiply x by {c}", f"x = x * {c}", lambda v: v * c),
    "floordiv": lambda c: (f"divide x by {c}, rounding down", f"x = x // {c}", lambda v: v // c),
    "mod": lambda c: (f"replace x by its remainder modulo {c}", f"x = x % {c}", lambda v: v % c),
    "square": lambda c: ("square x", "x = x * x", lambda v: v * v),
    "abs": lambda c: ("take the absolute value of x", "x = abs(x)", abs),
    "max": lambda c: (f"take the larger of x and {c}", f"x = max(x, {c})", lambda v: max(v, c)),
    "min": lambda c: (f"take the smaller of x and {c}", f"x = min(x, {c})", lambda v: min(v, c)),
}


def make_step_task(seed: int, steps: int = 2, n_public: int = 3, n_private: int = 8) -> SyntheticTask:
    """A "steps" task: 1..``steps`` operations stated in words, applied to an integer ``x``."""
    if not 1 <= steps <= 6:
        raise ValueError(f"steps must be in 1..6, got {steps!r}")
    if n_public < 1 or n_private < 0:
        raise ValueError("need n_public >= 1 and n_private >= 0")
    rng = random.Random(f"marljax-steps:{seed}:{steps}")
    ops = [_STEPS[rng.choice(sorted(_STEPS))](rng.randint(2, 9)) for _ in range(rng.randint(1, steps))]

    def fn(v):
        for _, _, op in ops:
            v = op(v)
        return v

    values = rng.sample(range(-20, 21), n_public + n_private)
    cases = tuple(((v,), fn(v)) for v in values)
    body = "".join(f"    {line}\n" for _, line, _ in ops)
    prompt = f"Write f(x): {', then '.join(p for p, _, _ in ops)}; return x.\n"
    return SyntheticTask(
        task_id=f"steps/{steps}/{seed}",
        prompt=prompt,
        fn_name="f",
        reference=f"def f(x):\n{body}    return x\n",
        public=cases[:n_public],
        private=cases[n_public:],
        difficulty=steps,
        seed=seed,
    )


# a steps task's statement (make_step_task's prompt) and the program line of each of its steps
_STEP_STATEMENT = re.compile(r"Write f\(x\): (.+?); return x\.")
_STEP_LINES = {words: line for make in _STEPS.values() for c in range(2, 10) for words, line, _ in [make(c)]}


def step_reference(text: str) -> str | None:
    """The reference program of the "steps" task whose statement `text` holds (`make_step_task`'s
    `reference`, read back from its prompt), or None when it holds none."""
    found = _STEP_STATEMENT.search(text)
    steps = found[1].split(", then ") if found else []
    if not steps or not all(words in _STEP_LINES for words in steps):
        return None
    body = "".join(f"    {_STEP_LINES[words]}\n" for words in steps)
    return f"def f(x):\n{body}    return x\n"


# Classic slips in a steps task's program lines: (line pattern, slipped replacement), at most one
# per line. A sloppy teacher makes them (`slip`); the tests catch every one.
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
# the operation kind of each slip, in `SLIPS` order
SLIP_KINDS = ("floordiv", "sub", "max", "min", "mul", "mod", "square", "abs")


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


def synthetic_rows(
    n: int, seed: int = 0, difficulty: int = 2, style: str = "examples", solution_slips: float = 0.0, **kwargs
) -> list[dict]:
    """Synthetic tasks as call-based ``stdio`` rows (same tests as ``task.program``).

    Going through rows lets the synthetic task use the row schemas and the stream
    like any dataset.  ``style="steps"`` gives ``make_step_task`` tasks of up to
    ``difficulty`` steps.  ``solution_slips``: each row's ``solution`` (what SFT imitates) has
    `slip` applied at that rate (steps tasks), so it may fail its tests.  ``kwargs`` go to the task
    maker (``n_public``, ``n_private``).
    """
    if style == "steps":
        tasks = [make_step_task(seed + k, difficulty, **kwargs) for k in range(n)]
    elif style == "examples":
        tasks = make_tasks(n, seed=seed, difficulty=difficulty, **kwargs)
    else:
        raise ValueError(f"style must be 'examples' or 'steps', got {style!r}")
    rows = []
    for task in tasks:
        cases = task.public + task.private
        rows.append(
            {
                "task_id": task.task_id,
                "question": task.prompt,
                "fn_name": task.fn_name,
                "inputs": [list(args) for args, _ in cases],
                "outputs": [out for _, out in cases],
                "public": len(task.public),
                "solution": slip(
                    task.reference, random.Random(f"marljax-slips:{task.task_id}"), solution_slips
                ),
            }
        )
    return rows


@register_source("synthetic")
class SyntheticSource(GeneratedSource):
    """Generated coding tasks (this module's `make_task` or `make_step_task`)."""

    kind: Literal["synthetic"] = "synthetic"
    difficulty: int = Field(1, ge=1, description="primitive operations per task")
    style: Literal["examples", "steps"] = Field(
        "examples",
        description="examples: infer f from input/output pairs; steps: up to `difficulty` "
        "operations stated in words (the embedded demo's easier task)",
    )
    solution_slips: float = Field(
        0.0,
        ge=0,
        le=1,
        description="steps tasks: the rate of classic slips (`/` for `//`, `min` for `max`, ...) in the "
        "reference programs SFT imitates, so that a warm start makes errors only RL's reward corrects",
    )

    @model_validator(mode="after")
    def _slips_need_steps(self):
        if self.solution_slips and self.style != "steps":
            raise ValueError("solution_slips applies to style: steps only")
        return self

    def make(self, n: int, seed: int, split: str) -> list[Problem]:
        rows = synthetic_rows(
            n, seed=seed, difficulty=self.difficulty, style=self.style, solution_slips=self.solution_slips
        )
        return [parse_row(r, "stdio", f"<synthetic {split}>:{k + 1}") for k, r in enumerate(rows)]
