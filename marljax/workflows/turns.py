"""An agent's turn: one completion, or a tool episode; and the tools a workflow's `tools:` option gives.

`run_turns` is the one place the workflows ask a `Generator` for text: a plain turn `(agent,
prompt)` is a completion (or `n` of them), a tool episode (`AgentEpisode`, one agent acting in a
`marljax.envs.tool_env.ToolEnv`) runs turn by turn until it answers, all episodes in lockstep, one
generate call per turn, each agent's next prompt continuing its last one with the tool results (so
that `episode_generations` can train the episode as one sequence with the results masked, or as
one sample per turn).

`ToolsConfig` (the `tools:` option of `sharp`, `dr_mas` and `at_grpo`) picks a task's tools and
answer score: ``qa`` (a `search` tool over the problem's own passages, or over a JSONL corpus;
exact match or F1), ``math`` (`python` and `calculator`; the answer's last number) and ``plan``
(the grid's `check_plan` checker; plans are scored by the workflow).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from marljax.envs import EnvSpec, StepResult
from marljax.envs.search import BM25Index, load_corpus, search_tool
from marljax.envs.tasks import numeric_score, problem_passages, qa_score
from marljax.envs.tool_calls import tools_text
from marljax.envs.tool_env import ANSWER_FORMAT, ToolEnv
from marljax.envs.tools import Tool, ToolBox, calculator_tool, python_tool
from marljax.rewards import Limits, Problem
from marljax.seeds import derive_seed
from marljax.settings import StrictModel
from marljax.workflows.base import Agent, Generator
from marljax.workflows.types import Generation, Prompt, merge_turns

TASKS = ("qa", "math", "plan")


class ToolsConfig(StrictModel):
    """The task's tools and how an episode is run and trained."""

    task: Literal[TASKS] = Field(
        "qa", description="qa: search + EM/F1; math: python + calculator; plan: grid checker"
    )
    corpus: str | None = Field(
        None, description="qa: a JSONL corpus to search (one for all problems); None: each problem's passages"
    )
    metric: Literal["em", "f1"] = Field("em", description="qa: exact match or token F1 of the answer")
    top_k: int = Field(2, ge=1, description="qa: passages a search returns")
    max_turns: int = Field(3, ge=1, description="turns of one agent's tool episode")
    max_calls: int = Field(2, ge=1, description="tool calls run per turn")
    max_observation_chars: int = Field(600, ge=16, description="longer tool results are cut, saying so")
    python_timeout_s: float = Field(5.0, gt=0, description="math: the python tool's time limit per program")
    multi_turn: Literal["merged", "per_turn"] = Field(
        "merged",
        description="merged: an agent's turns are one sequence with the tool results masked out of the "
        "loss; per_turn: one sample per turn",
    )


class TaskTools:
    """The tools of a `ToolsConfig`'s task on each problem, and the score of an answer."""

    def __init__(self, cfg: ToolsConfig):
        self.cfg = cfg
        # per problem id (problems repeat across steps), or "" for the corpus, built at first use
        self._indexes: dict[str, BM25Index] = {}

    def _index(self, problem: Problem) -> BM25Index:
        key = "" if self.cfg.corpus else problem.id
        if key not in self._indexes:
            passages = load_corpus(self.cfg.corpus) if self.cfg.corpus else problem_passages(problem)
            self._indexes[key] = BM25Index(passages)
        return self._indexes[key]

    def tools(self, problem: Problem, extra: Sequence[Tool] = ()) -> list[Tool]:
        c = self.cfg
        if c.task == "qa":
            return [search_tool(self._index(problem), c.top_k), *extra]
        if c.task == "math":
            limits = Limits(test_timeout_s=c.python_timeout_s, program_timeout_s=c.python_timeout_s + 1)
            return [python_tool(limits), calculator_tool(), *extra]
        return list(extra)

    def score(self, problem: Problem, answer: str) -> float:
        if self.cfg.task == "qa":
            return qa_score(problem, answer, self.cfg.metric)
        if self.cfg.task == "math":
            return numeric_score(problem, answer)
        raise ValueError("plan answers are scored by the workflow (marljax.envs.grid.plan_reward)")

    def env(self, name: str, agents: Sequence[str], problem: Problem, extra: Sequence[Tool] = ()) -> ToolEnv:
        c = self.cfg
        tools = self.tools(problem, extra)
        return ToolEnv(
            EnvSpec(name, tuple(agents), c.max_turns, ToolBox(tools).schemas),
            tools,
            self.score,
            max_calls=c.max_calls,
            max_observation_chars=c.max_observation_chars,
        )


def tool_prompt(agent: Agent, text: str, schemas: Sequence[dict]) -> Prompt:
    """`agent`'s prompt for `text` with the tools offered: as chat, through the template's tools
    (`Prompt.tools`); as raw text, described before the task."""
    base = agent.render(text)
    raw = f"{tools_text(schemas)}\n\n{base}" if schemas else str(base)
    return Prompt(raw, base.messages, schemas)


def process_reward(steps: Sequence[StepResult]) -> float:
    """The tool-process reward of an agent's episode: half for calls that ran without error, half
    for calls that returned something, as fractions of the calls it made (0 without calls)."""
    calls = sum(s.info.get("calls", 0) for s in steps)
    if not calls:
        return 0.0
    valid = sum(s.info.get("valid_calls", 0) for s in steps)
    useful = sum(s.info.get("useful_calls", 0) for s in steps)
    return 0.5 * (valid + useful) / calls


@dataclasses.dataclass
class AgentEpisode:
    """One agent acting in a `ToolEnv` until it answers or reaches the turn limit."""

    agent: Agent
    env: ToolEnv
    problem: Problem
    text: str  # the task as given to the agent
    prompt: Prompt
    turns: list[Generation] = dataclasses.field(default_factory=list)
    steps: list[StepResult] = dataclasses.field(default_factory=list)

    @classmethod
    def start(cls, agent: Agent, env: ToolEnv, problem: Problem, text: str | None = None) -> AgentEpisode:
        """Reset `env` on `problem`; the agent's first prompt is the first observation, or `text`
        (the problem as the workflow phrases it for this agent) with the answer format."""
        first = env.reset(problem)
        shown = first if text is None else f"{text}\n\n{ANSWER_FORMAT}"
        return cls(agent, env, problem, text or problem.prompt, tool_prompt(agent, shown, env.spec.tools))

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].done

    @property
    def answer(self) -> str | None:
        return self.steps[-1].info.get("answer") if self.steps else None

    @property
    def reward(self) -> float:
        return float(sum(s.reward for s in self.steps))

    def act(self, generation: Generation) -> StepResult:
        result = self.env.step(self.agent.name, generation.text)
        self.turns.append(generation)
        self.steps.append(result)
        if not result.done:
            role = "tool" if result.info.get("calls") else "user"
            raw = f"{self.prompt}{generation.text}\n\nObservation:\n{result.observation}\n\n"
            self.prompt = self.prompt.continued(generation, result.observation, raw, role)
        return result


def run_turns(
    generator: Generator, turns: Sequence[tuple[Agent, str] | AgentEpisode], seed: int, n: int = 1
) -> list[list[Generation]]:
    """Each turn's generations, in order. Plain turns `(agent, prompt)`: `n` completions each, from
    one generate call seeded `seed`. Tool episodes (n = 1): stepped until each has ended, per turn
    one generate call (seeded by `seed` and the turn) for all that go on; an episode's generations
    are its turns."""
    plain = [t for t in turns if not isinstance(t, AgentEpisode)]
    done = iter(generator.generate(plain, n, seed) if plain else [])
    episodes = [t for t in turns if isinstance(t, AgentEpisode)]
    turn = 0
    while active := [e for e in episodes if not e.done]:
        gens = generator.generate([(e.agent, e.prompt) for e in active], 1, derive_seed(seed, turn))
        for e, (g,) in zip(active, gens):
            e.act(g)
        turn += 1
    return [t.turns if isinstance(t, AgentEpisode) else next(done) for t in turns]


def episode_generations(turns: Sequence[Generation], multi_turn: str) -> tuple[list[Generation], int]:
    """An agent's turns as training samples: one merged sequence (`merge_turns`) when `multi_turn` is
    ``merged`` and the turns continue each other, else one per turn; and 1 when a merge fell back."""
    if multi_turn == "merged" and len(turns) > 1:
        merged = merge_turns(turns)
        if merged is not None:
            return [merged], 0
        return list(turns), 1
    return list(turns), 0
