"""Single-agent GRPO: the baseline of every comparison, on the same code path as the teams.

For each problem the agent samples `group_size` completions; each is scored
(fraction of tests passed, or the math answer) and its advantage is the
reward normalised within its problem's group (GRPO, Dr.GRPO or RLOO).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from pydantic import Field

from marljax import kernels as K
from marljax.workflows.base import Agent, Generator, Rollout, WorkflowSettings
from marljax.workflows.scoring import RewardKind, as_reward, check_reward_kind, score_texts

ESTIMATORS = {"grpo": K.grpo_advantages, "dr_grpo": K.dr_grpo_advantages, "rloo": K.rloo_advantages}


def group_stats(prefix: str, rewards: np.ndarray, passed: np.ndarray, advantages: np.ndarray) -> dict[str, float]:
    return {f"{prefix}/reward": float(rewards.mean()), f"{prefix}/pass_rate": float(passed.mean()),
            f"{prefix}/adv_mean": float(advantages.mean()), f"{prefix}/adv_std": float(advantages.std())}


class GrpoConfig(WorkflowSettings):
    """Single-agent GRPO family: sample a group per problem, normalise rewards within it."""

    kind: Literal["grpo"] = "grpo"
    group_size: int = Field(4, ge=2, description="responses sampled per problem")
    estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    agent: str | None = Field(None, description="agent to train; default: the only agent")
    reward: RewardKind = Field("fraction", description="fraction of tests passed, or 1 only when all pass")

    def check_agents(self, agents: Mapping[str, Any]):
        if self.agent is None and len(agents) != 1:
            return [(("agent",), "grpo trains one agent: set workflow.agent", None)]
        return super().check_agents(agents)


class GrpoWorkflow:
    def __init__(self, group_size: int = 4, estimator: str = "grpo", agent: str | None = None,
                 reward: str = "fraction"):
        if group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {group_size}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")
        self.group_size, self.estimator, self.agent = group_size, estimator, agent
        self.reward = check_reward_kind(reward)

    @classmethod
    def from_config(cls, cfg: Any) -> "GrpoWorkflow":
        return cls(cfg.group_size, cfg.estimator, cfg.agent, cfg.reward)

    def _agent(self, agents: dict[str, Agent]) -> Agent:
        if self.agent is not None:
            return agents[self.agent]
        if len(agents) != 1:
            raise ValueError(f"GRPO runs one agent; name it with workflow.agent (agents: {sorted(agents)})")
        return next(iter(agents.values()))

    def rollout(self, problems: Sequence[Any], agents: dict[str, Agent], generator: Generator,
                pool: Any, seed: int) -> Rollout:
        agent = self._agent(agents)
        G = self.group_size
        gens = generator.generate([(agent, agent.render(p.prompt)) for p in problems], G, seed)
        flat = [(i, g) for i, group in enumerate(gens) for g in group]
        scores = score_texts([problems[i] for i, _ in flat], [g.text for _, g in flat], pool)
        rewards = np.array([as_reward(s.reward, self.reward) for s in scores], np.float32)
        passed = np.array([s.passed for s in scores], np.float32)
        group_ids = np.repeat(np.arange(len(problems)), G)
        adv = np.asarray(ESTIMATORS[self.estimator](jnp.asarray(rewards), jnp.asarray(group_ids),
                                                    num_groups=len(problems)))
        version = generator.versions.get(agent.policy, 0)
        samples = [g.sample(agent, float(rewards[k]), float(adv[k]), version, problem=problems[i].id,
                            episode=k // G, node=k, parent=-1, depth=0, turn=0)
                   for k, (i, g) in enumerate(flat)]
        return Rollout(samples, group_stats(f"agent/{agent.name}", rewards, passed, adv))

    def evaluate(self, problems: Sequence[Any], agents: dict[str, Agent], generator: Generator,
                 pool: Any) -> dict[str, float]:
        """pass@1 of one (greedy, with a greedy generator) answer per held-out problem."""
        agent = self._agent(agents)
        gens = generator.generate([(agent, agent.render(p.prompt)) for p in problems], 1, 0)
        scores = score_texts(problems, [g[0].text for g in gens], pool)
        return {f"eval/{agent.name}/pass_at_1": float(np.mean([s.passed for s in scores])),
                f"eval/{agent.name}/reward": float(np.mean([s.reward for s in scores]))}
