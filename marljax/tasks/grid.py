"""Procedural grid path-planning problems (AT-GRPO's planning game, `marljax.envs.grid`): the
``grid`` source."""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from marljax.envs.grid import GridProblem, bfs_distances, grid_prompt, shortest_plan

from .sources import GeneratedSource, register_source

__all__ = ["GridSource", "make_grid_problems"]


def make_grid_problems(n: int, seed: int = 0, size: int = 5, wall_prob: float = 0.3) -> list[GridProblem]:
    """``n`` solvable grids, deterministic from ``seed``; the start is at least 2 moves from the goal."""
    problems = []
    for i in range(n):
        rng = random.Random(f"grid/{seed}/{i}")
        while True:  # rejection sampling: redraw until the start reaches the goal
            cells = [(r, c) for r in range(size) for c in range(size)]
            start, goal = rng.sample(cells, 2)
            walls = sorted(x for x in cells if x not in (start, goal) and rng.random() < wall_prob)
            fields = {
                "size": size,
                "walls": [list(w) for w in walls],
                "start": list(start),
                "goal": list(goal),
            }
            d = bfs_distances(fields).get(start)
            if d is not None and d >= 2:
                break
        fields.update(distance=d, solution=shortest_plan(fields))
        problems.append(GridProblem(f"grid/{seed}/{i}", grid_prompt(fields, start), fields))
    return problems


@register_source("grid")
class GridSource(GeneratedSource):
    """Solvable ``size x size`` grids (`make_grid_problems`)."""

    kind: Literal["grid"] = "grid"
    size: int = Field(5, ge=3)

    def make(self, n: int, seed: int, split: str) -> list[GridProblem]:
        return make_grid_problems(n, seed=seed, size=self.size)
