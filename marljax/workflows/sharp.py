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
W + 1 programs per episode). `marljax.workflows.sharp_tools` is SHARP with
tool-using workers.

Reward of agent k (`marljax.kernels.sharp_rewards`):
``r_k = w_g * R + w_s * phi_k + w_p * process_k``, R = v(all) the team's
outcome. Process reward (ours; the paper's is tool-call success, which `sharp_tools` has): the planner
gets 1 when its plan lists exactly sub-tasks 1..W; a worker gets 1 when its
code parses and defines what its part needs: the last worker the entry point
(`Problem.entry_point`; any code for a stdin program), the others at
least one top-level function or class. Advantages: each agent's rewards
normalised among its own G episodes of the problem (`sharp_advantages`).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from pydantic import Field, model_validator

from marljax import kernels
from marljax.rewards import Problem, Verifier, extract_code
from marljax.seeds import derive_seed
from marljax.workflows.base import Agent, BaseWorkflowConfig, Generator, Workflow, register_workflow
from marljax.workflows.diversity import grouped_diversity
from marljax.workflows.episodes import Episodes
from marljax.workflows.types import Generation

MAX_EXACT_WORKERS = 8  # 2^8 programs per episode; beyond, use shapley: sampled
_ITEM = re.compile(r"^\s*(?:step\s*)?(\d+)\s*[.):]\s*(.+?)\s*$", re.I | re.M)


def parse_subtasks(text: str) -> dict[int, str]:
    """Numbered sub-tasks of a plan: `1. ...`, `2) ...`, `Step 3: ...`; the first of each number wins."""
    items: dict[int, str] = {}
    for m in _ITEM.finditer(text):
        items.setdefault(int(m.group(1)), m.group(2))
    return items


def coalition_code(codes: Sequence[str], members: int) -> str:
    """The team program of a worker coalition (bit i of `members`: worker i): members' code in worker
    order, everyone else's masked out."""
    return "\n\n".join(c for i, c in enumerate(codes) if members >> i & 1 and c.strip())


def team_value_table(worker_values: np.ndarray) -> np.ndarray:
    """`[2^W]` worker-coalition values -> `[2^(W+1)]` with the planner as player 0 (bit 0):
    ``v(S) = w(S >> 1)`` when the planner is in S, else ``w(0)`` (no plan: as if no worker wrote code)."""
    idx = np.arange(2 * len(worker_values))
    return np.where(idx & 1, worker_values[idx >> 1], worker_values[0]).astype(np.float32)


def sampled_coalitions(num_players: int, keys: jax.Array, num_permutations: int) -> list[list[int]]:
    """Per key `[N, 2]`: the coalitions `sampled_shapley_values(..., key, num_permutations)` visits
    (bitmask indices), found by running the kernel once with a recording value function."""
    seen: list[set[int]] = [set() for _ in range(len(keys))]

    def record(c):  # c: [N, orders, K + 1, K], the outer vmap first
        idx = (np.asarray(c, np.int64) << np.arange(num_players)).sum(-1)
        for n, rows in enumerate(idx.reshape(len(seen), -1)):
            seen[n].update(rows.tolist())
        return np.zeros(idx.shape, np.float32)

    def probe(c):  # the kernel vmaps it; the callback sees all coalitions at once
        return jax.pure_callback(record, jax.ShapeDtypeStruct((), jnp.float32), c, vmap_method="expand_dims")

    run = jax.vmap(lambda key: kernels.sampled_shapley_values(probe, num_players, key, num_permutations)[0])
    jax.block_until_ready(run(keys))
    return [sorted(s) for s in seen]


def shapley_credit(
    tables: np.ndarray, method: str = "exact", keys: jax.Array | None = None, num_permutations: int = 8
) -> np.ndarray:
    """Shapley value of each player `[N, K]` from bitmask-indexed tables `[N, 2^K]`; `sampled` with one
    PRNG key per table `[N, 2]` (entries its permutations never visit may be NaN)."""
    tables = jnp.asarray(tables, jnp.float32)
    if method == "exact":
        return np.asarray(kernels.shapley_values(tables))
    if method == "counterfactual":
        return np.asarray(kernels.leave_one_out_credit(tables))
    num_players = int(tables.shape[-1]).bit_length() - 1

    def one(table, key):
        return kernels.sampled_shapley_values(
            lambda c: table[kernels.coalition_index(c)], num_players, key, num_permutations
        )[0]

    return np.asarray(jax.vmap(one)(tables, keys))


def process_rewards(plan: str, texts: Sequence[str], entry: str | None) -> np.ndarray:
    """`[1 + W]`: the planner's (plan lists sub-tasks 1..W) then each worker's (module doc)."""
    W = len(texts)
    out = [float(sorted(parse_subtasks(plan)) == list(range(1, W + 1)))]
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


class SharpTeamConfig(BaseWorkflowConfig):
    """What SHARP's workflows share: a planner and its workers, episodes per problem, and the
    weights of the three reward terms."""

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

    @model_validator(mode="after")
    def _distinct_agents(self):
        names = [self.planner, *self.workers]
        if len(set(names)) != len(names):
            raise ValueError(f"planner and workers must be different agents, got {names}")
        return self

    def check_agents(self, agents):
        bad = [(("planner",), self.planner)] if self.planner not in agents else []
        bad += [(("workers", i), w) for i, w in enumerate(self.workers) if w not in agents]
        return [(key, f"unknown agent; known: {', '.join(agents)}", name) for key, name in bad]


class SharpConfig(SharpTeamConfig):
    """SHARP: planner + workers, Shapley credit over counterfactual programs, per-agent advantages."""

    kind: Literal["sharp"] = "sharp"
    shapley: Literal["exact", "sampled", "counterfactual"] = Field(
        "exact",
        description="exact / sampled Shapley values, or counterfactual: v(all) - v(all without the agent)",
    )
    num_permutations: int = Field(8, ge=1, description="sampled: random orders (each with its reverse)")

    @model_validator(mode="after")
    def _exact_limit(self):
        if self.shapley == "exact" and len(self.workers) > MAX_EXACT_WORKERS:
            raise ValueError(
                f"exact Shapley over {len(self.workers)} workers runs 2^{len(self.workers)} "
                f"programs per episode; use shapley: sampled beyond {MAX_EXACT_WORKERS}"
            )
        return self


@register_workflow("sharp")
class SharpWorkflow(Workflow[SharpConfig]):
    def _plan_prompt(self, planner: Agent, problem: Problem) -> str:
        W, fn = len(self.cfg.workers), problem.entry_point
        last = (
            f"sub-task {W} writes the entry point `{fn}`" if fn else f"sub-task {W} writes the main program"
        )
        return planner.render_in_context(
            problem.prompt,
            feedback=f"Split the task into {W} sub-tasks, one per worker, as a numbered list 1..{W}; {last}.",
        )

    def _team(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        seed: int,
        G: int,
    ) -> list[Trajectory]:
        """Two generate calls: all plans, then every worker of every episode."""
        c = self.cfg
        planner, workers, W = agents[c.planner], [agents[w] for w in c.workers], len(c.workers)
        plans = generator.generate([(planner, self._plan_prompt(planner, p)) for p in problems], G, seed)
        trajs = [Trajectory(p, i, g) for i, p in enumerate(problems) for g in plans[i]]
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
        gens = generator.generate(requests, 1, derive_seed(seed, 1, "stage"))
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

    def play(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        seed: int,
    ) -> Episodes:
        c, G = self.cfg, self.cfg.group_size
        W, P = len(c.workers), len(problems)
        trajs = self._team(problems, agents, generator, seed, G)
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
        team = [agents[c.planner]] + [agents[w] for w in c.workers]
        # every agent of a trajectory is credited with its team's program: it passes when that program does
        episodes = Episodes(P, reward_dtype=rewards.dtype)
        for n, t in enumerate(trajs):
            for k, g in enumerate((t.plan, *t.work)):
                episodes.add(
                    g,
                    problem=t.problem.id,
                    episode=n,
                    node=k,
                    parent=-1 if k == 0 else 0,
                    depth=min(k, 1),
                    turn=min(k, 1),
                    reward=rewards[n, k],
                    passed=outcome[n] == 1.0,
                    group=t.group,
                )
        extras = {
            "team/reward": float(outcome.mean()),
            "team/pass_rate": float((outcome == 1.0).mean()),
            "team/programs_run": float(programs_run),
        }
        for k, a in enumerate(team):
            extras[f"agent/{a.name}/shapley"] = float(credit[:, k].mean())
            extras[f"agent/{a.name}/process"] = float(process[:, k].mean())
        programs = [[coalition_code(t.codes, full) for t in trajs if t.group == i] for i in range(P)]
        extras.update(grouped_diversity(programs, "team"))
        episodes.extras.update(extras)
        return episodes

    def credit(self, episodes: Episodes):
        """SHARP's advantages: each agent's rewards normalised within its problem's trajectories."""
        K = 1 + len(self.cfg.workers)
        rewards = episodes.array("reward").reshape(-1, K)
        groups = episodes.array("group")[::K]
        return kernels.sharp_advantages(rewards, groups, episodes.num_problems)

    def evaluate(
        self,
        problems: Sequence[Problem],
        agents: Mapping[str, Agent],
        generator: Generator,
        verifier: Verifier,
        train_generator: Generator | None = None,
    ) -> dict[str, float]:
        """One (greedy, with a greedy generator) team program per held-out problem: pass@1."""
        trajs = self._team(problems, agents, generator, 0, 1)
        full = (1 << len(self.cfg.workers)) - 1
        outcome = self._values(trajs, verifier, [[full]] * len(trajs))[0][:, full]
        return {
            "eval/team/pass_at_1": float((outcome == 1.0).mean()),
            "eval/team/reward": float(outcome.mean()),
        }
