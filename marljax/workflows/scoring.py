"""Turn completions into rewards: code through the sandbox, math through the answer checker."""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Literal, Sequence, get_args

from marljax.rewards import ExecutionResult, Program, SandboxPool, extract_code, math_reward


# How a workflow turns a test pass fraction into a reward: the fraction itself (dense, but a
# partly right program earns credit), or 1 only when every test passes.
RewardKind = Literal["fraction", "pass"]


def check_reward_kind(kind: str) -> str:
    if kind not in get_args(RewardKind):
        raise ValueError(f"reward must be one of {get_args(RewardKind)}, got {kind!r}")
    return kind


def as_reward(fraction: float, kind: str) -> float:
    """The reward of a program that passed `fraction` of its tests, under reward `kind`."""
    return float(fraction >= 1.0) if kind == "pass" else fraction


def map_once(pool: SandboxPool | None, programs: Sequence[Program],
             keys: Sequence[Hashable] | None = None) -> list[ExecutionResult]:
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
    ran = dict(zip(first, pool.map(list(first.values())))) if first else {}
    return [ran[key] for key in keys]


@dataclasses.dataclass(frozen=True)
class Score:
    """reward in [0, 1] (fraction of tests passed, or answer correct), passed: all tests
    passed; result: the sandbox's `ExecutionResult` (None for math)."""

    reward: float
    passed: bool
    result: ExecutionResult | None = None


def score_texts(problems: Sequence[Any], texts: Sequence[str], pool: SandboxPool | None,
                split: str | None = None) -> list[Score]:
    """Score `texts[i]` against `problems[i]`; code runs in parallel in `pool`, each distinct
    (problem object, extracted program) once, and its repeats share that verdict.

    split: None scores on all tests, "public" / "private" on that split only.
    """
    if len(problems) != len(texts):
        raise ValueError(f"{len(problems)} problems but {len(texts)} texts")
    scores: list[Score | None] = [None] * len(texts)
    code_idx = []
    for i, (p, t) in enumerate(zip(problems, texts)):
        if p.schema == "math":
            r = math_reward(t, str(p.answer))
            scores[i] = Score(r, r == 1.0)
        else:
            code_idx.append(i)
    if code_idx:
        if pool is None:
            raise ValueError("code problems need a SandboxPool")
        # a group's samples often repeat a program (low-entropy policies): run it once
        codes = [extract_code(texts[i]).code for i in code_idx]
        ran = map_once(pool, [problems[i].program(c) for i, c in zip(code_idx, codes)],
                       [(id(problems[i]), c) for i, c in zip(code_idx, codes)])
        for i, res in zip(code_idx, ran):
            frac = res.pass_fraction(split)
            scores[i] = Score(frac, frac == 1.0, res)
    return scores
