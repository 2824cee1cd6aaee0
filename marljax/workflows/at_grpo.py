"""AT-GRPO (Zhao et al. 2025, arXiv 2510.11062): agent- and turn-wise grouped GRPO with tree sampling.

Each problem is played for ``num_turns`` turns. At turn ``t`` every acting
agent samples K candidates from copies of the same state; each candidate is
scored, and the best branch of each agent (highest reward, ties to the lowest
index) continues: the next state is built from the agents' best candidates.
Credit: ``A = (r - mean_g) / (std_g + eps)`` (``grpo``) or ``r - mean_g``
(``dr_grpo``) with group ``g = (problem, turn, agent)``
(:func:`marljax.kernels.at_grpo_advantages`), so a candidate is compared only
with the other K candidates of the same agent at the same turn of the same
problem. ``grouping`` swaps the key for the ablations of docs/fidelity.md:
``pooled`` (several problems per group, as PettingLLMs' code) or ``problem``
(one group per problem). Agents act with ``agent.policy``: one shared policy with role
prompts or one policy per role, with no difference here.

The environment (`marljax.envs.Env`) holds the task: ``code`` is the coder +
tester of :mod:`marljax.envs.code` (rewards there), ``plan`` the grid game of
:mod:`marljax.envs.grid` with one planner. A tree ends early once its best
branch solves the problem (``stop_when_solved``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.envs import Env, TurnResult
from marljax.envs.code import CodeEnv
from marljax.envs.grid import PlanEnv
from marljax.rewards import Problem, Verifier
from marljax.seeds import derive_seed
from marljax.workflows.base import Agent, BaseWorkflowConfig, Generator, Workflow, register_workflow
from marljax.workflows.episodes import Episodes
from marljax.workflows.types import Generation


class AtGrpoConfig(BaseWorkflowConfig):
    """AT-GRPO: tree sampling over turns, groups keyed by (problem, turn, agent)."""

    kind: Literal["at_grpo"] = "at_grpo"
    task: Literal["code", "plan"] = "code"
    coder: str = Field("coder", description="agent writing code (task code)")
    tester: str | None = Field(
        "tester", description="agent writing assert tests (task code); None: coder alone"
    )
    planner: str | None = Field("planner", description="agent planning moves (task plan)")
    num_candidates: int = Field(4, ge=2, description="K: candidates per agent per turn")
    num_turns: int = Field(2, ge=1)
    estimator: Literal["grpo", "dr_grpo"] = "grpo"
    tester_bonus: float = Field(0.5, ge=0, description="extra reward per valid assert the current code fails")
    max_asserts: int = Field(8, ge=1, description="asserts of a tester answer that are run")
    stop_when_solved: bool = Field(True, description="end a tree once its best branch solves the problem")
    grouping: Literal["problem_turn_agent", "pooled", "problem"] = Field(
        "problem_turn_agent",
        description="advantage groups: (problem, turn, agent) as the paper; 'pooled': (problem // "
        "pool_size, turn, agent), several problems per group as PettingLLMs' code; 'problem': one group "
        "per problem, all turns and agents together",
    )
    pool_size: int | None = Field(
        None, ge=2, description="problems per group with grouping 'pooled' (batch order); required there"
    )

    @model_validator(mode="after")
    def _pool(self):
        if (self.grouping == "pooled") != (self.pool_size is not None):
            raise ValueError(
                f"pool_size is required with grouping 'pooled' and only there "
                f"(grouping {self.grouping!r}, pool_size {self.pool_size})"
            )
        return self

    def check_agents(self, agents: Mapping[str, Any]):
        roles = (
            (("coder", self.coder), ("tester", self.tester))
            if self.task == "code"
            else (("planner", self.planner),)
        )
        found = []
        for key, name in roles:
            if name is None and key != "tester":
                found.append(((key,), f"task {self.task!r} needs workflow.{key}", None))
            elif name is not None and name not in agents:
                found.append(((key,), f"unknown agent; known: {', '.join(agents)}", name))
        if self.task == "code" and self.tester == self.coder:
            found.append((("tester",), "coder and tester must be different agents", self.tester))
        return found


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One sampled candidate of the tree: `node = (turn * A + agent) * K + k` within its problem's tree,
    `parent` the node of the same agent's branch chosen at the previous turn (-1 at turn 0)."""

    problem: int
    turn: int
    agent: int  # index into the env's roles
    node: int
    parent: int
    generation: Generation
    reward: float
    passed: bool


def turnwise_advantages(
    episodes: Episodes,
    num_turns: int,
    num_agents: int,
    estimator: str,
    grouping: str = "problem_turn_agent",
    pool_size: int | None = None,
):
    """AT-GRPO's credit: GRPO (or Dr. GRPO: `estimator`) within each (episode, turn, agent) group of
    the rows (columns `episode`, `turn`, `agent`), or the groups `grouping` names instead."""
    return kernels.at_grpo_advantages(
        episodes.array("reward"),
        episodes.array("episode"),
        episodes.array("turn"),
        episodes.array("agent"),
        num_problems=episodes.num_problems,
        num_turns=num_turns,
        num_agents=num_agents,
        scale="std" if estimator == "grpo" else "none",
        key=grouping,
        pool_size=pool_size or 1,
    )


@register_workflow("at_grpo")
class AtGrpoWorkflow(Workflow[AtGrpoConfig]):
    @functools.cached_property
    def env(self) -> Env:
        c = self.cfg
        return (
            PlanEnv(c.planner)
            if c.task == "plan"
            else CodeEnv(c.coder, c.tester, c.tester_bonus, c.max_asserts)
        )

    def sample_tree(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
        n: int,
    ) -> tuple[list[Candidate], list[TurnResult | None]]:
        """Tree sampling with `n` candidates per agent per turn: every candidate, and each problem's last turn."""
        roles, A = self.env.roles, len(self.env.roles)
        states = [self.env.start(p) for p in problems]
        last: list[TurnResult | None] = [None] * len(problems)
        chosen: dict[tuple[int, int], int] = {}  # (problem, agent) -> node of the branch that continues
        candidates = []
        for t in range(self.cfg.num_turns):
            active = [
                i
                for i, r in enumerate(last)
                if not (self.cfg.stop_when_solved and r is not None and r.solved)
            ]
            if not active:
                break
            requests = [
                (agents[r], agents[r].render_in_context(*self.env.request(problems[i], states[i], r, t)))
                for i in active
                for r in roles
            ]
            gens = generator.generate(requests, n, derive_seed(seed, t))  # one call: one batch per policy
            texts = [
                {r: [g.text for g in gens[j * A + a]] for a, r in enumerate(roles)}
                for j in range(len(active))
            ]
            results = self.env.step(
                [problems[i] for i in active], [states[i] for i in active], texts, verifier
            )
            for j, (i, res) in enumerate(zip(active, results)):
                for a, r in enumerate(roles):
                    for k in range(n):
                        candidates.append(
                            Candidate(
                                i,
                                t,
                                a,
                                (t * A + a) * n + k,
                                chosen.get((i, a), -1),
                                gens[j * A + a][k],
                                res.rewards[r][k],
                                res.passed[r][k],
                            )
                        )
                    chosen[(i, a)] = (t * A + a) * n + res.best[r]
                states[i], last[i] = res.state, res
        return candidates, last

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        roles = self.env.roles
        candidates, last = self.sample_tree(
            problems, agents, generator, verifier, seed, self.cfg.num_candidates
        )
        episodes = Episodes(len(problems))
        for c in candidates:
            episodes.add(
                c.generation,
                problem=problems[c.problem].id,
                episode=c.problem,
                node=c.node,
                parent=c.parent,
                depth=c.turn,
                turn=c.turn,
                reward=c.reward,
                passed=c.passed,
                agent=c.agent,
            )
        group_best: dict[tuple[int, int, int], float] = {}  # best reward of each (problem, turn, agent)
        for c in candidates:
            key = (c.problem, c.turn, c.agent)
            group_best[key] = max(group_best.get(key, -np.inf), c.reward)
        extras = episodes.extras
        for a, name in enumerate(roles):
            extras[f"agent/{name}/best_reward"] = float(
                np.mean([v for key, v in group_best.items() if key[2] == a])
            )
        extras["at_grpo/turns"] = float(
            np.mean([1 + max(c.turn for c in candidates if c.problem == i) for i in range(len(problems))])
        )
        extras["at_grpo/solved"] = float(np.mean([r.solved for r in last]))
        return episodes

    def credit(self, episodes: Episodes):
        """GRPO within each (problem, turn, agent) group of candidates (`grouping`, `pool_size`)."""
        c = self.cfg
        return turnwise_advantages(
            episodes, c.num_turns, len(self.env.roles), c.estimator, c.grouping, c.pool_size
        )

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) candidate per agent per turn; the final state counts:
        pass@1 of the coder's last code (all tests), or the planner's success (goal reached)."""
        _, last = self.sample_tree(problems, agents, generator, verifier, 0, 1)
        main = self.env.roles[0]
        name = "success" if self.cfg.task == "plan" else "pass_at_1"
        return {
            f"eval/{main}/{name}": float(np.mean([r.solved for r in last])),
            f"eval/{main}/reward": float(np.mean([r.rewards[main][r.best[main]] for r in last])),
        }
