"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476): train only on problems that teach.

DAPO keeps a prompt's group when its accuracy varies, `0 < #correct < G`
(std of `passed` > 0): an all-solved or all-failed group has nothing to
compare, yet its tokens count in the loss denominators and dilute the
others; with a reward shaped by length (DAPO's own overlong penalty) its
advantages are not even zero, and std normalisation blows length
differences alone up to about +-1. `train.dynamic_sampling` drops such
problems from a step's rollout and rolls out further batches of problems
until `data.batch_size` problems that teach are collected or `max_rounds`
batches were rolled out; the step then trains on the first `data.batch_size`
of them (fewer if the rounds ran out). `keep: advantage` keeps instead the
problems with a completion of non-zero advantage. When no round has one,
`when_none` says whether the step trains nothing (`skip`) or the first
round whole (`train`). A problem is its `ids["problem"]` within one round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from marljax.workflows.types import Rollout, concatenate

if TYPE_CHECKING:
    from marljax.train.config.schema import DynamicSamplingConfig

log = logging.getLogger(__name__)

KEEP_RULES = ("accuracy", "advantage")
WHEN_NONE = ("skip", "train")


def problem_of_each(rollout: Rollout) -> list[str]:
    return [str(i.get("problem", "")) for i in rollout.ids]


def informative(rollout: Rollout, keep: str = "accuracy") -> list[str]:
    """The problems that teach, in order of appearance: with `keep="accuracy"` those whose
    completions' pass flags are not all equal (std > 0), with `"advantage"` those with a completion
    of non-zero advantage."""
    if keep not in KEEP_RULES:
        raise ValueError(f"keep must be one of {KEEP_RULES}, got {keep!r}")
    problems = problem_of_each(rollout)
    values: dict[str, list[float]] = {}
    for p, passed, adv in zip(problems, rollout.passed, rollout.advantages):
        values.setdefault(p, []).append(passed if keep == "accuracy" else adv)
    if keep == "accuracy":  # max > min: std > 0 without a float rounding to decide it
        return [p for p, v in values.items() if max(v) > min(v)]
    return [p for p, v in values.items() if any(a != 0 for a in v)]


def collect(
    first: Rollout, more: Callable[[int], Rollout], batch_size: int, cfg: DynamicSamplingConfig
) -> tuple[Rollout | None, Rollout, dict[str, float]]:
    """The problems that teach in `first` and in `more(1)`, `more(2)`, ... (further rollouts), cut to
    `batch_size` problems (None when none teaches and `cfg.when_none` is `skip`); every round
    rolled out, as one rollout (what the step's rollout metrics describe); and
    `sampling/{kept,dropped}_problems`, `sampling/rounds`, `sampling/none_informative` and
    `sampling/skipped`."""
    parts, rounds, kept, dropped, rollout = [], [], 0, 0, first
    for round_ in range(cfg.max_rounds):
        if round_:
            rollout = more(round_)
        rounds.append(rollout)
        problems, teaching = problem_of_each(rollout), informative(rollout, cfg.keep)
        take = set(teaching[: batch_size - kept])
        parts.append(rollout.select([p in take for p in problems]))
        kept += len(take)
        dropped += len(set(problems)) - len(teaching)
        if kept >= batch_size:
            break
    trained = concatenate(parts) if kept else (first if cfg.when_none == "train" else None)
    if not kept:
        log.warning(
            "dynamic sampling: no problem teaches in %d rounds (keep=%s); when_none=%s: %s",
            len(rounds),
            cfg.keep,
            cfg.when_none,
            "training the first round whole" if trained is not None else "this step trains nothing",
        )
    metrics = {
        "sampling/kept_problems": kept,
        "sampling/dropped_problems": dropped,
        "sampling/rounds": len(rounds),
        "sampling/none_informative": not kept,
        "sampling/skipped": trained is None,
    }
    return trained, concatenate(rounds), {k: float(v) for k, v in metrics.items()}
