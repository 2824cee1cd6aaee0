"""Single-agent GRPO: the baseline of every comparison, on the same code path as the teams.

For each problem the agent samples `group_size` completions; each is scored
(fraction of tests passed, or the math answer) and its advantage is the
reward normalised within its problem's group (GRPO, Dr.GRPO or RLOO).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from marljax import kernels
from marljax.rewards import Problem, Verifier
from marljax.workflows.base import Agent, BaseWorkflowConfig, Generator, Workflow, register_workflow
from marljax.workflows.episodes import Episodes
from marljax.workflows.scoring import RewardKind, as_reward

ESTIMATORS = {
    "grpo": kernels.grpo_advantages,
    "dr_grpo": kernels.dr_grpo_advantages,
    "rloo": kernels.rloo_advantages,
}


class GrpoConfig(BaseWorkflowConfig):
    """Single-agent GRPO family: sample a group per problem, normalise rewards within it."""

    kind: Literal["grpo"] = "grpo"
    group_size: int = Field(4, ge=2, description="responses sampled per problem")
    estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    agent: str | None = Field(None, description="agent to train; default: the only agent")
    reward: RewardKind = Field("fraction", description="fraction of tests passed, or 1 only when all pass")

    def check_agents(self, agents: Mapping[str, Any]):
        if self.agent is None and len(agents) != 1:
            return [(("agent",), "grpo trains one agent: set workflow.agent", None)]
        if self.agent is not None and self.agent not in agents:
            return [(("agent",), f"unknown agent; known: {', '.join(agents)}", self.agent)]
        return []


@register_workflow("grpo")
class GrpoWorkflow(Workflow[GrpoConfig]):
    def _agent(self, agents: Mapping[str, Agent]) -> Agent:
        if self.cfg.agent is not None:
            return agents[self.cfg.agent]
        if len(agents) != 1:
            raise ValueError(f"GRPO runs one agent; name it with workflow.agent (agents: {sorted(agents)})")
        return next(iter(agents.values()))

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        agent, G = self._agent(agents), self.cfg.group_size
        gens = generator.generate([(agent, agent.render(p.prompt)) for p in problems], G, seed)
        flat = [(i, g) for i, group in enumerate(gens) for g in group]
        scores = verifier.score([problems[i] for i, _ in flat], [g.text for _, g in flat])
        episodes = Episodes(len(problems), reward_dtype=np.float32)
        for k, ((i, g), s) in enumerate(zip(flat, scores)):
            reward = as_reward(s.reward, self.cfg.reward)
            episodes.add(
                g, problem=problems[i].id, episode=k // G, node=k, reward=reward, passed=s.passed, group=i
            )
        return episodes

    def credit(self, episodes: Episodes):
        estimator = ESTIMATORS[self.cfg.estimator]
        return estimator(episodes.array("reward"), episodes.array("group"), num_groups=episodes.num_problems)

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """pass@1 of one (greedy, with a greedy generator) answer per held-out problem."""
        agent = self._agent(agents)
        gens = generator.generate([(agent, agent.render(p.prompt)) for p in problems], 1, 0)
        scores = verifier.score(problems, [g[0].text for g in gens])
        return {
            f"eval/{agent.name}/pass_at_1": float(np.mean([s.passed for s in scores])),
            f"eval/{agent.name}/reward": float(np.mean([s.reward for s in scores])),
        }
