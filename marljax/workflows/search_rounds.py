"""Dr. MAS's search orchestrator (arXiv 2602.08847; `dr_mas` with `tools:`): router, search agent, answer agent.

Episode (G per problem), in rounds: the router reads the question and the notes gathered so far
and replies ``search`` or ``answer`` (its last such word; with neither: search while there are no
notes, else answer). On ``search`` the search agent takes one turn of its tool episode
(`marljax.workflows.turns`: search on ``qa``, python and calculator on ``math``), continuing
its own conversation, and the results join the notes; once the search agent answers (its answer
joins the notes as a suggestion) or reaches its turn limit, the router's ``search`` becomes
``answer``. On ``answer``, and in the last round whatever the router would say (it is not
asked), the answer agent answers from the notes (``<answer>...</answer>``; without the tags, its
whole reply) and the episode ends with the answer's score R. `round_episodes` rewards the turns
(module doc of `marljax.workflows.dr_mas`), which `dr_mas` credits.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from marljax.envs.tool_env import ANSWER_FORMAT, extract_tagged_answer
from marljax.rewards import Problem
from marljax.seeds import derive_seed
from marljax.workflows.base import Agent
from marljax.workflows.episodes import Episodes
from marljax.workflows.turns import AgentEpisode, TaskTools, episode_generations, process_reward, run_turns
from marljax.workflows.types import Generation, Prompt

ROUTER_TASK = "Reply 'search' to gather more information, or 'answer' when the notes suffice."


def route_mentions(text: str, names: Sequence[str]) -> list[str]:
    """The mentions of `names` in `text` (whole words, any case), in the order they occur."""
    hits = [
        (m.start(), name)
        for name in names
        for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.I)
    ]
    return [name for _, name in sorted(hits)]


def router_choice(text: str, have_notes: bool) -> str:
    """The router's last word of 'search' or 'answer'; without one, answer once there are notes."""
    found = route_mentions(text, ("search", "answer"))
    if found:
        return found[-1]
    return "answer" if have_notes else "search"


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


def play_rounds(
    cfg: Any,
    task: TaskTools,
    problems: Sequence[Problem],
    agents: Mapping[str, Agent],
    generator,
    seed: int,
    G: int,
) -> list[Episode]:
    """`G` episodes per problem, all in lockstep: per round one router call, one search call and one
    answer call (`cfg`: a `dr_mas` config with `tools`)."""
    c = cfg
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
            gens = run_turns(generator, [(router, e.router_prompt) for e in active], derive_seed(seed, 3 * r))
            for e, (g,) in zip(active, gens):
                e.router_turns.append(g)
                searching = e.search is None or not e.search.done
                routes[id(e)] = router_choice(g.text, bool(e.notes)) if searching else "answer"
        to_search = [e for e in active if routes.get(id(e)) == "search"]
        for e in to_search:
            if e.search is None:
                p = problems[e.problem]
                e.search = AgentEpisode.start(searcher, task.env("dr_mas", [searcher.name], p), p)
        if to_search:
            gens = run_turns(
                generator, [(searcher, e.search.prompt) for e in to_search], derive_seed(seed, 3 * r + 1)
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
            gens = run_turns(
                generator, [(answerer, answerer.render(t)) for t in texts], derive_seed(seed, 3 * r + 2)
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


# the agent ids of `round_episodes`' rows: 0 router, 1 searcher, 2 answerer
SEARCH_AGENTS = 3


def round_episodes(
    problems: Sequence[Problem],
    played: Sequence[Episode],
    scores: Sequence[float],
    process_weight: float,
    multi_turn: str,
) -> Episodes:
    """The rows of played episodes (agent 0 router, 1 searcher, 2 answerer): each agent's turns get
    the answer's score, the searcher's plus `process_weight` times its tool-process reward."""
    episodes = Episodes(len(problems))
    fallbacks = 0
    for n, (e, R) in enumerate(zip(played, scores)):
        search_bonus = process_weight * process_reward(e.search.steps) if e.search else 0.0
        parts = [(0, e.router_turns, R), (1, e.search.turns if e.search else [], R + search_bonus)]
        parts.append((2, [e.answer_turn], R))
        node = 0
        for k, turns, reward in parts:
            samples, fell_back = episode_generations(turns, multi_turn)
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
            "dr_mas/search_turns": float(np.mean([len(e.search.turns) if e.search else 0 for e in played])),
            "tools/calls_per_episode": calls / len(played),
            "tools/valid_call_frac": sum(s.info.get("valid_calls", 0) for s in steps) / max(calls, 1),
            "multiturn/fallbacks": float(fallbacks),
        }
    )
    return episodes
