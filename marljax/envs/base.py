"""The environment protocol of turn-based workflows (AT-GRPO): roles act on a state, turn by turn.

At each turn every role gets a request built from the problem and the state,
answers with K candidates, and `step` scores all candidates of all problems at
once and moves each problem to its next state along its best branch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from marljax.rewards import Problem, Verifier

State = TypeVar("State")


@dataclasses.dataclass(frozen=True)
class TurnResult:
    """One problem's turn: per role, the K candidates' rewards and pass flags and the best index."""

    rewards: dict[str, list[float]]
    passed: dict[str, list[bool]]
    best: dict[str, int]
    state: Any
    solved: bool


class Env(Protocol[State]):
    roles: tuple[str, ...]  # the agents that act each turn, in order

    def start(self, problem: Problem) -> State:
        """The state before the first turn."""

    def request(self, problem: Problem, state: State, role: str, turn: int) -> tuple[str, str, str]:
        """(problem text, feedback, history) of `role`'s prompt at `state`."""

    def step(
        self,
        problems: Sequence[Problem],
        states: Sequence[State],
        texts: Sequence[dict[str, list[str]]],
        verifier: Verifier,
    ) -> list[TurnResult]:
        """Score each problem's candidates (`texts[i][role]`, K each) and continue its best branch."""


def best_branch(rewards: Sequence[float]) -> int:
    """The branch that continues: highest reward, ties to the lowest index (AT-GRPO's greedy selection)."""
    return int(np.argmax(np.asarray(rewards, np.float64)))
