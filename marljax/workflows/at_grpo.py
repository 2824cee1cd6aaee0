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

The tree's environment holds the task: ``code`` is the coder + tester of
:mod:`marljax.envs.code` (rewards there), ``plan`` the grid game of
:mod:`marljax.envs.grid` with one planner, and with ``tools:`` a tool agent and
the planner (:mod:`marljax.workflows.tool_tree`), who act one after the other
within a turn, each stage's candidates continuing the previous stage's best.
A tree ends early once its best branch solves the problem (``stop_when_solved``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.envs import TurnResult
from marljax.envs.code import CodeEnv
from marljax.envs.grid import PlanEnv
from marljax.envs.tool_calls import parse_tool_calls
from marljax.rewards import Problem, Verifier
from marljax.seeds import derive_seed
from marljax.workflows.base import (
    Agent,
    BaseWorkflowConfig,
    Generator,
    Workflow,
    register_alias,
    register_workflow,
)
from marljax.workflows.episodes import Episodes
from marljax.workflows.tool_tree import ToolTree
from marljax.workflows.turns import ToolsConfig, run_turns
from marljax.workflows.types import Generation


class AtGrpoConfig(BaseWorkflowConfig):
    """AT-GRPO: tree sampling over turns, groups keyed by (problem, turn, agent)."""

    kind: Literal["at_grpo"] = "at_grpo"
    task: Literal["code", "plan"] = "code"
    coder: str = Field("coder", description="agent writing code (task code)")
    tester: str | None = Field(
        "tester", description="agent writing assert tests (task code); None: coder alone"
    )
    planner: str | None = Field(
        "planner", description="agent planning moves (task plan; with tools: committing moves or the answer)"
    )
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
    tool_agent: str = Field("tool_agent", description="with tools: agent calling the tools")
    tools: ToolsConfig | None = Field(
        None, description="a tool agent before the planner each turn (tools.task plan or math); None: task"
    )

    @model_validator(mode="after")
    def _tools(self):
        if self.tools is None:
            return self
        if self.tool_agent == self.planner:
            raise ValueError("tool_agent and planner must be different agents")
        if self.tools.task not in ("plan", "math"):
            raise ValueError(f"at_grpo with tools runs tools.task plan or math, got {self.tools.task!r}")
        if self.tools.multi_turn != "per_turn":
            raise ValueError("at_grpo trains each candidate as one sample: set tools.multi_turn: per_turn")
        return self

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
            (("tool_agent", self.tool_agent), ("planner", self.planner))
            if self.tools is not None
            else (("coder", self.coder), ("tester", self.tester))
            if self.task == "code"
            else (("planner", self.planner),)
        )
        found = []
        for key, name in roles:
            if name is None and key != "tester":
                found.append(((key,), f"task {self.task!r} needs workflow.{key}", None))
            elif name is not None and name not in agents:
                found.append(((key,), f"unknown agent; known: {', '.join(agents)}", name))
        if self.tools is None and self.task == "code" and self.tester == self.coder:
            found.append((("tester",), "coder and tester must be different agents", self.tester))
        return found


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One sampled candidate of the tree: `node = (turn * A + agent) * K + k` within its problem's tree,
    `parent` the node of the same agent's branch chosen at the previous turn (-1 at turn 0), or in a
    tree of stages (`chained`) the best candidate of the previous stage; `depth` its stage's index."""

    problem: int
    turn: int
    depth: int
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
    def env(self) -> CodeEnv | PlanEnv | ToolTree:
        """The tree's environment: `roles`, `start`, `prompt` and a batched `step` that scores K
        candidates per role and continues each problem's best branch (`marljax.envs.TurnResult`);
        optionally `stages` (the roles acting together, in order, each turn; default all at once) and
        `chained` (a stage's candidates continue the previous stage's best, not their role's own)."""
        c = self.cfg
        if c.tools is not None:
            return ToolTree(c.tool_agent, c.planner, c.tools)
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
        """Tree sampling with `n` candidates per agent per turn: every candidate, and each problem's
        last stage. A turn is the env's `stages` (default: all roles at once), one generate call each."""
        env, roles, A = self.env, self.env.roles, len(self.env.roles)
        stages = getattr(env, "stages", (roles,))
        states = [env.start(p) for p in problems]
        last: list[TurnResult | None] = [None] * len(problems)
        chosen: dict[tuple[int, int], int] = {}  # (problem, agent) -> node of the branch that continues
        latest: dict[int, int] = {}  # problem -> the best node of its latest stage (chained stages)
        candidates = []
        for t in range(self.cfg.num_turns):
            active = [
                i
                for i, r in enumerate(last)
                if not (self.cfg.stop_when_solved and r is not None and r.solved)
            ]
            if not active:
                break
            for s, stage in enumerate(stages):
                depth, R = t * len(stages) + s, len(stage)
                requests = [
                    (agents[r], env.prompt(agents[r], problems[i], states[i], r, t))
                    for i in active
                    for r in stage
                ]
                gens = run_turns(generator, requests, derive_seed(seed, depth), n)  # one batch per policy
                texts = [
                    {r: [g.text for g in gens[j * R + q]] for q, r in enumerate(stage)}
                    for j in range(len(active))
                ]
                results = env.step(
                    [problems[i] for i in active], [states[i] for i in active], texts, verifier
                )
                for j, (i, res) in enumerate(zip(active, results)):
                    parent = latest.get(i, -1)
                    for q, r in enumerate(stage):
                        a = roles.index(r)
                        if not getattr(env, "chained", False):
                            parent = chosen.get((i, a), -1)
                        candidates += [
                            Candidate(
                                i,
                                t,
                                depth,
                                a,
                                (t * A + a) * n + k,
                                parent,
                                gens[j * R + q][k],
                                res.rewards[r][k],
                                res.passed[r][k],
                            )
                            for k in range(n)
                        ]
                        chosen[(i, a)] = latest[i] = (t * A + a) * n + res.best[r]
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
                depth=c.depth,
                turn=c.turn,
                reward=c.reward,
                passed=c.passed,
                agent=c.agent,
            )
        episodes.extras.update(self._extras(candidates, last, len(problems)))
        return episodes

    def _extras(self, candidates: list[Candidate], last: list[TurnResult], P: int) -> dict[str, float]:
        turns = float(np.mean([1 + max(c.turn for c in candidates if c.problem == i) for i in range(P)]))
        if self.cfg.tools is not None:
            tool = [c for c in candidates if c.agent == 0]
            return {
                "team/reward": float(np.mean([r.state.last_reward for r in last])),
                "team/pass_rate": float(np.mean([r.solved for r in last])),
                "at_grpo/turns": turns,
                "tools/call_frac": float(
                    np.mean([bool(parse_tool_calls(c.generation.text).attempted) for c in tool])
                ),
                "tools/process_reward": float(np.mean([c.reward for c in tool])),
            }
        group_best: dict[tuple[int, int, int], float] = {}  # best reward of each (problem, turn, agent)
        for c in candidates:
            key = (c.problem, c.turn, c.agent)
            group_best[key] = max(group_best.get(key, -np.inf), c.reward)
        extras = {
            f"agent/{name}/best_reward": float(np.mean([v for key, v in group_best.items() if key[2] == a]))
            for a, name in enumerate(self.env.roles)
        }
        extras["at_grpo/turns"] = turns
        extras["at_grpo/solved"] = float(np.mean([r.solved for r in last]))
        return extras

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
        if self.cfg.tools is not None:
            return {
                "eval/team/pass_at_1": float(np.mean([r.solved for r in last])),
                "eval/team/reward": float(np.mean([r.state.last_reward for r in last])),
            }
        main = self.env.roles[0]
        name = "success" if self.cfg.task == "plan" else "pass_at_1"
        return {
            f"eval/{main}/{name}": float(np.mean([r.solved for r in last])),
            f"eval/{main}/reward": float(np.mean([r.rewards[main][r.best[main]] for r in last])),
        }


def _from_at_grpo_tools(v: dict) -> dict:
    """`kind: at_grpo_tools` (AT-GRPO with tools before it was an option) as `kind: at_grpo`."""
    v = dict(v, kind="at_grpo")
    v["planner"] = v.pop("plan_agent", "plan_agent")
    v.setdefault("tools", {"task": "plan", "multi_turn": "per_turn"})
    return v


register_alias("at_grpo_tools", _from_at_grpo_tools)
