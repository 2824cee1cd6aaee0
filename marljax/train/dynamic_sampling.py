"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476): train only on problems that teach.

A problem whose completions all got a zero advantage (every reward equal in
each of its normalisation groups: all solved or all failed) moves no weight,
yet its tokens still count in the loss denominators and dilute the others.
With `train.dynamic_sampling` the trainer drops such problems from a step's
rollout and rolls out further batches of problems until `data.batch_size`
informative problems are collected or `train.max_sampling_rounds` batches
were rolled out; the step then trains on the first `data.batch_size` of
them (fewer if the rounds ran out). A problem is its `ids["problem"]` within
one round.
"""

from __future__ import annotations

from collections.abc import Callable

from marljax.workflows.types import Rollout, concatenate


def problem_of_each(rollout: Rollout) -> list[str]:
    return [str(i.get("problem", "")) for i in rollout.ids]


def informative(rollout: Rollout) -> list[str]:
    """The problems with a completion of non-zero advantage, in order of appearance."""
    problems = problem_of_each(rollout)
    teaching = {p for p, a in zip(problems, rollout.advantages) if a != 0}
    return [p for p in dict.fromkeys(problems) if p in teaching]


def collect(
    first: Rollout, more: Callable[[int], Rollout], batch_size: int, max_rounds: int
) -> tuple[Rollout, dict[str, float]]:
    """The informative part of `first` and of `more(1)`, `more(2)`, ... (further rollouts), cut to
    `batch_size` problems, and `sampling/{kept,dropped}_problems` and `sampling/rounds`. When no
    round has an informative problem, `first` is returned whole (its update is then a no-op)."""
    parts, kept, dropped, rollout = [], 0, 0, first
    for round_ in range(max_rounds):
        if round_:
            rollout = more(round_)
        problems, teaching = problem_of_each(rollout), informative(rollout)
        take = set(teaching[: batch_size - kept])
        parts.append(rollout.select([p in take for p in problems]))
        kept += len(take)
        dropped += len(set(problems)) - len(teaching)
        if kept >= batch_size:
            break
    metrics = {
        "sampling/kept_problems": kept,
        "sampling/dropped_problems": dropped,
        "sampling/rounds": round_ + 1,
    }
    return (concatenate(parts) if kept else first), {k: float(v) for k, v in metrics.items()}
