"""SHARP with tools (arXiv 2602.08335): a planner and tool-using workers, credited by counterfactuals.

Episode (G per problem): the planner splits the question into one numbered sub-task per worker.
The workers act in order, each in its own tool episode (`marljax.workflows.tool_use`: search on
``qa``, python and calculator on ``math``) given the question, the plan, its sub-task and the
answers of the workers before it; the team's answer is the last worker's answer, its score the
outcome R.

Credit by counterfactual re-evaluation. The players are the planner (player 0, bit 0 of a
coalition index as in `marljax.kernels.shapley`) and the workers (player i + 1). The value v(S)
of a coalition is the score of the team run with the agents outside S masked: a masked planner's
plan reads "(no plan)", a masked worker does not act and is left out of the later workers'
notes, and the answer is that of the last worker in S (none: 0). Later workers whose input
changes act again (sampled, not trained); a worker whose input is unchanged keeps its answer.
``credit: counterfactual`` (the paper's practical form) masks one agent at a time:
``phi_k = v(all) - v(all without k)`` (`marljax.kernels.leave_one_out_credit`); ``credit:
shapley`` evaluates every coalition (`marljax.kernels.shapley_values`).

Reward of agent k (`marljax.kernels.sharp_rewards`): ``r_k = w_g * R + w_s * phi_k + w_p *
process_k``. Process reward: the planner's plan lists sub-tasks 1..W; a worker's tool-process
reward (`tool_use.process_reward`): the share of its calls that ran, and of those that returned
something. Advantages: each agent's rewards normalised among its own G episodes of the problem
(`marljax.kernels.sharp_advantages`). A worker's turns train as one sequence with the tool
results masked, or one sample per turn (`tools.multi_turn`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Literal

import jax.numpy as jnp
import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.rewards import Problem, Verifier
from marljax.seeds import derive_seed
from marljax.workflows.base import Agent, Generator, Workflow, register_workflow
from marljax.workflows.episodes import Episodes
from marljax.workflows.sharp import SharpTeamConfig, parse_subtasks
from marljax.workflows.tool_use import (
    AgentEpisode,
    TaskTools,
    ToolsConfig,
    episode_generations,
    process_reward,
    run_episodes,
)
from marljax.workflows.types import Generation

NO_PLAN = "(no plan)"


class SharpToolsConfig(SharpTeamConfig):
    """SHARP with tools: planner + tool-using workers, counterfactual or Shapley credit."""

    kind: Literal["sharp_tools"] = "sharp_tools"
    workers: list[str] = Field(min_length=1, max_length=4, description="tool-using agents, in order")
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    credit: Literal["counterfactual", "shapley"] = Field(
        "counterfactual", description="mask one agent at a time, or evaluate every coalition"
    )
    process_weight: float = Field(0.2, description="w_p: weight of the agent's tool-process reward")

    @model_validator(mode="after")
    def _tasks(self):
        if self.tools.task == "plan":
            raise ValueError("sharp_tools runs tools.task qa or math (plan is at_grpo_tools's)")
        return self


@dataclasses.dataclass
class TeamRun:
    """One episode's team with the agents outside `members` masked (bit 0 planner, bit i+1 worker i)."""

    episode: int
    members: int
    work: list[AgentEpisode | None]

    @property
    def answer(self) -> str:
        answers = [w.answer for w in self.work if w is not None and w.answer is not None]
        return answers[-1] if answers else ""


def plan_lists_subtasks(plan: str, workers: int) -> float:
    return float(sorted(parse_subtasks(plan)) == list(range(1, workers + 1)))


@register_workflow("sharp_tools")
class SharpToolsWorkflow(Workflow[SharpToolsConfig]):
    @functools.cached_property
    def task(self) -> TaskTools:
        """The configured task's tools and answer score."""
        return TaskTools(self.cfg.tools)

    def _plan_prompt(self, planner: Agent, problem: Problem) -> str:
        W = len(self.cfg.workers)
        return planner.render_in_context(
            problem.prompt,
            feedback=f"Split the question into {W} sub-questions, one per worker, as a numbered list 1..{W}.",
        )

    def _worker_text(self, problem: Problem, plan: str, notes: Sequence[str], i: int) -> str:
        W = len(self.cfg.workers)
        task = parse_subtasks(plan).get(
            i + 1, "(the plan lists no such sub-task: follow the plan as a whole)"
        )
        parts = [problem.prompt, f"Plan:\n{plan}"]
        if notes:
            parts.append("Answers of the workers before you:\n" + "\n".join(notes))
        parts.append(f"You are worker {i + 1} of {W}. Your sub-task: {task}")
        return "\n\n".join(parts)

    def _run_teams(
        self,
        problems: Sequence[Problem],
        plans: Sequence[tuple[int, Generation]],
        jobs: Sequence[tuple[int, int]],
        agents: Mapping[str, Agent],
        generator: Generator,
        seed: int,
        reuse: Mapping[tuple[int, int, str], AgentEpisode] | None = None,
    ) -> list[TeamRun]:
        """Each `(episode, members)` job's team run, worker by worker (one lockstep batch each);
        a worker whose text was seen in `reuse` keeps that episode instead of acting again."""
        workers = [agents[w] for w in self.cfg.workers]
        runs = [TeamRun(n, m, [None] * len(workers)) for n, m in jobs]
        for i, worker in enumerate(workers):
            fresh = []
            for run in runs:
                if not run.members >> (i + 1) & 1:
                    continue
                p, plan = plans[run.episode]
                plan_text = plan.text if run.members & 1 else NO_PLAN
                notes = [
                    f"Worker {j + 1}: {w.answer if w.answer is not None else '(no answer)'}"
                    for j, w in enumerate(run.work[:i])
                    if w is not None
                ]
                text = self._worker_text(problems[p], plan_text, notes, i)
                known = (reuse or {}).get((run.episode, i, text))
                if known is not None:
                    run.work[i] = known
                    continue
                env = self.task.env("sharp_tools", [worker.name], problems[p])
                run.work[i] = AgentEpisode.start(worker, env, problems[p], text)
                fresh.append(run.work[i])
            run_episodes(fresh, generator, derive_seed(seed, i))
        return runs

    def _coalitions(self) -> list[int]:
        K = len(self.cfg.workers) + 1
        full = (1 << K) - 1
        if self.cfg.credit == "shapley":
            return [m for m in range(full) if m >> 1]  # the empty-worker coalitions are worth 0
        return [full ^ (1 << k) for k in range(K) if (full ^ (1 << k)) >> 1]

    def _episodes(self, problems, agents, generator, seed, G):
        planner = agents[self.cfg.planner]
        gens = generator.generate([(planner, self._plan_prompt(planner, p)) for p in problems], G, seed)
        plans = [(i, g) for i in range(len(problems)) for g in gens[i]]
        full = (1 << (len(self.cfg.workers) + 1)) - 1
        actual = self._run_teams(
            problems, plans, [(n, full) for n in range(len(plans))], agents, generator, derive_seed(seed, 1)
        )
        return plans, actual

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        c, G, P = self.cfg, self.cfg.group_size, len(problems)
        W, K = len(c.workers), len(c.workers) + 1
        plans, actual = self._episodes(problems, agents, generator, seed, G)
        N = len(plans)
        # the actual runs' worker episodes, by the text each worker was given
        reuse = {(run.episode, i, w.text): w for run in actual for i, w in enumerate(run.work)}
        jobs = [(n, m) for n in range(N) for m in self._coalitions()]
        masked = self._run_teams(problems, plans, jobs, agents, generator, derive_seed(seed, 2), reuse)
        table = np.full((N, 1 << K), np.nan, np.float32)
        table[:, [m for m in range(1 << K) if not m >> 1]] = 0.0
        for run in [*actual, *masked]:
            table[run.episode, run.members] = self.task.score(problems[plans[run.episode][0]], run.answer)
        outcome = table[:, (1 << K) - 1]
        values = jnp.asarray(table)
        credit = np.asarray(
            kernels.leave_one_out_credit(values)
            if c.credit == "counterfactual"
            else kernels.shapley_values(values)
        )
        process = np.array(
            [
                [plan_lists_subtasks(plans[n][1].text, W)] + [process_reward(w.steps) for w in actual[n].work]
                for n in range(N)
            ],
            np.float32,
        )
        rewards = np.asarray(
            kernels.sharp_rewards(
                jnp.asarray(outcome),
                jnp.asarray(credit),
                jnp.asarray(process),
                global_weight=c.global_weight,
                shapley_weight=c.shapley_weight,
                process_weight=c.process_weight,
            ),
            np.float64,
        )
        episodes = Episodes(P)
        # credit is per (trajectory, agent) slot, on these rewards; a slot's rows share its advantage
        episodes.context.update(rewards=rewards, groups=[p for p, _ in plans])
        fallbacks = 0
        for n, (p, plan) in enumerate(plans):
            node = 0
            row = dict(problem=problems[p].id, episode=n, passed=outcome[n] == 1.0)
            episodes.add(plan, **row, node=0, reward=rewards[n, 0], slot=n * K)
            for i, w in enumerate(actual[n].work):
                samples, fell_back = episode_generations(w.turns, c.tools.multi_turn)
                fallbacks += fell_back
                for t, g in enumerate(samples):
                    node += 1
                    parent = 0 if t == 0 else node - 1
                    episodes.add(
                        g,
                        **row,
                        node=node,
                        parent=parent,
                        depth=1 + i,
                        turn=t,
                        reward=rewards[n, i + 1],
                        slot=n * K + i + 1,
                    )
        steps = [s for run in actual for w in run.work for s in w.steps]
        calls = sum(s.info.get("calls", 0) for s in steps)
        extras = {
            "team/reward": float(outcome.mean()),
            "team/pass_rate": float((outcome == 1.0).mean()),
            "tools/calls_per_episode": calls / N,
            "tools/valid_call_frac": sum(s.info.get("valid_calls", 0) for s in steps) / max(calls, 1),
            "tools/answered_frac": float(np.mean([run.answer != "" for run in actual])),
            "multiturn/fallbacks": float(fallbacks),
        }
        team = [c.planner, *c.workers]
        for k, name in enumerate(team):
            extras[f"agent/{name}/credit"] = float(credit[:, k].mean())
            extras[f"agent/{name}/process"] = float(process[:, k].mean())
        episodes.extras.update(extras)
        return episodes

    def credit(self, episodes: Episodes):
        """SHARP's advantages of each (trajectory, agent) slot, on the slots' unshaped rewards
        (a slot spans a worker's turns), handed to each of the slot's rows."""
        rewards, groups = episodes.context["rewards"], episodes.context["groups"]
        advantages = kernels.sharp_advantages(
            jnp.asarray(rewards, jnp.float32), jnp.asarray(groups, jnp.int32), episodes.num_problems
        )
        return np.asarray(advantages).reshape(-1)[episodes["slot"]]

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) team run per held-out problem."""
        plans, actual = self._episodes(problems, agents, generator, 0, 1)
        scores = np.array([self.task.score(problems[p], run.answer) for (p, _), run in zip(plans, actual)])
        return {
            "eval/team/pass_at_1": float((scores == 1.0).mean()),
            "eval/team/reward": float(scores.mean()),
        }
