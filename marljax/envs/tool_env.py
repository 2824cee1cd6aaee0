"""A multi-turn tool-use episode (`TextEnv`): agents call tools until one of them answers.

Each step an agent's reply is read for tool calls (`marljax.envs.tool_calls`) and for a final
answer (``<answer>...</answer>``):

* an answer ends the episode with the task's score of it as the reward;
* otherwise the calls run (`ToolBox`) and their results are the observation: an unparsable call,
  an unknown tool, bad arguments, a tool that raises or times out all come back as text the agent
  reads ("your call could not be parsed: ..."), with a reward of 0;
* a reply with neither gets a reminder of the answer format;
* the step that reaches the turn limit without an answer ends the episode with reward 0
  (``info["turn_limit"]``).

`info` of each step holds the calls, their results and the counts a process reward needs
(``calls``, ``valid_calls``: ran without error, ``useful_calls``: ran and returned something).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from marljax.envs.base import EnvSpec, StepResult
from marljax.envs.tool_calls import parse_tool_calls
from marljax.envs.tools import Tool, ToolBox, clean_text, truncate
from marljax.rewards import Problem

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ANSWER_FORMAT = "When you know the final answer, write it as <answer>...</answer>."
# a tool result that carries nothing to use
_EMPTY_RESULTS = ("", "no results")


def extract_tagged_answer(text: str) -> str | None:
    """The last ``<answer>...</answer>`` of a reply, stripped; None without one."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


@dataclasses.dataclass
class ToolEnv:
    """One tool-use episode at a time (module doc).

    tools: the tools every episode offers, or a function of the problem giving them (a checker
    bound to one grid); score: the reward of a final answer to a problem; tool_agents: the agents
    allowed to call tools (None: every agent of the spec); max_calls: calls run per step (further
    ones are reported as skipped)."""

    spec: EnvSpec
    tools: Sequence[Tool] | Callable[[Problem], Sequence[Tool]]
    score: Callable[[Problem, str], float]
    tool_agents: Sequence[str] | None = None
    max_calls: int = 4
    max_observation_chars: int = 2000

    def __post_init__(self) -> None:
        self._problem: Problem | None = None
        self._box: ToolBox | None = None
        self.turn = 0
        self.done = True
        self.seed = 0

    def tool_schemas(self, problem: Problem) -> tuple[dict[str, Any], ...]:
        """The schemas of the tools offered on `problem` (for the chat template's `tools=`)."""
        return ToolBox(self._tools_for(problem)).schemas

    def _tools_for(self, problem: Problem) -> Sequence[Tool]:
        return self.tools(problem) if callable(self.tools) else self.tools

    def reset(self, problem: Problem, seed: int = 0) -> str:
        # `seed` is kept for tools that draw at random; the built-in ones are deterministic
        self._problem, self.seed, self.turn, self.done = problem, seed, 0, False
        self._box = ToolBox(self._tools_for(problem), self.max_observation_chars)
        return f"{problem.prompt}\n\n{ANSWER_FORMAT}"

    def step(self, agent: str, action_text: str) -> StepResult:
        if agent not in self.spec.agents:
            raise ValueError(f"env {self.spec.name!r}: unknown agent {agent!r}; agents: {self.spec.agents}")
        if self.done or self._problem is None:
            raise RuntimeError(f"env {self.spec.name!r}: step after the episode ended; call reset first")
        self.turn += 1
        info: dict[str, Any] = {"turn": self.turn, "agent": agent, "calls": 0, "valid_calls": 0}
        info["useful_calls"] = 0
        answer = extract_tagged_answer(action_text)
        if answer is not None:
            self.done = True
            info["answer"] = answer
            return StepResult(f"Final answer: {answer}", float(self.score(self._problem, answer)), True, info)
        observation = self._run_calls(agent, action_text, info)
        if self.turn >= self.spec.max_turns:
            self.done = True
            info["turn_limit"] = True
            observation += f"\n\nThe turn limit ({self.spec.max_turns}) is reached without an answer."
        return StepResult(observation, 0.0, self.done, info)

    def _run_calls(self, agent: str, text: str, info: dict[str, Any]) -> str:
        parsed = parse_tool_calls(text)
        info["parse_errors"] = list(parsed.errors)
        if not parsed.attempted:
            return f"No tool call and no answer found. {ANSWER_FORMAT}"
        parts = [f"Your call could not be parsed: {e}" for e in parsed.errors]
        info["calls"] = len(parsed.calls) + len(parsed.errors)
        if self.tool_agents is not None and agent not in self.tool_agents:
            parts.append(f"error: agent {agent!r} cannot call tools")
            info["results"] = []
            return "\n".join(parts)
        results = [self._box.run(c) for c in parsed.calls[: self.max_calls]]
        info["results"] = [
            {"name": r.call.name, "arguments": r.call.arguments, "error": r.error, "text": r.text}
            for r in results
        ]
        info["valid_calls"] = sum(r.ok for r in results)
        info["useful_calls"] = sum(r.ok and r.text.strip() not in _EMPTY_RESULTS for r in results)
        # the results are made safe by the box; the tool name is the model's own text, echoed
        parts += [f"[{clean_text(r.call.name)}] {r.text}" for r in results]
        skipped = len(parsed.calls) - len(results)
        if skipped:
            parts.append(f"{skipped} further call(s) skipped: at most {self.max_calls} per turn")
        # each result is cut by the box; several together are cut once more
        return truncate("\n".join(parts), self.max_observation_chars)[0]


def run_episode(env: ToolEnv, problem: Problem, replies: Sequence[str], agent: str | None = None):
    """Scripted play (tests, notebooks): `agent` (default: the spec's first) sends `replies` in order
    until the episode ends or they run out; the first observation and the `StepResult`s."""
    first = env.reset(problem)
    agent = agent or env.spec.agents[0]
    steps = []
    for reply in replies:
        steps.append(env.step(agent, reply))
        if steps[-1].done:
            break
    return first, steps
