"""The environment protocol: agents act on a state turn by turn, text in and text out.

`TextEnv` is one episode of a multi-turn environment (tool use, games): `reset`
gives the first observation, each `step(agent, action_text)` the next one with
its reward, whether the episode ended and an info dict. It knows nothing of
policies, tokens or optimisers, uses no JAX, and two episodes reset with the
same problem and seed see the same observations for the same actions. One
object holds one episode: a workflow makes one per episode with `EnvSpec`'s
factory or the environment's constructor.

AT-GRPO's tree (`marljax.workflows.at_grpo`) scores K candidates per role from copies of one
state in a batch (`envs.code.CodeEnv`, `envs.grid.PlanEnv`): each problem's `TurnResult`, whose
best branch (`best_branch`) continues.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from marljax.rewards import Problem


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What a `TextEnv` offers: its name, the agents that may act, the tools they can call (JSON
    schemas in the chat template's `tools=` format) and the turn limit of an episode."""

    name: str
    agents: tuple[str, ...]
    max_turns: int
    tools: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"env {self.name!r}: max_turns must be >= 1, got {self.max_turns}")
        if not self.agents:
            raise ValueError(f"env {self.name!r}: needs at least one agent")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One step of a `TextEnv`: the observation the acting agent (or the next one) sees, the reward
    of this step, whether the episode ended, and details for logs and process rewards."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class TextEnv(Protocol):
    spec: EnvSpec

    def reset(self, problem: Problem, seed: int = 0) -> str:
        """Start an episode on `problem`: its first observation."""

    def step(self, agent: str, action_text: str) -> StepResult:
        """`agent` acts with `action_text`; stepping an ended episode is an error."""


@dataclasses.dataclass(frozen=True)
class TurnResult:
    """One problem's turn of AT-GRPO's tree: per role, the K candidates' rewards and pass flags and
    the best index; the state its best branches lead to, and whether that solves the problem."""

    rewards: dict[str, list[float]]
    passed: dict[str, list[bool]]
    best: dict[str, int]
    state: Any
    solved: bool


def best_branch(rewards: Sequence[float]) -> int:
    """The branch that continues: highest reward, ties to the lowest index (AT-GRPO's greedy selection)."""
    return int(np.argmax(np.asarray(rewards, np.float64)))
