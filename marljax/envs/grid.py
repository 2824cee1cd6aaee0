"""A procedurally generated planning game for AT-GRPO (arXiv 2510.11062): grid path planning.

A seeded ``size x size`` grid with walls, a start and a goal, always solvable
(checked by BFS). The planner answers a move string over ``U`` (row - 1),
``D`` (row + 1), ``L`` (column - 1), ``R`` (column + 1); row 0 is the top.

Shaped reward of a plan run from cell ``p`` (see :func:`plan_reward`):

* the moves run in order; the first illegal move (into a wall or off the
  grid) ends the plan: it and every later move count for nothing (0);
* 1 if the plan reaches the goal (at any move: the plan stops there);
* else ``max(0, 0.5 * (1 - d(end) / d(p)))`` with ``d`` the BFS distance to
  the goal: partial credit for getting closer, 0 for no progress or worse.

Multi-turn: the next turn starts where the previous turn's best plan ended
(:class:`PlanEnv`, the environment the AT-GRPO workflow drives).
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from marljax.envs.base import TurnResult, best_branch
from marljax.rewards import Problem, Verifier

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
# A run of move letters (spaces or commas between them allowed) that is not part of a word.
_PLAN = re.compile(r"(?<![A-Za-z])[UDLR](?:[ ,]*[UDLR])*(?![A-Za-z])")
_MARK = re.compile(r"moves\s*:", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, init=False)
class GridProblem(Problem):
    """A `Problem` of schema ``plan``: ``fields`` holds size, walls [[r, c], ...], start, goal,
    distance, solution."""

    def __init__(
        self, id: str, prompt: str, fields: Mapping[str, Any], schema: str = "plan", source: str = "<grid>"
    ):
        super().__init__(id, prompt, schema, source, fields)


def bfs_distances(fields: Mapping[str, Any]) -> dict[tuple[int, int], int]:
    """Moves from each reachable free cell to the goal (BFS from the goal; moves are reversible)."""
    size, walls = fields["size"], {tuple(w) for w in fields["walls"]}
    goal = tuple(fields["goal"])
    dist, queue = {goal: 0}, deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in walls and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def shortest_plan(fields: Mapping[str, Any], pos: Sequence[int] | None = None) -> str:
    """One shortest move string from ``pos`` (default: the start) to the goal (first move in UDLR order)."""
    dist = bfs_distances(fields)
    cell, plan = tuple(fields["start"] if pos is None else pos), []
    while dist[cell] > 0:
        for m, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if dist.get(nxt, -1) == dist[cell] - 1:
                plan.append(m)
                cell = nxt
                break
    return "".join(plan)


def parse_moves(text: str) -> str:
    """The moves in an answer: after the last ``Moves:`` (any case) if there is one, else anywhere;
    the first run of U/D/L/R letters not inside a word, separators dropped ('' if none)."""
    marks = list(_MARK.finditer(text or ""))
    segment = (text or "")[marks[-1].end() :] if marks else (text or "")
    m = _PLAN.search(segment)
    return re.sub(r"[ ,]", "", m.group(0)) if m else ""


@dataclasses.dataclass(frozen=True)
class PlanResult:
    pos: tuple[int, int]  # where the plan ended
    reached: bool  # the goal was reached
    illegal: bool  # an illegal move ended the plan
    used: int  # moves executed


def run_plan(fields: Mapping[str, Any], pos: Sequence[int], moves: str) -> PlanResult:
    """Execute ``moves`` from ``pos``: stop at the goal or before the first illegal move."""
    size, walls, goal = fields["size"], {tuple(w) for w in fields["walls"]}, tuple(fields["goal"])
    cell = tuple(pos)
    for k, m in enumerate(moves):
        if cell == goal:
            return PlanResult(cell, True, False, k)
        nxt = (cell[0] + MOVES[m][0], cell[1] + MOVES[m][1])
        if not (0 <= nxt[0] < size and 0 <= nxt[1] < size) or nxt in walls:
            return PlanResult(cell, False, True, k)
        cell = nxt
    return PlanResult(cell, cell == goal, False, len(moves))


def plan_reward(fields: Mapping[str, Any], pos: Sequence[int], moves: str) -> float:
    """1 at the goal, else ``max(0, 0.5 * (1 - d(end) / d(pos)))`` (module doc)."""
    res = run_plan(fields, pos, moves)
    if res.reached:
        return 1.0
    dist = bfs_distances(fields)
    return max(0.0, 0.5 * (1.0 - dist[res.pos] / dist[tuple(pos)]))


def grid_text(fields: Mapping[str, Any], pos: Sequence[int]) -> str:
    """One line per row: ``#`` wall, ``.`` free, ``A`` the agent, ``G`` the goal."""
    walls, goal, size = {tuple(w) for w in fields["walls"]}, tuple(fields["goal"]), fields["size"]

    def cell(rc):
        return "A" if rc == tuple(pos) else "G" if rc == goal else "#" if rc in walls else "."

    return "\n".join("".join(cell((r, c)) for c in range(size)) for r in range(size))


def grid_prompt(fields: Mapping[str, Any], pos: Sequence[int]) -> str:
    return (
        "Grid path planning. Move A to G. Row 0 is the top; '#' is a wall, '.' is free.\n"
        f"{grid_text(fields, pos)}\n"
        "Moves: U (up), D (down), L (left), R (right). A move into a wall or off the grid ends the plan.\n"
        "Reply with your moves on one line, like `Moves: RRD`."
    )


@dataclasses.dataclass(frozen=True)
class PlanState:
    pos: tuple[int, int]
    moves: str = ""  # moves executed so far (by the best plans)
    last: PlanResult | None = None


class PlanEnv:
    """Planner-only environment: each turn the planner plans from where the last best plan ended."""

    def __init__(self, planner: str):
        self.roles = (planner,)

    def start(self, problem: Problem) -> PlanState:
        if problem.schema != "plan":
            raise ValueError(
                f"task 'plan' needs grid problems (schema 'plan', from marljax.tasks.grid); "
                f"problem {problem.id!r} has schema {problem.schema!r}"
            )
        return PlanState(tuple(problem.fields["start"]))

    def prompt(self, agent: Any, problem: Problem, state: Any, role: str, turn: int) -> Any:
        """`agent`'s prompt at `state`: `request` in its template (`Agent.render_in_context`)."""
        return agent.render_in_context(*self.request(problem, state, role, turn))

    def request(self, problem: Problem, state: PlanState, role: str, turn: int) -> tuple[str, str, str]:
        """(problem text, feedback, history) for the planner at ``state``."""
        text = grid_prompt(problem.fields, state.pos)
        if turn == 0 or state.last is None:
            return text, "", ""
        d = bfs_distances(problem.fields)[state.pos]
        how = "was stopped by a wall or the edge" if state.last.illegal else "ended"
        return (
            text,
            f"Your last plan {how} at row {state.pos[0]}, column {state.pos[1]}: {d} moves from G.",
            f"Moves so far: {state.moves or '(none)'}",
        )

    def step(
        self,
        problems: Sequence[Problem],
        states: Sequence[PlanState],
        texts: Sequence[dict[str, list[str]]],
        verifier: Verifier,
    ) -> list[TurnResult]:
        del verifier  # plans are checked by running them on the grid
        out = []
        (role,) = self.roles
        for problem, state, cand in zip(problems, states, texts):
            plans = [parse_moves(t) for t in cand[role]]
            runs = [run_plan(problem.fields, state.pos, p) for p in plans]
            rewards = [plan_reward(problem.fields, state.pos, p) for p in plans]
            b = best_branch(rewards)
            new = PlanState(runs[b].pos, state.moves + plans[b][: runs[b].used], runs[b])
            out.append(
                TurnResult(
                    {role: rewards}, {role: [r.reached for r in runs]}, {role: b}, new, runs[b].reached
                )
            )
        return out
