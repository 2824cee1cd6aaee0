"""AT-GRPO's tree with tools (`at_grpo` with `tools:`): a tool agent, then the planner, each turn.

Each turn the tool agent, then the planner, samples K candidates from the same state:

* tool agent: calls the task's tools (``plan``: `check_plan`, which runs a move string on the grid
  from the current cell and says where it ends, without planning; ``math``: python and calculator).
  On ``plan`` its reward is half its tool-process reward (`turns.process_reward`: the share of its
  calls that ran, and of those that returned something) and half the shaped grid reward of the
  best move string it checked, as the reference rewards its tool agent by the environment reward
  of the actions its tool produced (PettingLLMs' plan_path): a check of one move runs as well as a
  check of a whole path, only the second tells the planner the way. On ``math`` its reward is the
  correctness of its tool's output, as PettingLLMs rewards its math tool agent by whether its
  code's output equals the answer: 1 when the last number in the output of its last call (a python
  program's printed output, when it ran to the end; a calculator's value) is the problem's answer
  (`marljax.envs.tasks.numeric_score`), else 0. The last call, not any call: listing guesses in
  several calls must not pay. Its best candidate's calls and results join the notes both agents see.
* planner: reads the state and the notes and commits: ``plan`` a move string (reward
  `marljax.envs.grid.plan_reward` from the current cell; the best plan moves the agent), ``math``
  an answer (``<answer>``, or the reply's last number; reward 1 when right).

`ToolTree` is the tree's environment: two chained stages a turn (each stage's candidates continue
the previous stage's best), scored by `step` as `marljax.envs.TurnResult`s. Every candidate is one
sample (the branches of a tree are not one sequence).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from marljax.envs import StepResult, TurnResult, best_branch
from marljax.envs.grid import grid_prompt, parse_moves, plan_reward, run_plan
from marljax.envs.tasks import grid_checker_tool, numeric_score
from marljax.envs.tool_calls import parse_tool_calls
from marljax.envs.tool_env import extract_tagged_answer
from marljax.envs.tools import ToolBox, ToolResult
from marljax.rewards import Problem, Verifier
from marljax.workflows.turns import TaskTools, ToolsConfig, process_reward, tool_prompt

TOOL_TASK = {
    "plan": "Use the tools to check ideas before the plan agent commits. Report what you found.",
    "math": "Use the tools to compute the answer; the output of your last call is checked against it.",
}
PLAN_TASK = {
    "plan": "Commit your moves on one line, like `Moves: RRD`.",
    "math": "Give the final answer as <answer>...</answer>.",
}


@dataclasses.dataclass
class State:
    problem: Problem
    pos: tuple[int, int] | None  # plan: the agent's cell
    notes: list[str] = dataclasses.field(default_factory=list)
    solved: bool = False
    last_reward: float = 0.0  # the planner's best reward at its last turn
    turn: int = 0  # turns played


def tool_output(result: ToolResult) -> str | None:
    """What a math tool call computed: a python program's printed output when it ran to the end, a
    calculator's value; None for a call that failed or whose output was truncated (the truncation
    note ends with a number of its own)."""
    return None if not result.ok or result.truncated else result.result


class ToolTree:
    """The tool agent's stage, then the planner's, each turn (module doc)."""

    chained = True

    def __init__(self, tool_agent: str, planner: str, cfg: ToolsConfig):
        self.roles = (tool_agent, planner)
        self.stages = ((tool_agent,), (planner,))
        self.cfg = cfg

    @functools.cached_property
    def task(self) -> TaskTools:
        return TaskTools(self.cfg)

    def start(self, problem: Problem) -> State:
        if self.cfg.task == "plan":
            if problem.schema != "plan":
                raise ValueError(
                    f"tools.task plan needs grid problems; {problem.id!r} has schema {problem.schema!r}"
                )
            return State(problem, tuple(problem.fields["start"]))
        if not problem.is_math:
            raise ValueError(
                f"tools.task math needs math problems; {problem.id!r} has schema {problem.schema!r}"
            )
        return State(problem, None)

    def _view(self, s: State) -> str:
        view = grid_prompt(s.problem.fields, s.pos) if s.pos is not None else s.problem.prompt
        return f"{view}\n\nNotes:\n" + ("\n".join(s.notes) if s.notes else "(none yet)")

    def _box(self, s: State) -> ToolBox:
        extra = [grid_checker_tool(s.problem, s.pos)] if s.pos is not None else []
        return ToolBox(self.task.tools(s.problem, extra), self.cfg.max_observation_chars)

    def prompt(self, agent: Any, problem: Problem, s: State, role: str, turn: int) -> Any:
        if role == self.roles[0]:
            return tool_prompt(agent, f"{self._view(s)}\n\n{TOOL_TASK[self.cfg.task]}", self._box(s).schemas)
        return agent.render(f"{self._view(s)}\n\n{PLAN_TASK[self.cfg.task]}")

    def _tool_step(self, s: State, box: ToolBox, text: str) -> tuple[StepResult, float]:
        """The tool agent's candidate: its calls run; the observation and the counts of a `ToolEnv`
        step, and the candidate's reward (module doc)."""
        parsed = parse_tool_calls(text)
        results = [box.run(call) for call in parsed.calls[: self.cfg.max_calls]]
        checked = [
            plan_reward(s.problem.fields, s.pos, parse_moves(f"Moves: {r.call.arguments.get('moves', '')}"))
            for r in results
            if r.ok and r.call.name == "check_plan" and s.pos is not None
        ]
        lines = [f"Your call could not be parsed: {e}" for e in parsed.errors]
        lines += [f"[{r.call.name}] {r.call.arguments} -> {r.text}" for r in results]
        info = {
            "calls": len(parsed.calls) + len(parsed.errors),
            "valid_calls": sum(r.ok for r in results),
            "useful_calls": sum(r.ok and r.text.strip() not in ("", "no results") for r in results),
        }
        step = StepResult("\n".join(lines) or "(no tool call)", 0.0, False, info)
        if s.pos is None:
            output = tool_output(results[-1]) if results else None
            return step, numeric_score(s.problem, output) if output is not None else 0.0
        return step, 0.5 * process_reward([step]) + 0.5 * max(checked, default=0.0)

    def _plan_score(self, s: State, text: str) -> tuple[float, bool, tuple[int, int] | None]:
        if s.pos is None:
            answer = extract_tagged_answer(text)
            r = numeric_score(s.problem, answer if answer is not None else text)
            return r, r == 1.0, None
        moves = parse_moves(text)
        res = run_plan(s.problem.fields, s.pos, moves)
        return plan_reward(s.problem.fields, s.pos, moves), res.reached, res.pos

    def step(
        self,
        problems: Sequence[Problem],
        states: Sequence[State],
        texts: Sequence[dict[str, list[str]]],
        verifier: Verifier,
    ) -> list[TurnResult]:
        """Score one stage's candidates and continue each problem's best (the state is updated in place)."""
        del verifier  # tool calls and plans are checked here
        tool, planner = self.roles
        out = []
        for s, cand in zip(states, texts):
            if tool in cand:
                box = self._box(s)
                steps, rewards = zip(*(self._tool_step(s, box, t) for t in cand[tool]))
                b = best_branch(list(rewards))
                s.notes.append(f"Turn {s.turn + 1}, tool agent:\n{steps[b].observation}")
                out.append(
                    TurnResult(
                        {tool: list(rewards)}, {tool: [r == 1.0 for r in rewards]}, {tool: b}, s, s.solved
                    )
                )
                continue
            scored = [self._plan_score(s, t) for t in cand[planner]]
            b = best_branch([r for r, _, _ in scored])
            s.last_reward, s.solved, s.turn = scored[b][0], scored[b][1], s.turn + 1
            if s.pos is not None:
                moved = scored[b][2]
                s.notes.append(f"Turn {s.turn}, plan agent moved to row {moved[0]}, column {moved[1]}.")
                s.pos = moved
            out.append(
                TurnResult(
                    {planner: [r for r, _, _ in scored]},
                    {planner: [ok for _, ok, _ in scored]},
                    {planner: b},
                    s,
                    s.solved,
                )
            )
        return out
