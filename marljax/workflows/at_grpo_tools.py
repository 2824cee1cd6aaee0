"""AT-GRPO with a tool agent and a plan agent (arXiv 2510.11062): tree sampling over turns.

Each problem is played for up to ``num_turns`` turns. At each turn the tool agent, then the plan
agent, samples K candidates from the same state:

* tool agent: calls the task's tools (``plan``: `check_plan`, which runs a move string on the grid
  from the current cell and says where it ends, without planning; ``math``: python and calculator).
  Its reward is its tool-process reward (`turns.process_reward`: the share of its calls that
  ran, and of those that returned something); on ``plan`` that is half of it, the other half the
  shaped grid reward of the best move string it checked, as the reference rewards its tool agent
  by the environment reward of the actions its tool produced (PettingLLMs' plan_path): a check of
  one move runs as well as a check of a whole path, only the second tells the plan agent the way.
  Its best candidate's calls and results join the notes both agents see.
* plan agent: reads the state and the notes and commits: ``plan`` a move string (reward
  `marljax.envs.grid.plan_reward` from the current cell; the best plan moves the agent), ``math``
  an answer (``<answer>``, or the reply's last number; reward 1 when right).

The best candidate of each agent (highest reward, ties to the lowest index) continues, and a
problem ends once the plan agent's best candidate solves it. Credit: groups keyed by (problem,
turn, agent) (`marljax.kernels.at_grpo_advantages`): a candidate is compared only with the K - 1
others sampled from the same state. Every candidate is one sample (the branches of a tree are not
one sequence).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from marljax.envs import StepResult, best_branch
from marljax.envs.grid import grid_prompt, parse_moves, plan_reward, run_plan
from marljax.envs.tasks import grid_checker_tool, numeric_score
from marljax.envs.tool_calls import parse_tool_calls
from marljax.envs.tool_env import extract_tagged_answer
from marljax.envs.tools import ToolBox
from marljax.rewards import Problem, Verifier
from marljax.seeds import derive_seed
from marljax.workflows.at_grpo import turnwise_advantages
from marljax.workflows.base import Agent, BaseWorkflowConfig, Generator, Workflow, register_workflow
from marljax.workflows.episodes import Episodes
from marljax.workflows.turns import TaskTools, ToolsConfig, process_reward, tool_prompt
from marljax.workflows.types import Generation

TOOL_TASK = "Use the tools to check ideas before the plan agent commits. Report what you found."
PLAN_TASK = {
    "plan": "Commit your moves on one line, like `Moves: RRD`.",
    "math": "Give the final answer as <answer>...</answer>.",
}


class AtGrpoToolsConfig(BaseWorkflowConfig):
    """AT-GRPO with a tool agent and a plan agent: K candidates per agent per turn, best branch on."""

    kind: Literal["at_grpo_tools"] = "at_grpo_tools"
    tool_agent: str = Field("tool_agent", description="agent calling the tools")
    plan_agent: str = Field("plan_agent", description="agent committing moves (plan) or the answer (math)")
    num_candidates: int = Field(4, ge=2, description="K: candidates per agent per turn")
    num_turns: int = Field(2, ge=1)
    tools: ToolsConfig = Field(default_factory=lambda: ToolsConfig(task="plan", multi_turn="per_turn"))
    estimator: Literal["grpo", "dr_grpo"] = "grpo"
    stop_when_solved: bool = Field(
        True, description="end a problem once the plan agent's best branch solves it"
    )

    @model_validator(mode="after")
    def _task(self):
        if self.tool_agent == self.plan_agent:
            raise ValueError("tool_agent and plan_agent must be different agents")
        if self.tools.task not in ("plan", "math"):
            raise ValueError(f"at_grpo_tools runs tools.task plan or math, got {self.tools.task!r}")
        if self.tools.multi_turn != "per_turn":
            raise ValueError(
                "at_grpo_tools trains each candidate as one sample: set tools.multi_turn: per_turn"
            )
        return self

    def check_agents(self, agents):
        return [
            ((key,), f"unknown agent; known: {', '.join(agents)}", name)
            for key, name in (("tool_agent", self.tool_agent), ("plan_agent", self.plan_agent))
            if name not in agents
        ]


@dataclasses.dataclass
class State:
    problem: Problem
    pos: tuple[int, int] | None  # plan: the agent's cell
    notes: list[str] = dataclasses.field(default_factory=list)
    solved: bool = False
    last_reward: float = 0.0  # the plan agent's best reward at its last turn
    last_node: int = -1  # the best candidate of the latest stage: the parent of the next


@dataclasses.dataclass(frozen=True)
class Candidate:
    problem: int
    turn: int
    agent: int  # 0 tool agent, 1 plan agent
    index: int  # k of K
    parent: int
    generation: Generation
    reward: float
    passed: bool

    def node(self, K: int) -> int:
        return (2 * self.turn + self.agent) * K + self.index


@register_workflow("at_grpo_tools")
class AtGrpoToolsWorkflow(Workflow[AtGrpoToolsConfig]):
    @functools.cached_property
    def task(self) -> TaskTools:
        """The configured task's tools and answer score."""
        return TaskTools(self.cfg.tools)

    def _start(self, problem: Problem) -> State:
        if self.cfg.tools.task == "plan":
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
        c = self.cfg.tools
        return ToolBox(self.task.tools(s.problem, extra), c.max_observation_chars)

    def _tool_step(self, s: State, box: ToolBox, text: str) -> tuple[StepResult, float]:
        """The tool agent's candidate: its calls run; the observation and the counts of a `ToolEnv`
        step, and the candidate's reward (module doc)."""
        parsed = parse_tool_calls(text)
        results = [box.run(call) for call in parsed.calls[: self.cfg.tools.max_calls]]
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
            return step, process_reward([step])
        return step, 0.5 * process_reward([step]) + 0.5 * max(checked, default=0.0)

    def _plan_score(self, s: State, text: str) -> tuple[float, bool, tuple[int, int] | None]:
        if s.pos is None:
            answer = extract_tagged_answer(text)
            r = numeric_score(s.problem, answer if answer is not None else text)
            return r, r == 1.0, None
        moves = parse_moves(text)
        res = run_plan(s.problem.fields, s.pos, moves)
        return plan_reward(s.problem.fields, s.pos, moves), res.reached, res.pos

    def _play(self, problems, agents, generator, seed, K) -> tuple[list[Candidate], list[State]]:
        c = self.cfg
        tool, planner = agents[c.tool_agent], agents[c.plan_agent]
        states = [self._start(p) for p in problems]
        out: list[Candidate] = []
        for t in range(c.num_turns):
            live = [i for i, s in enumerate(states) if not (c.stop_when_solved and s.solved)]
            if not live:
                break
            boxes = {i: self._box(states[i]) for i in live}
            requests = [
                (tool, tool_prompt(tool, f"{self._view(states[i])}\n\n{TOOL_TASK}", boxes[i].schemas))
                for i in live
            ]
            gens = generator.generate(requests, K, derive_seed(seed, 2 * t))
            for i, cands in zip(live, gens):
                s = states[i]
                steps, rewards = zip(*(self._tool_step(s, boxes[i], g.text) for g in cands))
                b = best_branch(list(rewards))
                out += [
                    Candidate(i, t, 0, k, s.last_node, g, r, r == 1.0)
                    for k, (g, r) in enumerate(zip(cands, rewards))
                ]
                s.last_node = out[-K + b].node(K)
                s.notes.append(f"Turn {t + 1}, tool agent:\n{steps[b].observation}")
            task = PLAN_TASK[c.tools.task]
            requests = [(planner, planner.render(f"{self._view(states[i])}\n\n{task}")) for i in live]
            gens = generator.generate(requests, K, derive_seed(seed, 2 * t + 1))
            for i, cands in zip(live, gens):
                s = states[i]
                scored = [self._plan_score(s, g.text) for g in cands]
                b = best_branch([r for r, _, _ in scored])
                out += [
                    Candidate(i, t, 1, k, s.last_node, g, r, ok)
                    for k, (g, (r, ok, _)) in enumerate(zip(cands, scored))
                ]
                s.last_node = out[-K + b].node(K)
                s.last_reward, s.solved = scored[b][0], scored[b][1]
                if s.pos is not None:
                    moved = scored[b][2]
                    s.notes.append(f"Turn {t + 1}, plan agent moved to row {moved[0]}, column {moved[1]}.")
                    s.pos = moved
        return out, states

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        c = self.cfg
        cands, states = self._play(problems, agents, generator, seed, c.num_candidates)
        K = c.num_candidates
        episodes = Episodes(len(problems))
        for x in cands:
            episodes.add(
                x.generation,
                problem=problems[x.problem].id,
                episode=x.problem,
                node=x.node(K),
                parent=x.parent,
                depth=2 * x.turn + x.agent,
                turn=x.turn,
                reward=x.reward,
                passed=x.passed,
                agent=x.agent,
            )
        tool = [x for x in cands if x.agent == 0]
        episodes.extras.update(
            {
                "team/reward": float(np.mean([s.last_reward for s in states])),
                "team/pass_rate": float(np.mean([s.solved for s in states])),
                "at_grpo/turns": float(
                    np.mean([max(x.turn for x in cands if x.problem == i) + 1 for i in range(len(problems))])
                ),
                "tools/call_frac": float(
                    np.mean([bool(parse_tool_calls(x.generation.text).attempted) for x in tool])
                ),
                "tools/process_reward": float(np.mean([x.reward for x in tool])),
            }
        )
        return episodes

    def credit(self, episodes: Episodes):
        """GRPO within each (problem, turn, agent) group of candidates."""
        return turnwise_advantages(episodes, self.cfg.num_turns, 2, self.cfg.estimator)

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) candidate per agent and turn for each held-out problem."""
        _, states = self._play(problems, agents, generator, 0, 1)
        return {
            "eval/team/pass_at_1": float(np.mean([s.solved for s in states])),
            "eval/team/reward": float(np.mean([s.last_reward for s in states])),
        }
