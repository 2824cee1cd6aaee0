"""Dr. MAS's search orchestrator (arXiv 2602.08847): a router, a search agent and an answer agent.

Episode (G per problem), in rounds: the router reads the question and the notes gathered so far
and replies ``search`` or ``answer`` (its last such word; with neither: search while there are no
notes, else answer). On ``search`` the search agent takes one turn of its tool episode
(`marljax.workflows.turns`: search on ``qa``, python and calculator on ``math``), continuing
its own conversation, and the results join the notes; once the search agent answers (its answer
joins the notes as a suggestion) or reaches its turn limit, the router's ``search`` becomes
``answer``. On ``answer``, and in the last round whatever the router would say (it is not
asked), the answer agent answers from the notes (``<answer>...</answer>``; without the tags, its
whole reply) and the episode ends with the answer's score R.

Reward: R for every turn of every agent, plus ``process_weight`` times the search agent's
tool-process reward for its turns (`turns.process_reward`). Credit: each agent's rewards are
normalised among that agent's samples on the same problem (`marljax.kernels.dr_mas_advantages`
with problem groups), Dr. MAS's agent-wise normalisation. The router's and the search agent's
turns train as one sequence each with the notes and tool results masked, or one sample per turn
(`tools.multi_turn`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from marljax.envs.tool_env import ANSWER_FORMAT, extract_tagged_answer
from marljax.rewards import Problem, Verifier
from marljax.seeds import derive_seed
from marljax.workflows.base import Agent, BaseWorkflowConfig, Generator, Workflow, register_workflow
from marljax.workflows.dr_mas import route_mentions
from marljax.workflows.episodes import Episodes, agentwise_advantages
from marljax.workflows.turns import (
    AgentEpisode,
    TaskTools,
    ToolsConfig,
    episode_generations,
    process_reward,
)
from marljax.workflows.types import Generation, Prompt

ROUTER_TASK = "Reply 'search' to gather more information, or 'answer' when the notes suffice."


def router_choice(text: str, have_notes: bool) -> str:
    """The router's last word of 'search' or 'answer'; without one, answer once there are notes."""
    found = route_mentions(text, ("search", "answer"))
    if found:
        return found[-1]
    return "answer" if have_notes else "search"


class DrMasSearchConfig(BaseWorkflowConfig):
    """Dr. MAS search orchestrator: router -> search agent (tools) -> answer agent, agent-wise credit."""

    kind: Literal["dr_mas_search"] = "dr_mas_search"
    router: str = Field("router", description="agent choosing search or answer each round")
    searcher: str = Field("searcher", description="agent calling the tools")
    answerer: str = Field("answerer", description="agent writing the final answer from the notes")
    group_size: int = Field(4, ge=2, description="episodes per problem")
    max_rounds: int = Field(3, ge=1, description="rounds of an episode; the last one always answers")
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    process_weight: float = Field(0.0, ge=0, description="weight of the search agent's tool-process reward")

    @model_validator(mode="after")
    def _agents(self):
        names = [self.router, self.searcher, self.answerer]
        if len(set(names)) != 3:
            raise ValueError(f"router, searcher and answerer must be different agents, got {names}")
        if self.tools.task == "plan":
            raise ValueError("dr_mas_search runs tools.task qa or math")
        return self

    def check_agents(self, agents):
        return [
            ((key,), f"unknown agent; known: {', '.join(agents)}", name)
            for key, name in (
                ("router", self.router),
                ("searcher", self.searcher),
                ("answerer", self.answerer),
            )
            if name not in agents
        ]


@dataclasses.dataclass
class Episode:
    problem: int
    router_prompt: Prompt | None = None
    router_turns: list[Generation] = dataclasses.field(default_factory=list)
    search: AgentEpisode | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    answer_turn: Generation | None = None
    answer: str = ""
    rounds: int = 0

    @property
    def done(self) -> bool:
        return self.answer_turn is not None


def _notes_text(notes: Sequence[str]) -> str:
    return "Notes:\n" + ("\n".join(notes) if notes else "(none yet)")


@register_workflow("dr_mas_search")
class DrMasSearchWorkflow(Workflow[DrMasSearchConfig]):
    @functools.cached_property
    def task(self) -> TaskTools:
        """The configured task's tools and answer score."""
        return TaskTools(self.cfg.tools)

    def _play(self, problems, agents, generator, seed, G) -> list[Episode]:
        c = self.cfg
        router, searcher, answerer = agents[c.router], agents[c.searcher], agents[c.answerer]
        episodes = [Episode(i) for i in range(len(problems)) for _ in range(G)]
        for r in range(c.max_rounds):
            active = [e for e in episodes if not e.done]
            if not active:
                break
            routes = {}
            if r < c.max_rounds - 1:
                for e in active:
                    if e.router_prompt is None:
                        text = f"{problems[e.problem].prompt}\n\n{_notes_text(e.notes)}\n\n{ROUTER_TASK}"
                        e.router_prompt = router.render(text)
                gens = generator.generate(
                    [(router, e.router_prompt) for e in active], 1, derive_seed(seed, 3 * r)
                )
                for e, (g,) in zip(active, gens):
                    e.router_turns.append(g)
                    searching = e.search is None or not e.search.done
                    routes[id(e)] = router_choice(g.text, bool(e.notes)) if searching else "answer"
            to_search = [e for e in active if routes.get(id(e)) == "search"]
            for e in to_search:
                if e.search is None:
                    p = problems[e.problem]
                    e.search = AgentEpisode.start(
                        searcher, self.task.env("dr_mas_search", [searcher.name], p), p
                    )
            if to_search:
                gens = generator.generate(
                    [(searcher, e.search.prompt) for e in to_search], 1, derive_seed(seed, 3 * r + 1)
                )
                for e, (g,) in zip(to_search, gens):
                    res = e.search.act(g)
                    said = res.info.get("answer")
                    e.notes.append(res.observation if said is None else f"The search agent suggests: {said}")
            to_answer = [e for e in active if routes.get(id(e), "answer") == "answer"]
            if to_answer:
                texts = [
                    f"{problems[e.problem].prompt}\n\n{_notes_text(e.notes)}\n\n{ANSWER_FORMAT}"
                    for e in to_answer
                ]
                gens = generator.generate(
                    [(answerer, answerer.render(t)) for t in texts], 1, derive_seed(seed, 3 * r + 2)
                )
                for e, (g,) in zip(to_answer, gens):
                    e.answer_turn = g
                    tagged = extract_tagged_answer(g.text)
                    e.answer = (tagged if tagged is not None else g.text).strip()
            for e in active:
                e.rounds += 1
                if not e.done and e.router_turns and len(e.router_turns) == e.rounds:
                    # the router's conversation goes on with the notes as they are now
                    follow = f"{_notes_text(e.notes)}\n\n{ROUTER_TASK}"
                    g = e.router_turns[-1]
                    raw = f"{e.router_prompt}{g.text}\n\n{follow}\n\n"
                    e.router_prompt = e.router_prompt.continued(g, follow, raw)
        return episodes

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        c, G = self.cfg, self.cfg.group_size
        played = self._play(problems, agents, generator, seed, G)
        episodes = Episodes(len(problems))
        scores, fallbacks = [], 0
        for n, e in enumerate(played):
            R = self.task.score(problems[e.problem], e.answer)
            scores.append(R)
            search_bonus = c.process_weight * process_reward(e.search.steps) if e.search else 0.0
            parts = [(0, e.router_turns, R), (1, e.search.turns if e.search else [], R + search_bonus)]
            parts.append((2, [e.answer_turn], R))
            node = 0
            for k, turns, reward in parts:
                samples, fell_back = episode_generations(turns, c.tools.multi_turn)
                fallbacks += fell_back
                for t, g in enumerate(samples):
                    episodes.add(
                        g,
                        problem=problems[e.problem].id,
                        episode=n,
                        node=node,
                        parent=node - 1,
                        depth=k,
                        turn=t,
                        reward=reward,
                        passed=R == 1.0,
                        agent=k,
                        group=e.problem,
                    )
                    node += 1
        scores = np.asarray(scores)
        steps = [s for e in played if e.search for s in e.search.steps]
        calls = sum(s.info.get("calls", 0) for s in steps)
        episodes.extras.update(
            {
                "team/reward": float(scores.mean()),
                "team/pass_rate": float((scores == 1.0).mean()),
                "dr_mas/rounds": float(np.mean([e.rounds for e in played])),
                "dr_mas/search_turns": float(
                    np.mean([len(e.search.turns) if e.search else 0 for e in played])
                ),
                "tools/calls_per_episode": calls / len(played),
                "tools/valid_call_frac": sum(s.info.get("valid_calls", 0) for s in steps) / max(calls, 1),
                "multiturn/fallbacks": float(fallbacks),
            }
        )
        return episodes

    def credit(self, episodes: Episodes):
        """Dr. MAS: each agent's rewards normalised among its own on the same problem."""
        return agentwise_advantages(episodes, 3)

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) episode per held-out problem."""
        episodes = self._play(problems, agents, generator, 0, 1)
        scores = np.array([self.task.score(problems[e.problem], e.answer) for e in episodes])
        return {
            "eval/team/pass_at_1": float((scores == 1.0).mean()),
            "eval/team/reward": float(scores.mean()),
        }
