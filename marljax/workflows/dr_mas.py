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

Rewards: the episode reward R is the fraction of all tests (public and
private) passed by the final program (math: the answer is right). Every solver
and router turn gets R; a verifier turn gets 1 when its verdict was right
(ACCEPT iff the program it reviewed passes all tests), else 0.

Advantages (Dr. MAS): agent-wise, ``A_i = (r_i - mu_{p,k}) / (sigma_{p,k} + eps)``
over the turns of agent k in the G episodes of problem p
(`marljax.kernels.dr_mas_advantages` with problem groups). ``normalization:
global`` normalises all agents' turns of a problem together (what
`marljax.kernels.global_advantages` does on each problem's group): the GRPO
baseline whose gradient amplification `(sigma_k^2 + (mu_k - mu)^2) / sigma^2`
Dr. MAS removes; that factor is reported either way.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal, Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from pydantic import Field, model_validator

from marljax import kernels as K
from marljax.rewards import Status, error_feedback, extract_code
from marljax.workflows.base import Agent, Generation, Generator, Rollout, WorkflowSettings
from marljax.workflows.diversity import grouped_diversity
from marljax.workflows.scoring import Score, score_texts

ROLES = ("solver", "verifier", "router")
_VERDICT = re.compile(r"\b(ACCEPT|REVISE)\b", re.I)


def parse_verdict(text: str) -> tuple[bool, str]:
    """(accepted, comments): ACCEPT iff the first verdict word is ACCEPT; comments follow the verdict."""
    m = _VERDICT.search(text)
    if m is None:
        return False, text.strip()
    return m.group(1).upper() == "ACCEPT", text[m.end():].strip(" \t\n:.-")


def parse_route(text: str, names: Sequence[str]) -> str | None:
    """The first of `names` mentioned in `text` (whole word, any case), or None."""
    hits = [(m.start(), name) for name in names
            if (m := re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.I)) is not None]
    return min(hits)[1] if hits else None


def public_feedback(score: Score) -> str:
    """What the sandbox may tell the team: public tests only (private tests are the held-out reward)."""
    res = score.result
    if res is None:  # math: no tests
        return ""
    if res.status in (Status.NO_CODE, Status.SYNTAX_ERROR):
        return error_feedback(res)
    public = [t for t in res.tests if t.split == "public"]
    if not public:
        return "No public tests."
    if all(t.passed for t in public):
        return f"All {len(public)} public tests passed."
    return error_feedback(res)


def _fence(code: str, schema: str) -> str:
    return code if schema == "math" else f"```python\n{code}\n```"


@dataclasses.dataclass
class Episode:
    problem: Any
    group: int  # problem index in the batch
    turns: list[tuple[str, Generation, float]] = dataclasses.field(default_factory=list)  # role, gen, reward
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


class DrMasConfig(WorkflowSettings):
    """Dr. MAS: solver / verifier (/ router) episodes with agent-wise advantage normalisation."""

    kind: Literal["dr_mas"] = "dr_mas"
    solver: str = Field("solver", description="agent that writes and revises the program")
    verifier: str = Field("verifier", description="agent that answers ACCEPT or REVISE with comments")
    router: str | None = Field(None, description="agent that names the next agent; None: fixed order")
    max_loops: int = Field(2, ge=1, description="turns each of solver and verifier may take per episode")
    group_size: int = Field(4, ge=2, description="episodes per problem")
    normalization: Literal["agent", "global"] = "agent"

    @model_validator(mode="after")
    def _distinct(self):
        names = [n for n in (self.solver, self.verifier, self.router) if n is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"solver, verifier and router must be different agents, got {names}")
        return self

    def check_agents(self, agents: Mapping[str, Any]):
        return [((role,), f"unknown agent; known: {', '.join(agents)}", name)
                for role in ROLES if (name := getattr(self, role)) is not None and name not in agents]


class DrMasWorkflow:
    def __init__(self, solver: str = "solver", verifier: str = "verifier", router: str | None = None,
                 max_loops: int = 2, group_size: int = 4, normalization: str = "agent"):
        DrMasConfig(solver=solver, verifier=verifier, router=router, max_loops=max_loops, group_size=group_size,
                    normalization=normalization)  # same checks as the config
        self.names = {"solver": solver, "verifier": verifier, "router": router}
        self.max_loops, self.group_size, self.normalization = max_loops, group_size, normalization

    @classmethod
    def from_config(cls, cfg: Any) -> "DrMasWorkflow":
        return cls(cfg.solver, cfg.verifier, cfg.router, cfg.max_loops, cfg.group_size, cfg.normalization)

    @property
    def roles(self) -> list[str]:
        return [r for r in ROLES if self.names[r] is not None]

    # ------------------------------------------------------------- prompts
    def _prompt(self, role: str, ep: Episode, agent: Agent) -> str:
        p, code = ep.problem, _fence(ep.code, ep.problem.schema)
        if role == "solver" and not ep.used["solver"]:
            return agent.render_in_context(p.prompt)
        if role == "solver":
            return agent.render_in_context(p.prompt, history=f"Your previous solution:\n{code}",
                          feedback=f"Reviewer comments:\n{ep.comments or '(none)'}\n\n"
                                   "Revise your solution and reply with it in full.")
        tests = f"Public test results:\n{ep.feedback}\n\n" if ep.feedback else ""
        if role == "verifier":
            return agent.render_in_context(p.prompt, history=f"Candidate solution:\n{code}",
                          feedback=tests + "Reply ACCEPT if the solution is correct, otherwise REVISE "
                                           "followed by comments for its author.")
        review = f"\n\nLatest review: {ep.verdict} {ep.comments}".rstrip() if ep.verdict else ""
        s, v = self.names["solver"], self.names["verifier"]
        return agent.render_in_context(p.prompt, history=f"Latest solution:\n{code}\n\n{tests}{review}".strip(),
                      feedback=f"Who acts next? Reply with one name: {s} (writes or revises the solution) "
                               f"or {v} (reviews it).")

    # --------------------------------------------------------------- turns
    def _solved(self, eps: list[Episode], gens: list[Generation], pool: Any) -> None:
        scores = score_texts([e.problem for e in eps], [g.text for g in gens], pool)
        for e, g, s in zip(eps, gens, scores):
            e.turns.append(("solver", g, 0.0))  # reward set when the episode ends
            e.code = g.text.strip() if e.problem.schema == "math" else extract_code(g.text).code
            e.score, e.feedback, e.used["solver"] = s, public_feedback(s), e.used["solver"] + 1
            e.next_role = "verifier"

    def _reviewed(self, e: Episode, g: Generation) -> None:
        e.accepted, e.comments = parse_verdict(g.text)
        e.verdict = "ACCEPT" if e.accepted else "REVISE"
        e.turns.append(("verifier", g, float(e.accepted == e.score.passed)))
        e.used["verifier"] += 1
        e.next_role = "solver"

    def _left(self, e: Episode) -> list[str]:
        return [r for r in ("solver", "verifier") if e.used[r] < self.max_loops]

    def _episodes(self, problems, agents: dict[str, Agent], generator: Generator, pool: Any, seed: int,
                  G: int) -> list[Episode]:
        agent = {r: agents[self.names[r]] for r in self.roles}
        eps = [Episode(p, i) for i, p in enumerate(problems) for _ in range(G)]
        gens = generator.generate([(agent["solver"], self._prompt("solver", eps[i * G], agent["solver"]))
                                   for i in range(len(problems))], G, seed)
        self._solved(eps, [g for group in gens for g in group], pool)
        stage = 0
        while True:
            for e in eps:
                left = self._left(e)
                e.done = e.done or e.accepted or not left
                if not e.done and e.next_role not in left:
                    e.next_role = left[0]  # the named (or default) agent has no turns left
            active = [e for e in eps if not e.done]
            if not active:
                return eps
            ask = [e for e in active if len(self._left(e)) == 2] if "router" in agent else []
            if ask:  # one router call for every episode that has a choice
                stage += 1
                gens = generator.generate([(agent["router"], self._prompt("router", e, agent["router"]))
                                           for e in ask], 1, seed + 7919 * stage)
                for e, (g,) in zip(ask, gens):
                    named = parse_route(g.text, [self.names["solver"], self.names["verifier"]])
                    e.turns.append(("router", g, 0.0))
                    if named is not None:
                        e.routed += 1
                        e.next_role = "solver" if named == self.names["solver"] else "verifier"
            stage += 1
            gens = generator.generate([(agent[e.next_role], self._prompt(e.next_role, e, agent[e.next_role]))
                                       for e in active], 1, seed + 7919 * stage)
            solved = [(e, g) for e, (g,) in zip(active, gens) if e.next_role == "solver"]
            for e, (g,) in zip(active, gens):
                if e.next_role == "verifier":
                    self._reviewed(e, g)
            if solved:
                self._solved([e for e, _ in solved], [g for _, g in solved], pool)

    # ----------------------------------------------------------- interface
    def rollout(self, problems: Sequence[Any], agents: dict[str, Agent], generator: Generator,
                pool: Any, seed: int) -> Rollout:
        G, P, roles = self.group_size, len(problems), self.roles
        eps = self._episodes(problems, agents, generator, pool, seed, G)
        flat = []  # (episode index, turn index, role, generation, reward)
        for n, e in enumerate(eps):
            R = e.score.reward  # the final program's
            flat += [(n, t, role, g, R if role != "verifier" else r) for t, (role, g, r) in enumerate(e.turns)]
        # padded to a power of two (masked out) so the jitted kernels compile for few sizes
        N = len(flat)
        size = 1 << max(N - 1, 0).bit_length()
        rewards = np.zeros(size, np.float32)
        agent_ids, group_ids = np.zeros(size, np.int32), np.zeros(size, np.int32)
        rewards[:N] = [f[4] for f in flat]
        agent_ids[:N] = [roles.index(f[2]) for f in flat]
        group_ids[:N] = [eps[f[0]].group for f in flat]
        mask = jnp.arange(size) < N
        adv, stats = K.dr_mas_advantages(jnp.asarray(rewards), jnp.asarray(agent_ids), len(roles), mask,
                                         group_ids=jnp.asarray(group_ids), num_groups=P)
        if self.normalization == "global":  # all agents of a problem together (GRPO's group baseline)
            adv = K.group_advantages(jnp.asarray(rewards), jnp.asarray(group_ids), P, mask)
        adv, rewards, agent_ids = np.asarray(adv)[:N], rewards[:N], agent_ids[:N]
        samples = []
        for k, (n, t, role, g, r) in enumerate(flat):
            a = agents[self.names[role]]
            samples.append(g.sample(a, float(r), float(adv[k]), generator.versions.get(a.policy, 0),
                                    problem=eps[n].problem.id, episode=n, node=t, parent=t - 1, depth=t, turn=t))
        return Rollout(samples, self._metrics(eps, rewards, adv, agent_ids, stats))

    def _metrics(self, eps, rewards, adv, agent_ids, stats) -> dict[str, float]:
        out = {"team/reward": float(np.mean([e.score.reward for e in eps])),
               "team/pass_rate": float(np.mean([e.score.passed for e in eps])),
               "team/accept_rate": float(np.mean([e.accepted for e in eps])),
               "team/loops": float(np.mean([e.used["solver"] for e in eps])),
               "team/turns": float(np.mean([len(e.turns) for e in eps]))}
        for k, role in enumerate(self.roles):
            pre, sel = f"agent/{self.names[role]}", agent_ids == k
            out.update({f"{pre}/reward": float(rewards[sel].mean()) if sel.any() else 0.0,
                        f"{pre}/adv_mean": float(adv[sel].mean()) if sel.any() else 0.0,
                        f"{pre}/adv_std": float(adv[sel].std()) if sel.any() else 0.0,
                        f"{pre}/turns": float(sel.sum()) / len(eps),
                        f"{pre}/amplification": float(stats["amplification"][k]),
                        f"{pre}/reward_std": float(stats["agent_std"][k])})
        if self.names["router"] is not None:
            asked = sum(r == "router" for e in eps for r, _, _ in e.turns)
            out[f"agent/{self.names['router']}/parse_rate"] = sum(e.routed for e in eps) / max(asked, 1)
        groups: dict[int, list[str]] = {}
        for e in eps:
            groups.setdefault(e.group, []).append(e.code)
        out.update(grouped_diversity(list(groups.values()), "team"))
        return out

    def evaluate(self, problems: Sequence[Any], agents: dict[str, Agent], generator: Generator,
                 pool: Any) -> dict[str, float]:
        """One (greedy, with a greedy generator) episode per held-out problem: the team's pass@1."""
        eps = self._episodes(problems, agents, generator, pool, 0, 1)
        verdicts = [r for e in eps for role, _, r in e.turns if role == "verifier"]
        return {"eval/team/pass_at_1": float(np.mean([e.score.passed for e in eps])),
                "eval/team/reward": float(np.mean([e.score.reward for e in eps])),
                "eval/team/loops": float(np.mean([e.used["solver"] for e in eps])),
                f"eval/{self.names['verifier']}/accuracy": float(np.mean(verdicts)) if verdicts else 0.0}
