"""MAGRPO (Liu et al. 2025, arXiv 2508.04652): agents act together on a joint-reward tree.

A *node* is a state where every agent samples: the episode's root (turn 0),
or the state after one joint action of the previous turn. At each node each
of the N agents (all at once, from their own prompts) samples G completions;
the joint actions are the G aligned tuples ``(a_1g, ..., a_Ng)``
(``joint="aligned"``) or all G^N combinations (``"cross"``, agent 0 slowest).
Every joint action gets the task's joint reward ``r`` (`marljax.envs.joint`); unless it is at the
last turn or its node stops early it opens a child node whose prompts carry
the joint answer (``{history}``) and its feedback (``{feedback}``). A node
stops early when the mean reward of its joint actions reaches
``early_stop_reward`` (as the reference code, CoMLRL, stops a node): then
all its joint actions are leaves. Siblings therefore always end on the same
turn; a joint action that stopped alone would be credited its reward once
while a worse sibling collects a next turn's return too.

Credit (``marljax.kernels``): returns-to-go ``R = r + gamma * mean(R of the
child node's joint actions)`` (a leaf's return is its reward), then each
agent's completion is credited with the return of its joint action (aligned)
or the sum over the joint actions it took part in (cross) and normalised
among its G siblings, the other completions of the same agent at the same
node: ``A = (C - mean) / (std + eps)`` (sample std; ``scale="none"`` keeps
the mean baseline only, as the paper's reference code does).

Each agent's completion becomes one training row with ids ``node`` (the node it
was sampled at, numbered breadth-first from 0 per episode), ``parent`` (that
node's parent, -1 at the root), ``depth == turn``; ``episode`` is the
problem's index in the batch. Sibling group = (episode, node, agent).

Defaults: ``gamma = 0.9``, the discount of the paper's reference trainer
(CoMLRL).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.envs.joint import TASKS, JointTask
from marljax.rewards import Problem, Verifier, extract_code
from marljax.seeds import derive_seed
from marljax.shapes import power_of_two_bucket
from marljax.workflows.base import (
    Agent,
    BaseWorkflowConfig,
    Generator,
    Workflow,
    register_workflow,
    template_fields,
)
from marljax.workflows.episodes import Episodes
from marljax.workflows.types import Generation


class MagrpoConfig(BaseWorkflowConfig):
    """MAGRPO: joint rollout tree over turns, returns-to-go normalised per node and agent."""

    kind: Literal["magrpo"] = "magrpo"
    agents: list[str] = Field(
        default_factory=lambda: ["helper", "main"],
        min_length=1,
        description="agents in turn order (coop_code: [helper, main])",
    )
    group_size: int = Field(4, ge=2, description="completions per agent per node (G)")
    joint: Literal["aligned", "cross"] = Field(
        "aligned", description="G aligned tuples or the G^N cross product"
    )
    num_turns: int = Field(1, ge=1, description="turns per episode (tree depth)")
    gamma: float = Field(0.9, ge=0, le=1, description="discount over turns (0.9 as in the reference code)")
    early_stop_reward: float | None = Field(
        None, description="a node whose joint actions' mean reward is >= this opens no children"
    )
    task: Literal["coop_code", "score"] = Field(
        "coop_code", description="coop_code: helper+main level reward; score: tests of the last agent's code"
    )
    scale: Literal["std", "none"] = Field("std", description="divide sibling advantages by their std, or not")

    @model_validator(mode="after")
    def _agents_fit_task(self):
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agents repeat: {self.agents}")
        if self.task == "coop_code" and len(self.agents) != 2:
            raise ValueError(f"task coop_code needs exactly two agents [helper, main], got {self.agents}")
        return self

    def check_agents(self, agents: Mapping[str, Any]):
        found = [
            (("agents", k), f"unknown agent; known: {', '.join(agents)}", name)
            for k, name in enumerate(self.agents)
            if name not in agents
        ]
        if self.num_turns > 1:  # later turns differ from the first only through these placeholders
            for name in self.agents:
                template = getattr(agents.get(name), "template", None)
                if template is not None and not {"history", "feedback"} & set(template_fields(template)):
                    why = (
                        f"agent {name!r}'s template uses neither {{history}} nor {{feedback}}: "
                        "later turns would repeat the first prompt"
                    )
                    found.append((("num_turns",), why, self.num_turns))
        return found


@dataclasses.dataclass
class Node:
    """A state where every agent samples; `via` is the joint action (tree index) that led here."""

    episode: int
    id: int
    parent: int
    turn: int
    via: int = -1
    history: str = ""
    feedback: str = ""
    gens: list[list[Generation]] = dataclasses.field(default_factory=list)  # [agent][g]
    joints: list[int] = dataclasses.field(default_factory=list)  # tree indices of its joint actions


@dataclasses.dataclass
class Joint:
    node: Node
    sibling: int  # index among the node's joint actions (kernel's sibling_ids)
    combo: tuple[int, ...]  # each agent's completion index
    reward: float = 0.0
    passed: bool = False


@dataclasses.dataclass
class Tree:
    """All episodes of one batch: nodes in creation order, joint actions in tree order."""

    nodes: list[Node]
    joints: list[Joint]
    episodes: int


@functools.partial(
    jax.jit, static_argnames=("gamma", "max_depth", "num_agents", "group_size", "mode", "scale")
)
def _credit(rewards, parents, siblings, mask, *, gamma, max_depth, num_agents, group_size, mode, scale):
    returns = kernels.tree_returns(rewards, parents, gamma=gamma, max_depth=max_depth, mask=mask)
    adv = kernels.magrpo_advantages(
        returns,
        parents,
        siblings,
        num_agents=num_agents,
        group_size=group_size,
        mode=mode,
        mask=mask,
        scale=scale,
    )
    return returns, adv


@register_workflow("magrpo")
class MagrpoWorkflow(Workflow[MagrpoConfig]):
    @functools.cached_property
    def task(self) -> JointTask:
        return TASKS[self.cfg.task]()

    def stops(self, node: Node, joints: Sequence[Joint]) -> bool:
        """Whether `node` ends its episode's branch: the mean reward of its joint actions reaches
        `early_stop_reward`. The whole node stops, so siblings always end on the same turn and a
        good joint answer is never credited less than a worse sibling that went on to a next turn."""
        if self.cfg.early_stop_reward is None:
            return False
        return float(np.mean([joints[k].reward for k in node.joints])) >= self.cfg.early_stop_reward

    # ----------------------------------------------------------- the tree
    def grow(
        self,
        problems: Sequence[Problem],
        agents: Sequence[Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
        n: int,
    ) -> Tree:
        """Expand all episodes turn by turn: one `generate` call and one scoring batch per turn."""
        N = len(agents)
        combos = (
            list(itertools.product(range(n), repeat=N))
            if self.cfg.joint == "cross"
            else [(g,) * N for g in range(n)]
        )
        frontier = [Node(e, 0, -1, 0) for e in range(len(problems))]
        next_id = [1] * len(problems)
        nodes: list[Node] = []
        joints: list[Joint] = []
        for t in range(self.cfg.num_turns):
            if not frontier:
                break
            requests = [
                (a, a.render(self.task.problem_text(problems[s.episode], k), s.feedback, s.history))
                for s in frontier
                for k, a in enumerate(agents)
            ]
            gens = generator.generate(requests, n, derive_seed(seed, t))
            start = len(joints)
            for i, s in enumerate(frontier):
                s.gens = gens[i * N : (i + 1) * N]
                for sib, combo in enumerate(combos):
                    s.joints.append(len(joints))
                    joints.append(Joint(s, sib, combo))
            new = joints[start:]
            answers = [[j.node.gens[k][c].text for k, c in enumerate(j.combo)] for j in new]
            judged = (
                self.task.judge([problems[j.node.episode] for j in new], answers, verifier) if new else []
            )
            # a joint action's overlong penalty is the mean of its members' (`overlong`)
            penalties = {id(s): [self.length_penalties(row) for row in s.gens] for s in frontier}
            nodes += frontier
            frontier = []
            for j, verdict in zip(new, judged):
                mine = penalties[id(j.node)]
                j.reward = float(verdict.reward) + float(np.mean([mine[k][c] for k, c in enumerate(j.combo)]))
                j.passed = bool(verdict.passed)
            for idx, (j, texts, verdict) in enumerate(zip(new, answers, judged)):
                if t + 1 < self.cfg.num_turns and not self.stops(j.node, joints):
                    e = j.node.episode
                    frontier.append(
                        Node(
                            e,
                            next_id[e],
                            j.node.id,
                            t + 1,
                            start + idx,
                            _history(agents, texts),
                            verdict.feedback,
                        )
                    )
                    next_id[e] += 1
        return Tree(nodes, joints, len(problems))

    def tree_credit(self, tree: Tree, num_agents: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns-to-go `[M]` and advantages `[M, N]` of the tree's joint actions (kernels).

        Each episode gets a masked placeholder parent above its root's joint actions, so that
        the kernels (which key sibling groups by parent) never mix two episodes' roots; the
        arrays are padded (masked) to a power of two so that trees of varying size (early
        stopping) reuse a few compiled shapes.
        """
        E, M = tree.episodes, len(tree.joints)
        size = power_of_two_bucket(E + M, minimum=16)
        rewards = np.zeros(size, np.float32)
        parents = np.full(size, -1, np.int32)
        siblings = np.zeros(size, np.int32)
        mask = np.zeros(size, bool)
        for k, j in enumerate(tree.joints):
            rewards[E + k], siblings[E + k], mask[E + k] = j.reward, j.sibling, True
            parents[E + k] = j.node.episode if j.node.via < 0 else E + j.node.via
        returns, adv = _credit(
            rewards,
            parents,
            siblings,
            mask,
            gamma=self.cfg.gamma,
            max_depth=self.cfg.num_turns,
            num_agents=num_agents,
            group_size=n,
            mode=self.cfg.joint,
            scale=self.cfg.scale,
        )
        return np.asarray(returns)[E : E + M], np.asarray(adv)[E : E + M]

    # ------------------------------------------------------------ the API
    def _agents(self, agents: Mapping[str, Agent]) -> list[Agent]:
        missing = [a for a in self.cfg.agents if a not in agents]
        if missing:
            raise ValueError(f"MAGRPO agents {missing} are not among the run's agents {sorted(agents)}")
        return [agents[a] for a in self.cfg.agents]

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        """Each agent's completion is a row; its reward is the mean of the joint actions using it,
        whose rewards already carry their members' overlong penalty (so the rows come shaped)."""
        team, G = self._agents(agents), self.cfg.group_size
        tree = self.grow(problems, team, generator, verifier, seed, G)
        rewards = np.array([j.reward for j in tree.joints], np.float32)
        passed = np.array([j.passed for j in tree.joints], np.float32)
        episodes = Episodes(len(problems), shaped=True)
        episodes.context.update(tree=tree, agents=len(team))
        for s in tree.nodes:
            for i in range(len(team)):
                for g, gen in enumerate(s.gens[i]):
                    mine = [j for j in s.joints if tree.joints[j].combo[i] == g]  # joint actions using it
                    episodes.add(
                        gen,
                        problem=problems[s.episode].id,
                        episode=s.episode,
                        node=s.id,
                        parent=s.parent,
                        depth=s.turn,
                        turn=s.turn,
                        reward=float(rewards[mine].mean()),
                        passed=float(passed[mine].mean()),
                        joint=mine[0],
                        agent=i,
                    )
        return episodes

    def credit(self, episodes: Episodes):
        """Each completion's advantage is that of (the first) joint action using it, from the tree's
        returns-to-go; also reports the team's rewards and returns."""
        tree, num_agents = episodes.context["tree"], episodes.context["agents"]
        returns, adv = self.tree_credit(tree, num_agents, self.cfg.group_size)
        rewards = np.array([j.reward for j in tree.joints], np.float32)
        passed = np.array([j.passed for j in tree.joints], np.float32)
        turns = np.array([j.node.turn for j in tree.joints])
        extras = episodes.extras
        extras["team/reward"] = float(rewards.mean())
        extras["team/pass_rate"] = float(passed.mean())
        extras["team/return"] = float(returns[turns == 0].mean())
        extras["tree/nodes"] = len(tree.nodes) / tree.episodes
        extras["tree/joint_actions"] = len(tree.joints) / tree.episodes
        if self.cfg.num_turns > 1:
            for t in range(int(turns.max()) + 1):
                extras[f"team/reward_turn{t}"] = float(rewards[turns == t].mean())
            inner = [s for s in tree.nodes if s.turn < self.cfg.num_turns - 1]
            extras["tree/early_stop_rate"] = float(
                np.mean([self.stops(s, tree.joints) for s in inner]) if inner else 0.0
            )
        return np.asarray(adv[episodes["joint"], episodes["agent"]], np.float32)

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) joint answer per problem and turn, for `num_turns`
        turns or until the early-stop reward; the last joint answer counts."""
        team = self._agents(agents)
        tree = self.grow(problems, team, generator, verifier, 0, 1)
        last = {j.node.episode: j for j in tree.joints}  # one joint action per node: a chain per episode
        final = [last[e] for e in range(len(problems))]
        return {
            f"eval/{team[-1].name}/pass_at_1": float(np.mean([j.passed for j in final])),
            "eval/team/reward": float(np.mean([j.reward for j in final])),
            "eval/team/turns": float(np.mean([j.node.turn + 1 for j in final])),
        }


def _history(agents: Sequence[Agent], texts: Sequence[str]) -> str:
    """The previous turn's joint answer, one fenced block per agent."""
    parts = []
    for agent, text in zip(agents, texts):
        code = extract_code(text).code or text.strip()
        parts.append(f"### {agent.name}\n```python\n{code}\n```")
    return "The team's previous answer:\n\n" + "\n\n".join(parts)
