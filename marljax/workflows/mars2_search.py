"""MARS2 multi-agent tree search (arXiv 2602.07848), AB-MCTS style: pure Python + numpy, no model.

A tree has a virtual root (the problem). GEN adds a fresh solution as a child
of the root (depth 0, parent -1); CONT refines an already scored, unsolved
node ``n`` (its program and feedback become the prompt) into a child at depth
``d_n + 1``. A team of agents shares the tree; each node is one agent's
program with reward ``r`` in [0, 1] (fraction of tests passed).

Posteriors. Every agent ``k`` has two Beta posteriors per tree, one over the
rewards of the fresh solutions it wrote (``GEN_k``) and one over the rewards
of its refinements (``CONT_k``); both start at the prior ``(a0_k, b0_k)`` and
take ``a += r, b += 1 - r`` for each scored node of that kind (AB-MCTS keeps
GEN and CONT apart the same way). Priors: ``uniform`` = Beta(0.5, 0.5);
``reward_average`` = Beta(s * m_k, s * (1 - m_k)) with ``m_k`` the agent's
running average reward over past steps (0.5 before any) and ``s`` the prior
strength (each parameter at least 1e-3).

Depth guidance. A node created at depth ``d`` gets weight
``w(d) = gamma(d) ** c_d``, ``c_d`` = nodes already at depth ``d`` (pending
ones included, so the expansions of one round spread out). Default
``gamma(d) = max(0.5, 0.98 - 0.05 * d)`` (0.98, 0.93, 0.88, ...); a list
``[g0, g1, ...]`` means ``gamma(d) = g[min(d, len - 1)]``.

Decision rule of one expansion (``Tree.choose``), with one seeded numpy RNG
and draws in this order:

1. Node to refine: for every refinable node ``n`` (scored, not solved) in
   index order draw ``s_n ~ Beta(0.5 + r_n, 0.5 + 1 - r_n)``;
   ``n* = argmax_n s_n * w(d_n + 1)`` (ties: the earliest node).
2. Action and agent: for every agent ``k`` in team order draw
   ``g_k ~ GEN_k`` then (only if ``n*`` exists) ``c_k ~ CONT_k``. Scores:
   GEN_k ``g_k * w(0)``, CONT_k ``c_k * w(d_{n*} + 1)``. The highest of the
   scores wins; ties go to the first in the order GEN_0..GEN_{K-1},
   CONT_0..CONT_{K-1}.

A tree is done at ``max_nodes`` nodes or, with ``stop_on_solve``, once a node
is solved (reward 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

GEN, CONT = "gen", "cont"
UNIFORM_PRIOR = (0.5, 0.5)


def depth_gamma(spec: Any = None) -> Callable[[int], float]:
    """gamma(d) from a spec: None (the default rule), a list of per-depth values (the last one
    repeats), a mapping / object with ``start, step, floor`` (``max(floor, start - step * d)``),
    or a callable."""
    if spec is None:
        spec = {"start": 0.98, "step": 0.05, "floor": 0.5}
    if callable(spec):
        return spec
    if isinstance(spec, Mapping) or hasattr(spec, "start"):
        start, step, floor = (
            float(spec[k] if isinstance(spec, Mapping) else getattr(spec, k))
            for k in ("start", "step", "floor")
        )
        return lambda d: max(floor, start - step * d)
    values = [float(g) for g in spec]
    if not values or not all(0 < g <= 1 for g in values):
        raise ValueError(f"depth_gamma values must lie in (0, 1], got {values}")
    return lambda d: values[min(d, len(values) - 1)]


@dataclasses.dataclass
class Beta:
    """Beta(a, b) posterior over Bernoulli-like rewards in [0, 1]."""

    a: float
    b: float

    def update(self, reward: float) -> None:
        self.a += reward
        self.b += 1.0 - reward

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.beta(self.a, self.b))


@dataclasses.dataclass
class Node:
    """One agent's program in a tree; ``reward`` is None while the node is pending."""

    index: int
    agent: str
    kind: str  # GEN | CONT
    parent: int  # -1 for a fresh solution (a child of the virtual root)
    depth: int
    reward: float | None = None
    solved: bool = False
    data: dict[str, Any] = dataclasses.field(default_factory=dict)  # the workflow's payload


class Tree:
    """The search state of one problem: nodes, per-agent GEN/CONT posteriors, depth counts."""

    def __init__(
        self,
        agents: Sequence[str],
        max_nodes: int,
        priors: Mapping[str, tuple[float, float]] | None = None,
        gamma: Callable[[int], float] | None = None,
        stop_on_solve: bool = True,
    ):
        if max_nodes < 2:
            raise ValueError(f"max_nodes must be >= 2, got {max_nodes}")
        if not agents:
            raise ValueError("a tree needs at least one agent")
        self.agents, self.max_nodes, self.stop_on_solve = list(agents), max_nodes, stop_on_solve
        self.gamma = gamma or depth_gamma()
        priors = priors or {}
        self.posteriors = {
            kind: {k: Beta(*priors.get(k, UNIFORM_PRIOR)) for k in self.agents} for kind in (GEN, CONT)
        }
        self.nodes: list[Node] = []

    def count_at(self, depth: int) -> int:
        return sum(n.depth == depth for n in self.nodes)

    def weight(self, depth: int) -> float:
        """Depth guidance ``gamma(d) ** c_d`` for a node created at ``depth``."""
        return float(self.gamma(depth)) ** self.count_at(depth)

    @property
    def solved(self) -> bool:
        return any(n.solved for n in self.nodes)

    @property
    def done(self) -> bool:
        return len(self.nodes) >= self.max_nodes or (self.stop_on_solve and self.solved)

    def refinable(self) -> list[Node]:
        return [n for n in self.nodes if n.reward is not None and not n.solved]

    def choose(self, rng: np.random.Generator) -> tuple[str, str, int]:
        """``(kind, agent, parent)`` of the next expansion by the rule in the module docstring."""
        target = None
        cands = self.refinable()
        if cands:
            scores = [
                Beta(0.5 + n.reward, 1.5 - n.reward).draw(rng) * self.weight(n.depth + 1) for n in cands
            ]
            target = cands[int(np.argmax(scores))]  # argmax: first of equal maxima
        arms, scores = [], []
        for k in self.agents:
            arms.append((GEN, k, -1))
            scores.append(self.posteriors[GEN][k].draw(rng) * self.weight(0))
            if target is not None:
                arms.append((CONT, k, target.index))
                scores.append(self.posteriors[CONT][k].draw(rng) * self.weight(target.depth + 1))
        # Tie order GEN_0..GEN_{K-1}, CONT_0..: stable sort by score, GEN arms listed first.
        order = sorted(range(len(arms)), key=lambda i: (-scores[i], arms[i][0] != GEN, i))
        return arms[order[0]]

    def expand(self, rng: np.random.Generator) -> Node:
        """Choose and add one pending node."""
        kind, agent, parent = self.choose(rng)
        depth = 0 if parent < 0 else self.nodes[parent].depth + 1
        node = Node(len(self.nodes), agent, kind, parent, depth)
        self.nodes.append(node)
        return node

    def plan_round(self, rng: np.random.Generator, expansions: int) -> list[Node]:
        """Up to ``expansions`` pending nodes (none once the tree is done), within ``max_nodes``."""
        if self.done:
            return []
        return [self.expand(rng) for _ in range(min(expansions, self.max_nodes - len(self.nodes)))]

    def record(self, node: Node, reward: float, solved: bool, **data: Any) -> None:
        """Score a pending node and update its agent's posterior of its kind."""
        if node.reward is not None:
            raise ValueError(f"node {node.index} is already scored")
        node.reward, node.solved = float(reward), bool(solved)
        node.data.update(data)
        self.posteriors[node.kind][node.agent].update(node.reward)


def select_final(
    nodes: Sequence[Node], scores: Sequence[float] | None = None, ties: str = "earliest"
) -> Node:
    """MARS2-T+ final answer: the highest score (default: the node reward, i.e. the public
    score at test time); ties go to the earliest node, or with `ties="latest"` to the latest
    (MARTI's choice)."""
    if not nodes:
        raise ValueError("no nodes to select from")
    if ties not in ("earliest", "latest"):
        raise ValueError(f"ties must be 'earliest' or 'latest', got {ties!r}")
    values = [n.reward for n in nodes] if scores is None else list(scores)
    order = 1 if ties == "latest" else -1
    return nodes[max(range(len(nodes)), key=lambda i: (values[i], order * i))]


class RewardAverage:
    """Per-agent running reward sums across steps: the ``reward_average`` prior's mean."""

    def __init__(self):
        self.total: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def add(self, agent: str, reward: float) -> None:
        self.total[agent] = self.total.get(agent, 0.0) + float(reward)
        self.count[agent] = self.count.get(agent, 0) + 1

    def mean(self, agent: str) -> float:
        return self.total[agent] / self.count[agent] if self.count.get(agent) else 0.5

    def prior(self, agent: str, strength: float = 1.0) -> tuple[float, float]:
        m = self.mean(agent)
        return max(strength * m, 1e-3), max(strength * (1.0 - m), 1e-3)

    def state_dict(self) -> dict[str, Any]:
        return {"total": dict(self.total), "count": dict(self.count)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.total = {k: float(v) for k, v in state.get("total", {}).items()}
        self.count = {k: int(v) for k, v in state.get("count", {}).items()}
