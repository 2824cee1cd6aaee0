"""Dr. MAS orchestrator (arXiv 2602.08847): solver, verifier and an optional router, agent-wise credit.

An episode (G per problem) runs turn by turn, all episodes of a batch in lockstep:

1. the solver writes a program (turn 0 is always the solver's);
2. the verifier reviews the latest program, given the sandbox's public-test
   feedback, and answers ACCEPT or REVISE with comments;
3. on REVISE the solver revises its program given the comments, and so on.

The episode ends on ACCEPT, or when the solver and the verifier have each had
`max_loops` turns (in the default order: at most `max_loops` write -> review
loops). Verdict: ACCEPT when the word ACCEPT (any case) comes before any
REVISE; anything else, an unparseable answer included, is REVISE; the comments
are the text after the verdict word (all of it without one).

Routing. Without a router the order is solver -> verifier -> solver -> ...
With a router, before each agent turn after the first, the router sees the
transcript and names the next agent: its text is searched for the first
whole-word, case-insensitive mention of the solver's or the verifier's agent
name; with neither, the default order applies. A named agent whose `max_loops`
turns are spent yields to the other; when only one agent has turns left the
router is not asked.

With tools (`tools:`), the team is Dr. MAS's search orchestrator instead: a router, a search agent
and an answer agent in rounds (`marljax.workflows.search_rounds`). Reward: the answer's score R
for every turn of every agent, plus ``process_weight`` times the search agent's tool-process
reward for its turns; credit agent-wise per problem as below. The router's and the search agent's
turns train as one sequence each with the notes and tool results masked, or one sample per turn
(`tools.multi_turn`).

Rewards: the episode reward R is the fraction of all tests (public and
private) passed by the final program (math: the answer is right). Every solver
and router turn gets R; a verifier turn gets 1 when its verdict was right
(ACCEPT iff the program it reviewed passes all tests), else 0. A solver or
router turn passes when the final program passes every test, a verifier turn
when its verdict was right.

Advantages (Dr. MAS): agent-wise, ``A_i = (r_i - mu_{p,k}) / (sigma_{p,k} + eps)``
over the turns of agent k in the G episodes of problem p
(`marljax.kernels.dr_mas_advantages` with problem groups). ``normalization:
global`` normalises all agents' turns of a problem together (what
`marljax.kernels.global_advantages` does on each problem's group): the GRPO
baseline whose gradient amplification `(sigma_k^2 + (mu_k - mu)^2) / sigma^2`
(within each problem) Dr. MAS removes; the trainer reports that factor
(`agent/<name>/amplification`) either way.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.rewards import Problem, Score, Verifier, extract_code, public_feedback
from marljax.seeds import derive_seed
from marljax.shapes import power_of_two_bucket
from marljax.workflows.base import (
    Agent,
    BaseWorkflowConfig,
    Generator,
    Workflow,
    register_alias,
    register_workflow,
)
from marljax.workflows.diversity import grouped_diversity
from marljax.workflows.episodes import Episodes
from marljax.workflows.search_rounds import SEARCH_AGENTS, play_rounds, round_episodes, route_mentions
from marljax.workflows.turns import TaskTools, ToolsConfig, run_turns
from marljax.workflows.types import Generation, Prompt

ROLES = ("solver", "verifier", "router")
_VERDICT = re.compile(r"\b(ACCEPT|REVISE)\b", re.I)


def parse_verdict(text: str) -> tuple[bool, str]:
    """(accepted, comments): ACCEPT iff the first verdict word is ACCEPT; comments follow the verdict."""
    m = _VERDICT.search(text)
    if m is None:
        return False, text.strip()
    return m.group(1).upper() == "ACCEPT", text[m.end() :].strip(" \t\n:.-")


def parse_route(text: str, names: Sequence[str]) -> str | None:
    """The first of `names` mentioned in `text` (whole word, any case), or None."""
    found = route_mentions(text, names)
    return found[0] if found else None


def _fence(code: str, problem: Problem) -> str:
    return code if problem.is_math else f"```python\n{code}\n```"


@dataclasses.dataclass
class Turn:
    role: str
    generation: Generation
    reward: float  # the verifier's own; solver and router turns get the episode's when it ends


@dataclasses.dataclass
class Episode:
    problem: Problem
    group: int  # problem index in the batch
    turns: list[Turn] = dataclasses.field(default_factory=list)
    code: str = ""  # latest program (math: the latest answer text)
    score: Score | None = None
    feedback: str = ""  # public-test feedback on `code`
    verdict: str = ""
    comments: str = ""
    used: dict[str, int] = dataclasses.field(default_factory=lambda: {"solver": 0, "verifier": 0})
    next_role: str = "verifier"
    routed: int = 0  # router turns whose text named an agent
    accepted: bool = False
    done: bool = False


class DrMasConfig(BaseWorkflowConfig):
    """Dr. MAS: solver / verifier (/ router) episodes with agent-wise advantage normalisation."""

    kind: Literal["dr_mas"] = "dr_mas"
    solver: str = Field("solver", description="agent that writes and revises the program")
    verifier: str = Field("verifier", description="agent that answers ACCEPT or REVISE with comments")
    router: str | None = Field(None, description="agent that names the next agent; None: fixed order")
    max_loops: int = Field(2, ge=1, description="turns each of solver and verifier may take per episode")
    group_size: int = Field(4, ge=2, description="episodes per problem")
    normalization: Literal["agent", "global"] = "agent"
    singleton: Literal["zero", "raw"] = Field(
        "zero",
        description="advantage of an agent's only turn in its problem group: 0, or its reward (DrMAS's code)",
    )
    tools: ToolsConfig | None = Field(
        None, description="the search orchestrator (router -> searcher -> answerer); None: solver / verifier"
    )
    searcher: str = Field("searcher", description="with tools: agent calling the tools")
    answerer: str = Field("answerer", description="with tools: agent writing the final answer from the notes")
    max_rounds: int = Field(
        3, ge=1, description="with tools: rounds of an episode; the last one always answers"
    )
    process_weight: float = Field(
        0.0, ge=0, description="with tools: weight of the search agent's tool-process reward"
    )

    @model_validator(mode="after")
    def _distinct(self):
        names = [n for n in self.names.values() if n is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"{', '.join(self.names)} must be different agents, got {names}")
        if self.tools is not None:
            if self.router is None:
                raise ValueError("dr_mas with tools needs a router")
            if self.tools.task == "plan":
                raise ValueError("dr_mas with tools runs tools.task qa or math")
        return self

    def check_agents(self, agents: Mapping[str, Any]):
        return [
            ((role,), f"unknown agent; known: {', '.join(agents)}", name)
            for role, name in self.names.items()
            if name is not None and name not in agents
        ]

    @property
    def names(self) -> dict[str, str | None]:
        """Role -> agent name (None: no router)."""
        if self.tools is not None:
            return {"router": self.router, "searcher": self.searcher, "answerer": self.answerer}
        return {"solver": self.solver, "verifier": self.verifier, "router": self.router}


@register_workflow("dr_mas")
class DrMasWorkflow(Workflow[DrMasConfig]):
    @functools.cached_property
    def task(self) -> TaskTools:
        """The configured task's tools and answer score (with `tools`)."""
        return TaskTools(self.cfg.tools)

    @property
    def names(self) -> dict[str, str | None]:
        return self.cfg.names

    @property
    def roles(self) -> list[str]:
        return [r for r in ROLES if self.names[r] is not None]

    # ------------------------------------------------------------- prompts
    def _prompt(self, role: str, ep: Episode, agent: Agent) -> Prompt:
        p, code = ep.problem, _fence(ep.code, ep.problem)
        if role == "solver" and not ep.used["solver"]:
            return agent.render_in_context(p.prompt)
        if role == "solver":
            comments = ep.comments or "(none)"
            request = f"Reviewer comments:\n{comments}\n\nRevise your solution and reply with it in full."
            text = agent.render_in_context(
                p.prompt, history=f"Your previous solution:\n{code}", feedback=request
            )
            # as chat: the solver's latest answer is its own turn, the review the user's reply
            latest = next(t.generation.text for t in reversed(ep.turns) if t.role == "solver")
            return agent.render_in_context(p.prompt).continued(latest, request, text)
        tests = f"Public test results:\n{ep.feedback}\n\n" if ep.feedback else ""
        if role == "verifier":
            return agent.render_in_context(
                p.prompt,
                history=f"Candidate solution:\n{code}",
                feedback=tests + "Reply ACCEPT if the solution is correct, otherwise "
                "REVISE followed by comments for its author.",
            )
        review = f"\n\nLatest review: {ep.verdict} {ep.comments}".rstrip() if ep.verdict else ""
        s, v = self.names["solver"], self.names["verifier"]
        return agent.render_in_context(
            p.prompt,
            history=f"Latest solution:\n{code}\n\n{tests}{review}".strip(),
            feedback=f"Who acts next? Reply with one name: {s} (writes or revises the "
            f"solution) or {v} (reviews it).",
        )

    # --------------------------------------------------------------- turns
    def _record_solutions(self, eps: list[Episode], gens: list[Generation], verifier: Verifier) -> None:
        scores = verifier.score([e.problem for e in eps], [g.text for g in gens])
        for e, g, s in zip(eps, gens, scores):
            e.turns.append(Turn("solver", g, 0.0))  # reward set when the episode ends
            e.code = g.text.strip() if e.problem.is_math else extract_code(g.text).code
            e.score, e.feedback, e.used["solver"] = s, public_feedback(s.result), e.used["solver"] + 1
            e.next_role = "verifier"

    def _record_review(self, e: Episode, g: Generation) -> None:
        e.accepted, e.comments = parse_verdict(g.text)
        e.verdict = "ACCEPT" if e.accepted else "REVISE"
        e.turns.append(Turn("verifier", g, float(e.accepted == e.score.passed)))
        e.used["verifier"] += 1
        e.next_role = "solver"

    def _turns_left(self, e: Episode) -> list[str]:
        """The roles among solver and verifier that may still act."""
        return [r for r in ("solver", "verifier") if e.used[r] < self.cfg.max_loops]

    def _episodes(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
        G: int,
    ) -> list[Episode]:
        agent = {r: agents[self.names[r]] for r in self.roles}
        eps = [Episode(p, i) for i, p in enumerate(problems) for _ in range(G)]
        gens = run_turns(
            generator,
            [
                (agent["solver"], self._prompt("solver", eps[i * G], agent["solver"]))
                for i in range(len(problems))
            ],
            seed,
            G,
        )
        self._record_solutions(eps, [g for group in gens for g in group], verifier)
        calls = 0  # generate calls after the first
        while True:
            for e in eps:
                left = self._turns_left(e)
                e.done = e.done or e.accepted or not left
                if not e.done and e.next_role not in left:
                    e.next_role = left[0]  # the named (or default) agent has no turns left
            active = [e for e in eps if not e.done]
            if not active:
                return eps
            to_route = [e for e in active if len(self._turns_left(e)) == 2] if "router" in agent else []
            if to_route:  # one router call for every episode that has a choice
                calls += 1
                gens = run_turns(
                    generator,
                    [(agent["router"], self._prompt("router", e, agent["router"])) for e in to_route],
                    derive_seed(seed, calls, "stage"),
                )
                for e, (g,) in zip(to_route, gens):
                    named = parse_route(g.text, [self.names["solver"], self.names["verifier"]])
                    e.turns.append(Turn("router", g, 0.0))
                    if named is not None:
                        e.routed += 1
                        e.next_role = "solver" if named == self.names["solver"] else "verifier"
            calls += 1
            gens = run_turns(
                generator,
                [(agent[e.next_role], self._prompt(e.next_role, e, agent[e.next_role])) for e in active],
                derive_seed(seed, calls, "stage"),
            )
            solved = [(e, g) for e, (g,) in zip(active, gens) if e.next_role == "solver"]
            for e, (g,) in zip(active, gens):
                if e.next_role == "verifier":
                    self._record_review(e, g)
            if solved:
                self._record_solutions([e for e, _ in solved], [g for _, g in solved], verifier)

    # ----------------------------------------------------------- interface
    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        if self.cfg.tools is not None:
            return self._play_search(problems, agents, generator, seed)
        eps = self._episodes(problems, agents, generator, verifier, seed, self.cfg.group_size)
        episodes = Episodes(len(problems))
        episodes.context["episodes"] = eps
        for n, e in enumerate(eps):
            for t, turn in enumerate(e.turns):
                episodes.add(
                    turn.generation,
                    problem=e.problem.id,
                    episode=n,
                    node=t,
                    parent=t - 1,
                    depth=t,
                    turn=t,
                    reward=turn.reward if turn.role == "verifier" else e.score.reward,
                    passed=turn.reward if turn.role == "verifier" else e.score.passed,
                    agent=self.roles.index(turn.role),
                    group=e.group,
                )
        return episodes

    def _play_search(self, problems, agents, generator, seed) -> Episodes:
        c = self.cfg
        played = play_rounds(c, self.task, problems, agents, generator, seed, c.group_size)
        scores = [self.task.score(problems[e.problem], e.answer) for e in played]
        return round_episodes(problems, played, scores, c.process_weight, c.tools.multi_turn)

    def credit(self, episodes: Episodes):
        """Dr. MAS: each agent's rewards normalised per problem (or all agents together: `global`)."""
        N, P = len(episodes), episodes.num_problems
        num_agents = SEARCH_AGENTS if self.cfg.tools is not None else len(self.roles)
        # padded to a power of two (masked out) so the jitted kernels compile for few sizes
        size = power_of_two_bucket(N)
        rewards, groups = episodes.array("reward", size), episodes.array("group", size)
        mask = jnp.arange(size) < N
        advantages, stats = kernels.dr_mas_advantages(
            rewards,
            episodes.array("agent", size),
            num_agents,
            mask,
            group_ids=groups,
            num_groups=P,
            singleton=self.cfg.singleton,
        )
        if self.cfg.normalization == "global":  # all agents of a problem together (GRPO's group baseline)
            advantages = kernels.group_advantages(rewards, groups, P, mask, singleton=self.cfg.singleton)
        if self.cfg.tools is None:
            episodes.extras.update(self._extras(episodes.context["episodes"], episodes["agent"], stats))
        return np.asarray(advantages)[:N]

    def _extras(
        self, eps: list[Episode], agent_ids: np.ndarray, stats: Mapping[str, Any]
    ) -> dict[str, float]:
        out = {
            "team/reward": float(np.mean([e.score.reward for e in eps])),
            "team/pass_rate": float(np.mean([e.score.passed for e in eps])),
            "team/accept_rate": float(np.mean([e.accepted for e in eps])),
            "team/loops": float(np.mean([e.used["solver"] for e in eps])),
            "team/turns": float(np.mean([len(e.turns) for e in eps])),
        }
        for k, role in enumerate(self.roles):
            name = self.names[role]
            out[f"agent/{name}/turns"] = float((agent_ids == k).sum()) / len(eps)
            out[f"agent/{name}/reward_std"] = float(stats["agent_std"][k])
        if self.names["router"] is not None:
            asked = sum(turn.role == "router" for e in eps for turn in e.turns)
            out[f"agent/{self.names['router']}/parse_rate"] = sum(e.routed for e in eps) / max(asked, 1)
        groups: dict[int, list[str]] = {}
        for e in eps:
            groups.setdefault(e.group, []).append(e.code)
        out.update(grouped_diversity(list(groups.values()), "team"))
        return out

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) episode per held-out problem: the team's pass@1."""
        if self.cfg.tools is not None:
            played = play_rounds(self.cfg, self.task, problems, agents, generator, 0, 1)
            scores = np.array([self.task.score(problems[e.problem], e.answer) for e in played])
            return {
                "eval/team/pass_at_1": float((scores == 1.0).mean()),
                "eval/team/reward": float(scores.mean()),
            }
        eps = self._episodes(problems, agents, generator, verifier, 0, 1)
        verdicts = [turn.reward for e in eps for turn in e.turns if turn.role == "verifier"]
        return {
            "eval/team/pass_at_1": float(np.mean([e.score.passed for e in eps])),
            "eval/team/reward": float(np.mean([e.score.reward for e in eps])),
            "eval/team/loops": float(np.mean([e.used["solver"] for e in eps])),
            f"eval/{self.names['verifier']}/accuracy": float(np.mean(verdicts)) if verdicts else 0.0,
        }


def _from_dr_mas_search(v: dict) -> dict:
    """`kind: dr_mas_search` (the search orchestrator before it was an option) as `kind: dr_mas`."""
    v = dict(v, kind="dr_mas")
    v.setdefault("router", "router")
    v.setdefault("tools", {})
    return v


register_alias("dr_mas_search", _from_dr_mas_search)
