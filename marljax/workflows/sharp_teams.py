"""SHARP's plans and tool teams: a plan's numbered sub-tasks, and (`sharp` with `tools:`) a team
whose workers act in order, each in its own tool episode, with some agents masked (module doc of
`marljax.workflows.sharp`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from marljax.rewards import Problem
from marljax.seeds import derive_seed
from marljax.workflows.base import Agent, Generator
from marljax.workflows.turns import AgentEpisode, TaskTools, run_turns

NO_PLAN = "(no plan)"
_ITEM = re.compile(r"^\s*(?:step\s*)?(\d+)\s*[.):]\s*(.+?)\s*$", re.I | re.M)


def parse_subtasks(text: str) -> dict[int, str]:
    """Numbered sub-tasks of a plan: `1. ...`, `2) ...`, `Step 3: ...`; the first of each number wins."""
    items: dict[int, str] = {}
    for m in _ITEM.finditer(text):
        items.setdefault(int(m.group(1)), m.group(2))
    return items


@dataclasses.dataclass
class TeamRun:
    """One tool episode's team with the agents outside `members` masked (bit 0 planner, bit i+1
    worker i)."""

    episode: int
    members: int
    work: list[AgentEpisode | None]

    @property
    def answer(self) -> str:
        answers = [w.answer for w in self.work if w is not None and w.answer is not None]
        return answers[-1] if answers else ""


def worker_text(problem: Problem, plan: str, notes: Sequence[str], i: int, W: int) -> str:
    """Worker `i`'s task (of `W`): the question, the plan, the answers of the workers before it and
    its sub-task."""
    task = parse_subtasks(plan).get(i + 1, "(the plan lists no such sub-task: follow the plan as a whole)")
    parts = [problem.prompt, f"Plan:\n{plan}"]
    if notes:
        parts.append("Answers of the workers before you:\n" + "\n".join(notes))
    parts.append(f"You are worker {i + 1} of {W}. Your sub-task: {task}")
    return "\n\n".join(parts)


def run_teams(
    trajs: Sequence[Any],
    jobs: Sequence[tuple[int, int]],
    workers: Sequence[Agent],
    task: TaskTools,
    generator: Generator,
    seed: int,
    reuse: Mapping[tuple[int, int, str], AgentEpisode] | None = None,
) -> list[TeamRun]:
    """Each `(episode, members)` job's team run, worker by worker (one lockstep batch each);
    a worker whose text was seen in `reuse` keeps that episode instead of acting again."""
    runs = [TeamRun(n, m, [None] * len(workers)) for n, m in jobs]
    for i, worker in enumerate(workers):
        fresh = []
        for run in runs:
            if not run.members >> (i + 1) & 1:
                continue
            t = trajs[run.episode]
            plan_text = t.plan.text if run.members & 1 else NO_PLAN
            notes = [
                f"Worker {j + 1}: {w.answer if w.answer is not None else '(no answer)'}"
                for j, w in enumerate(run.work[:i])
                if w is not None
            ]
            text = worker_text(t.problem, plan_text, notes, i, len(workers))
            known = (reuse or {}).get((run.episode, i, text))
            if known is not None:
                run.work[i] = known
                continue
            env = task.env("sharp", [worker.name], t.problem)
            run.work[i] = AgentEpisode.start(worker, env, t.problem, text)
            fresh.append(run.work[i])
        run_turns(generator, fresh, derive_seed(seed, i))
    return runs
