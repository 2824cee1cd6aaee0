"""Debate: two agents answer, read each other's answer and revise; the pair is rewarded jointly.

Per problem, `group_size` debates. Round 0: each agent answers the problem on
its own (debate g pairs the agents' g-th answers). Round 1: each agent sees
its own answer and the other's, and revises. The joint reward of a debate is
the mean of the verifier's rewards of the two revised answers (fraction of
tests passed, or the math answer), and it passes when both revised answers
pass; every turn of the debate gets both. Credit: each agent's turns are
normalised among that agent's turns on the same problem
(`marljax.kernels.dr_mas_advantages` with problem groups), so that a weaker
debater's advantages are not pushed down by the stronger one's rewards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from marljax.rewards import Problem, Verifier
from marljax.seeds import derive_seed
from marljax.workflows.base import Agent, BaseWorkflowConfig, Generator, Workflow, register_workflow
from marljax.workflows.episodes import Episodes, agentwise_advantages
from marljax.workflows.types import Generation

REVISE = "Revise your answer in the light of the other answer. Reply with your complete final answer."


class DebateConfig(BaseWorkflowConfig):
    """Debate: two agents answer, see each other's answer, revise; joint reward, per-agent credit."""

    kind: Literal["debate"] = "debate"
    agents: list[str] = Field(
        default_factory=lambda: ["alice", "bob"], min_length=2, max_length=2, description="the two debaters"
    )
    group_size: int = Field(4, ge=2, description="debates per problem")

    def check_agents(self, agents: Mapping[str, Any]):
        found = [
            (("agents", k), f"unknown agent; known: {', '.join(agents)}", name)
            for k, name in enumerate(self.agents)
            if name not in agents
        ]
        if self.agents[0] == self.agents[1]:
            found.append((("agents", 1), "the two debaters must be different agents", self.agents[1]))
        return found


@register_workflow("debate")
class DebateWorkflow(Workflow[DebateConfig]):
    def debate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        seed: int,
        n: int,
    ) -> tuple[list[list[Generation]], list[list[Generation]]]:
        """`n` debates per problem: (first answers, revised answers), each `[problem * n + g][agent]`."""
        pair = [agents[name] for name in self.cfg.agents]
        gens = generator.generate([(a, a.render(p.prompt)) for p in problems for a in pair], n, seed)
        first = [[gens[2 * i + j][g] for j in range(2)] for i in range(len(problems)) for g in range(n)]
        requests = []
        for d, answers in enumerate(first):
            for j, agent in enumerate(pair):
                other = pair[1 - j]
                problem = problems[d // n].prompt
                history = (
                    f"Your answer:\n{answers[j].text}\n\nThe answer of {other.name}:\n{answers[1 - j].text}"
                )
                text = agent.render_in_context(problem, feedback=REVISE, history=history)
                # as chat: the agent's own answer is its turn, the other's answer and the request the user's
                reply = f"The answer of {other.name}:\n{answers[1 - j].text}\n\n{REVISE}"
                requests.append((agent, agent.render(problem).continued(answers[j].text, reply, text)))
        gens = generator.generate(requests, 1, derive_seed(seed, 1))
        revised = [[gens[2 * d + j][0] for j in range(2)] for d in range(len(first))]
        return first, revised

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        n = self.cfg.group_size
        first, revised = self.debate(problems, agents, generator, seed, n)
        debates = range(len(first))
        # one scoring batch for both rounds; the first round's scores are only reported
        scores = verifier.score(
            [problems[d // n] for d in debates for _ in range(4)],
            [g.text for d in debates for g in (*first[d], *revised[d])],
        )
        joint = np.array([(scores[4 * d + 2].reward + scores[4 * d + 3].reward) / 2 for d in debates])
        both = np.array([scores[4 * d + 2].passed and scores[4 * d + 3].passed for d in debates])
        episodes = Episodes(len(problems))
        # four turns per debate: each agent's first answer (nodes 0, 1), then its revision (nodes 2, 3)
        for d in debates:
            for node, g in enumerate((*first[d], *revised[d])):
                episodes.add(
                    g,
                    problem=problems[d // n].id,
                    episode=d,
                    node=node,
                    parent=node - 2 if node >= 2 else -1,
                    depth=node // 2,
                    turn=node // 2,
                    reward=joint[d],
                    passed=both[d],
                    agent=node % 2,
                    group=d // n,
                )
        episodes.extras.update(
            {
                "team/reward": float(joint.mean()),
                "team/pass_rate": float(both.mean()),
                "debate/first_reward": float(
                    np.mean([scores[4 * d + j].reward for d in debates for j in (0, 1)])
                ),
            }
        )
        return episodes

    def credit(self, episodes: Episodes):
        """Each agent's turns normalised among that agent's turns on the same problem."""
        return agentwise_advantages(episodes, 2)

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) debate per held-out problem: each agent's revised
        answer's pass@1, and the pair's."""
        _, revised = self.debate(problems, agents, generator, 0, 1)
        scores = verifier.score(
            [p for p in problems for _ in range(2)], [g.text for pair in revised for g in pair]
        )
        passed = np.array([s.passed for s in scores]).reshape(-1, 2)
        out = {f"eval/{name}/pass_at_1": float(passed[:, j].mean()) for j, name in enumerate(self.cfg.agents)}
        out["eval/team/pass_at_1"] = float(passed.all(axis=1).mean())
        out["eval/team/reward"] = float(np.mean([s.reward for s in scores]))
        return out
