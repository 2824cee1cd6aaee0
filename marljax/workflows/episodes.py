"""What a workflow's `play` returns: its generations, one row of columns each.

Every row carries the ids of `ID_FIELDS` (problem, episode, node, parent, depth,
turn), the row's `reward` and `passed`, and any integer columns the workflow's
`credit` groups by (an agent index, a group, a tree). The base class shapes the
reward column between `play` and `credit` and turns the rows into a `Rollout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from marljax import kernels
from marljax.workflows.types import ID_FIELDS, Generation


class Episodes:
    """Rows of one batch of episodes: `add(generation, **columns)` appends one.

    reward_dtype: the precision the rewards are recorded and shaped in (float64 keeps
    rewards computed in Python exact; a workflow whose rewards come from a float32
    kernel keeps them float32). shaped: `play` already added the shaping to each reward
    (joint actions, whose reward mixes the shaping of several generations).
    extras: the workflow's own metrics; num_problems: the batch's problem count (a
    group count for `credit`); context: what else `credit` needs that is not a row
    (a search tree).
    """

    def __init__(self, num_problems: int, reward_dtype: Any = np.float64, shaped: bool = False):
        self.num_problems, self.reward_dtype, self.shaped = num_problems, reward_dtype, shaped
        self.generations: list[Generation] = []
        self.columns: dict[str, list[Any]] = {}
        self.extras: dict[str, float] = {}
        self.context: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.generations)

    def add(
        self,
        generation: Generation,
        *,
        problem: Any,
        episode: int,
        node: int,
        reward: float,
        passed: float,
        parent: int = -1,
        depth: int = 0,
        turn: int = 0,
        **columns: int,
    ) -> None:
        row = dict(
            problem=problem,
            episode=episode,
            node=node,
            parent=parent,
            depth=depth,
            turn=turn,
            reward=reward,
            passed=passed,
            **columns,
        )
        if self.generations and row.keys() != self.columns.keys():
            raise ValueError(f"row columns {sorted(row)} differ from earlier rows' {sorted(self.columns)}")
        for name, value in row.items():
            self.columns.setdefault(name, []).append(value)
        self.generations.append(generation)

    def __getitem__(self, name: str) -> np.ndarray:
        """A column as numpy (`reward` in `reward_dtype`)."""
        values = self.columns.get(name, [])
        return np.asarray(values, self.reward_dtype) if name == "reward" else np.asarray(values)

    def __setitem__(self, name: str, values: Sequence[Any] | np.ndarray) -> None:
        if len(values) != len(self):
            raise ValueError(f"column {name!r} needs {len(self)} values, got {len(values)}")
        self.columns[name] = list(values) if name != "reward" else np.asarray(values, self.reward_dtype)

    def array(self, name: str, size: int | None = None) -> jax.Array:
        """A column for the kernels: `reward` as float32, any other as int32; with `size`, padded
        with zeros to that length (the kernels' mask leaves the padding out)."""
        dtype = np.float32 if name == "reward" else np.int32
        if size is None:
            return jnp.asarray(self[name], dtype)
        padded = np.zeros(size, dtype)
        padded[: len(self)] = self[name]
        return jnp.asarray(padded)

    @property
    def ids(self) -> list[Mapping[str, Any]]:
        """Each row's `ID_FIELDS`."""
        columns = [self.columns.get(name, []) for name in ID_FIELDS]
        return [dict(zip(ID_FIELDS, row)) for row in zip(*columns)]


def agentwise_advantages(
    episodes: Episodes,
    num_agents: int,
    group: str = "group",
    num_groups: int | None = None,
    singleton: str = "zero",
):
    """Dr. MAS's credit: each agent's (column `agent`) rewards normalised among its own rows of the
    same group (column `group`; `num_groups` of them, by default one per problem); an agent's lone
    row in a group gets 0 or, with `singleton="raw"`, its reward (`kernels.dr_mas_advantages`)."""
    advantages, _ = kernels.dr_mas_advantages(
        episodes.array("reward"),
        episodes.array("agent"),
        num_agents,
        group_ids=episodes.array(group),
        num_groups=episodes.num_problems if num_groups is None else num_groups,
        singleton=singleton,
    )
    return advantages
