"""SHARP (arXiv 2602.08335): a planner and workers, credited by Shapley values of counterfactual programs.

Episode (G per problem): the planner writes a plan, a numbered list of one
sub-task per worker; each worker, given the plan, writes the code of its
sub-task; the team's program is the workers' code concatenated in worker
order (the last worker writes the entry point).

Counterfactual re-evaluation. The players are the planner (player 0, bit 0 of
a coalition index, as in `marljax.kernels.shapley`) and the workers (player
i + 1). The value v(S) of a coalition is the fraction of all tests passed by
the program built from the code of the workers in S, the others' code masked
(replaced by nothing). The workers wrote their code for the plan, and
re-sampling them without it would need new generations, so a coalition
without the planner is valued as if no worker had written code:
``v(S) = v(empty) if planner not in S``. Shapley credit phi_k comes from
`marljax.kernels.shapley_values` over the full table (`shapley: exact`, 2^W
programs per episode) or `sampled_shapley_values` (`shapley: sampled`: only
the coalitions its permutations visit are run in the sandbox); `shapley:
counterfactual` is the paper's practical form, masking one agent at a time:
``phi_k = v(all) - v(all without k)`` (`marljax.kernels.leave_one_out_credit`,
W + 1 programs per episode).

Reward of agent k (`marljax.kernels.sharp_rewards`):
``r_k = w_g * R + w_s * phi_k + w_p * process_k``, R = v(all) the team's
outcome. Process reward (ours; the paper's is tool-call success, which the tool form has): the planner
gets 1 when its plan lists exactly sub-tasks 1..W; a worker gets 1 when its
code parses and defines what its part needs: the last worker the entry point
(`Problem.entry_point`; any code for a stdin program), the others at
least one top-level function or class. Advantages: each agent's rewards
normalised among its own G episodes of the problem (`sharp_advantages`).

With tools (`tools:`, task ``qa`` or ``math``), the planner splits the question into one numbered
sub-question per worker, and the workers act in order, each in its own tool episode
(`marljax.workflows.turns`) given the question, the plan, its sub-task and the answers of the
workers before it; the team's answer is the last worker's, its score the outcome R. The value
v(S) of a coalition is the score of the team run with the agents outside S masked: a masked
planner's plan reads "(no plan)", a masked worker does not act and is left out of the later
workers' notes, and the answer is that of the last worker in S (none: 0). Later workers whose
input changes act again (sampled, not trained); a worker whose input is unchanged keeps its
answer. ``shapley: counterfactual`` masks one agent at a time, ``exact`` runs every coalition.
A masked team's re-acting workers sample, so one run is one draw of their noise:
``counterfactual_samples: m`` runs each masked team m times and values it by the mean score.
A worker's process reward is its tool-process reward (`turns.process_reward`), and its turns
train as one sequence with the tool results masked, or one sample per turn (`tools.multi_turn`);
all rows of an agent's turn share its advantage.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.rewards import Problem, Verifier, extract_code
from marljax.seeds import derive_seed
from marljax.workflows.base import (
    Agent,
    BaseWorkflowConfig,
    Generator,
    Workflow,
    register_alias,
    register_workflow,
)
from marljax.workflows.diversity import grouped_diversity
from marljax.workflows.episodes import Episodes
from marljax.workflows.shapley import coalition_code, sampled_coalitions, shapley_credit, team_value_table
from marljax.workflows.sharp_teams import TeamRun, parse_subtasks, run_teams
from marljax.workflows.turns import TaskTools, ToolsConfig, episode_generations, process_reward, run_turns
from marljax.workflows.types import Generation

MAX_EXACT_WORKERS = 8  # 2^8 programs per episode; beyond, use shapley: sampled
MAX_TOOL_WORKERS = 4  # each coalition re-runs the later workers' tool episodes


def plan_lists_subtasks(plan: str, workers: int) -> float:
    """The planner's process reward: 1 when its plan lists exactly sub-tasks 1..`workers`."""
    return float(sorted(parse_subtasks(plan)) == list(range(1, workers + 1)))


def process_rewards(plan: str, texts: Sequence[str], entry: str | None) -> np.ndarray:
    """`[1 + W]`: the planner's (plan lists sub-tasks 1..W) then each worker's (module doc)."""
    W = len(texts)
    out = [plan_lists_subtasks(plan, W)]
    for i, text in enumerate(texts):
        got = extract_code(text)
        if not got.syntax_ok:
            out.append(0.0)
            continue
        body = ast.parse(got.code).body
        defs = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        if i == W - 1:
            out.append(float(entry in defs if entry else bool(body)))
        else:
            out.append(float(bool(defs)))
    return np.asarray(out, np.float32)


@dataclasses.dataclass
class Trajectory:
    problem: Problem
    group: int
    plan: Generation
    work: list[Generation] = dataclasses.field(default_factory=list)

    @property
    def codes(self) -> list[str]:
        return [extract_code(g.text).code for g in self.work]


class SharpConfig(BaseWorkflowConfig):
    """SHARP: planner + workers, Shapley credit over counterfactual programs (or, with tools,
    counterfactual team runs), per-agent advantages."""

    kind: Literal["sharp"] = "sharp"
    planner: str = Field("planner", description="agent that splits the task into one sub-task per worker")
    workers: list[str] = Field(
        min_length=1,
        description="agents working on the sub-tasks, in order; the last one's output is the team's",
    )
    group_size: int = Field(4, ge=2, description="episodes per problem")
    global_weight: float = Field(1.0, description="w_g: weight of the team's outcome")
    shapley_weight: float = Field(
        1.0, description="w_s: weight of the agent's Shapley (or counterfactual) credit"
    )
    process_weight: float = Field(0.1, description="w_p: weight of the agent's process reward")
    shapley: Literal["exact", "sampled", "counterfactual"] = Field(
        "exact",
        description="exact / sampled Shapley values, or counterfactual: v(all) - v(all without the agent)",
    )
    num_permutations: int = Field(8, ge=1, description="sampled: random orders (each with its reverse)")
    tools: ToolsConfig | None = Field(
        None, description="tool-using workers (task qa or math); None: the workers write code"
    )
    counterfactual_samples: int = Field(
        1,
        ge=1,
        description="with tools: runs of each masked team, their scores averaged (the workers whose "
        "input the masking changed act again, sampled: one run is one draw of that noise)",
    )

    @model_validator(mode="after")
    def _distinct_agents(self):
        names = [self.planner, *self.workers]
        if len(set(names)) != len(names):
            raise ValueError(f"planner and workers must be different agents, got {names}")
        return self

    @model_validator(mode="after")
    def _limits(self):
        W = len(self.workers)
        if self.tools is None and self.shapley == "exact" and W > MAX_EXACT_WORKERS:
            raise ValueError(
                f"exact Shapley over {W} workers runs 2^{W} "
                f"programs per episode; use shapley: sampled beyond {MAX_EXACT_WORKERS}"
            )
        if self.tools is not None:
            if self.tools.task == "plan":
                raise ValueError("sharp with tools runs tools.task qa or math (plan is at_grpo's)")
            if self.shapley == "sampled":
                raise ValueError("sharp with tools credits by shapley: counterfactual or exact")
            if W > MAX_TOOL_WORKERS:
                raise ValueError(f"sharp with tools takes at most {MAX_TOOL_WORKERS} workers, got {W}")
        return self

    def check_agents(self, agents):
        bad = [(("planner",), self.planner)] if self.planner not in agents else []
        bad += [(("workers", i), w) for i, w in enumerate(self.workers) if w not in agents]
        return [(key, f"unknown agent; known: {', '.join(agents)}", name) for key, name in bad]


@register_workflow("sharp")
class SharpWorkflow(Workflow[SharpConfig]):
    @functools.cached_property
    def task(self) -> TaskTools:
        """The configured task's tools and answer score (with `tools`)."""
        return TaskTools(self.cfg.tools)

    def _plan_prompt(self, planner: Agent, problem: Problem) -> str:
        W, fn = len(self.cfg.workers), problem.entry_point
        if self.cfg.tools is not None:
            split = f"Split the question into {W} sub-questions, one per worker, as a numbered list 1..{W}."
        else:
            last = (
                f"sub-task {W} writes the entry point `{fn}`"
                if fn
                else f"sub-task {W} writes the main program"
            )
            split = f"Split the task into {W} sub-tasks, one per worker, as a numbered list 1..{W}; {last}."
        return planner.render_in_context(problem.prompt, feedback=split)

    def _plans(self, problems, agents, generator, seed, G) -> list[Trajectory]:
        planner = agents[self.cfg.planner]
        plans = run_turns(generator, [(planner, self._plan_prompt(planner, p)) for p in problems], seed, G)
        return [Trajectory(p, i, g) for i, p in enumerate(problems) for g in plans[i]]

    def _team(self, problems, agents, generator, seed: int, G: int) -> list[Trajectory]:
        """Two generate calls: all plans, then every worker of every episode."""
        c = self.cfg
        workers, W = [agents[w] for w in c.workers], len(c.workers)
        trajs = self._plans(problems, agents, generator, seed, G)
        requests = []
        for t in trajs:
            items = parse_subtasks(t.plan.text)
            for i, w in enumerate(workers):
                task = items.get(i + 1, "(the plan lists no such sub-task: follow the plan as a whole)")
                requests.append(
                    (
                        w,
                        w.render_in_context(
                            t.problem.prompt,
                            history=f"Plan:\n{t.plan.text}",
                            feedback=f"You are worker {i + 1} of {W}. Write only sub-task {i + 1}: {task}\n"
                            "Reply with Python code in a ```python block.",
                        ),
                    )
                )
        gens = run_turns(generator, requests, derive_seed(seed, 1, "stage"))
        for k, t in enumerate(trajs):
            t.work = [g for (g,) in gens[k * W : (k + 1) * W]]
        return trajs

    def _values(
        self, trajs: list[Trajectory], verifier: Verifier, needed: list[list[int]]
    ) -> tuple[np.ndarray, int]:
        """`[N, 2^W]` worker-coalition values (NaN where not needed) and the number of programs run:
        one sandbox batch, each distinct program of a problem run once."""
        for t in trajs:
            if t.problem.is_math:
                raise ValueError(f"SHARP runs code problems; {t.problem.id!r} is a math problem")
        tables = np.full((len(trajs), 1 << len(self.cfg.workers)), np.nan, np.float32)
        cells, programs, keys = [], [], []
        for n, (t, masks) in enumerate(zip(trajs, needed)):
            codes = t.codes
            for m in masks:
                code = coalition_code(codes, m)
                if code.strip():
                    cells.append((n, m))
                    programs.append(t.problem.program(code))
                    keys.append((t.group, code))
                else:
                    tables[n, m] = 0.0  # nothing to run: no test passes
        for (n, m), res in zip(cells, verifier.run(programs, keys)):
            tables[n, m] = res.pass_fraction()
        return tables, len(set(keys))

    def _play_code(self, problems, agents, generator, verifier, seed):
        """Code workers: (trajectories, rows per trajectory, outcome, credit, process, extras)."""
        c, W = self.cfg, len(self.cfg.workers)
        trajs = self._team(problems, agents, generator, seed, c.group_size)
        full, keys = (1 << W) - 1, None
        if c.shapley == "exact":
            needed = [list(range(1 << W))] * len(trajs)
        elif c.shapley == "counterfactual":  # the whole team, and the team without each worker
            needed = [sorted({0, full} | {full ^ (1 << i) for i in range(W)})] * len(trajs)
        else:  # the worker coalitions the permutations visit with the planner in, plus the empty and full teams
            keys = jax.vmap(lambda n: jax.random.fold_in(jax.random.PRNGKey(seed % 2**31), n))(
                jnp.arange(len(trajs))
            )
            needed = [
                sorted({s >> 1 for s in seen if s & 1} | {0, full})
                for seen in sampled_coalitions(W + 1, keys, c.num_permutations)
            ]
        worker_tables, programs_run = self._values(trajs, verifier, needed)
        credit = shapley_credit(
            np.stack([team_value_table(w) for w in worker_tables]), c.shapley, keys, c.num_permutations
        )
        outcome = worker_tables[:, full]
        process = np.stack(
            [process_rewards(t.plan.text, [g.text for g in t.work], t.problem.entry_point) for t in trajs]
        )
        # (agent, generation, node, parent, depth, turn) of each row
        rows = [
            [(k, g, k, -1 if k == 0 else 0, min(k, 1), min(k, 1)) for k, g in enumerate((t.plan, *t.work))]
            for t in trajs
        ]
        programs = [
            [coalition_code(t.codes, full) for t in trajs if t.group == i] for i in range(len(problems))
        ]
        extras = {"team/programs_run": float(programs_run), **grouped_diversity(programs, "team")}
        return trajs, rows, outcome, credit, process, extras

    # ------------------------------------------------------------ tool workers
    def _coalitions(self) -> list[int]:
        K = len(self.cfg.workers) + 1
        full = (1 << K) - 1
        if self.cfg.shapley == "exact":
            return [m for m in range(full) if m >> 1]  # the empty-worker coalitions are worth 0
        return [full ^ (1 << k) for k in range(K) if (full ^ (1 << k)) >> 1]

    def _tool_teams(self, problems, agents, generator, seed, G) -> tuple[list[Trajectory], list[TeamRun]]:
        trajs = self._plans(problems, agents, generator, seed, G)
        full = (1 << (len(self.cfg.workers) + 1)) - 1
        jobs = [(n, full) for n in range(len(trajs))]
        workers = [agents[w] for w in self.cfg.workers]
        return trajs, run_teams(trajs, jobs, workers, self.task, generator, derive_seed(seed, 1))

    def _play_tools(self, problems, agents, generator, verifier, seed):
        """Tool workers: (trajectories, rows per trajectory, outcome, credit, process, extras)."""
        c, W, K = self.cfg, len(self.cfg.workers), len(self.cfg.workers) + 1
        trajs, actual = self._tool_teams(problems, agents, generator, seed, c.group_size)
        N = len(trajs)
        # the actual runs' worker episodes, by the text each worker was given
        reuse = {(run.episode, i, w.text): w for run in actual for i, w in enumerate(run.work)}
        jobs = [(n, m) for n in range(N) for m in self._coalitions()]
        workers = [agents[w] for w in c.workers]
        first = derive_seed(seed, 2)  # the further runs' seeds derive from the first run's
        masked = [
            run
            for r in range(c.counterfactual_samples)
            for run in run_teams(
                trajs, jobs, workers, self.task, generator, derive_seed(first, r) if r else first, reuse
            )
        ]
        scores: dict[tuple[int, int], list[float]] = {}
        for run in [*actual, *masked]:
            score = self.task.score(trajs[run.episode].problem, run.answer)
            scores.setdefault((run.episode, run.members), []).append(score)
        table = np.full((N, 1 << K), np.nan, np.float32)
        table[:, [m for m in range(1 << K) if not m >> 1]] = 0.0
        for (n, m), values in scores.items():
            table[n, m] = np.mean(values)
        outcome = table[:, (1 << K) - 1]
        credit = shapley_credit(table, c.shapley)
        process = np.array(
            [
                [plan_lists_subtasks(t.plan.text, W)] + [process_reward(w.steps) for w in run.work]
                for t, run in zip(trajs, actual)
            ],
            np.float32,
        )
        rows, fallbacks = [], 0
        for t, run in zip(trajs, actual):
            node, own = 0, [(0, t.plan, 0, -1, 0, 0)]
            for i, w in enumerate(run.work):
                samples, fell_back = episode_generations(w.turns, c.tools.multi_turn)
                fallbacks += fell_back
                for turn, g in enumerate(samples):
                    node += 1
                    own.append((i + 1, g, node, 0 if turn == 0 else node - 1, 1 + i, turn))
            rows.append(own)
        steps = [s for run in actual for w in run.work for s in w.steps]
        calls = sum(s.info.get("calls", 0) for s in steps)
        extras = {
            "tools/calls_per_episode": calls / N,
            "tools/valid_call_frac": sum(s.info.get("valid_calls", 0) for s in steps) / max(calls, 1),
            "tools/answered_frac": float(np.mean([run.answer != "" for run in actual])),
            "multiturn/fallbacks": float(fallbacks),
        }
        return trajs, rows, outcome, credit, process, extras

    # --------------------------------------------------------------- interface
    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        c = self.cfg
        play = self._play_code if c.tools is None else self._play_tools
        trajs, rows, outcome, credit, process, extras = play(problems, agents, generator, verifier, seed)
        rewards = np.asarray(
            kernels.sharp_rewards(
                jnp.asarray(outcome),
                jnp.asarray(credit),
                jnp.asarray(process),
                global_weight=c.global_weight,
                shapley_weight=c.shapley_weight,
                process_weight=c.process_weight,
            )
        )
        K = 1 + len(c.workers)
        # every agent of a trajectory is credited with its team's outcome: it passes when the team does;
        # an agent's rows (a tool episode's turns) share its slot, and so its advantage
        episodes = Episodes(len(problems), reward_dtype=rewards.dtype)
        for n, (t, own) in enumerate(zip(trajs, rows)):
            for k, g, node, parent, depth, turn in own:
                episodes.add(
                    g,
                    problem=t.problem.id,
                    episode=n,
                    node=node,
                    parent=parent,
                    depth=depth,
                    turn=turn,
                    reward=rewards[n, k],
                    passed=outcome[n] == 1.0,
                    group=t.group,
                    slot=n * K + k,
                )
        episodes.extras.update(
            {"team/reward": float(outcome.mean()), "team/pass_rate": float((outcome == 1.0).mean())}
        )
        credit_name = "credit" if c.tools is not None else "shapley"
        for k, name in enumerate([c.planner, *c.workers]):
            episodes.extras[f"agent/{name}/{credit_name}"] = float(credit[:, k].mean())
            episodes.extras[f"agent/{name}/process"] = float(process[:, k].mean())
        episodes.extras.update(extras)
        return episodes

    def credit(self, episodes: Episodes):
        """SHARP's advantages: each agent's (slot's) reward normalised within its problem's
        trajectories, handed to each of the slot's rows."""
        K = 1 + len(self.cfg.workers)
        slots = episodes["slot"]
        # a slot's rows share its reward, up to each row's own overlong penalty: its first row's counts
        first = np.unique(slots, return_index=True)[1]
        rewards = episodes.array("reward")[first].reshape(-1, K)
        groups = episodes.array("group")[first][::K]
        advantages = kernels.sharp_advantages(rewards, groups, episodes.num_problems)
        return np.asarray(advantages).reshape(-1)[slots]

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) team per held-out problem: pass@1."""
        if self.cfg.tools is not None:
            trajs, actual = self._tool_teams(problems, agents, generator, 0, 1)
            outcome = np.array([self.task.score(t.problem, run.answer) for t, run in zip(trajs, actual)])
        else:
            trajs = self._team(problems, agents, generator, 0, 1)
            full = (1 << len(self.cfg.workers)) - 1
            outcome = self._values(trajs, verifier, [[full]] * len(trajs))[0][:, full]
        return {
            "eval/team/pass_at_1": float((outcome == 1.0).mean()),
            "eval/team/reward": float(outcome.mean()),
        }


def _from_sharp_tools(v: dict) -> dict:
    """`kind: sharp_tools` (SHARP with tools before it was an option) as `kind: sharp`."""
    v = dict(v, kind="sharp")
    credit = v.pop("credit", "counterfactual")
    v.setdefault("shapley", "exact" if credit == "shapley" else credit)
    v.setdefault("process_weight", 0.2)
    v.setdefault("tools", {})
    return v


register_alias("sharp_tools", _from_sharp_tools)
