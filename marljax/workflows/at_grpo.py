"""AT-GRPO (Zhao et al. 2025, arXiv 2510.11062): agent- and turn-wise grouped GRPO with tree sampling.

Each problem is played for ``num_turns`` turns. At turn ``t`` every acting
agent samples K candidates from copies of the same state; each candidate is
scored, and the best branch of each agent (highest reward, ties to the lowest
index) continues: the next state is built from the agents' best candidates.
Credit: ``A = (r - mean_g) / (std_g + eps)`` (``grpo``) or ``r - mean_g``
(``dr_grpo``) with group ``g = (problem, turn, agent)``
(:func:`marljax.kernels.at_grpo_advantages`), so a candidate is compared only
with the other K candidates of the same agent at the same turn of the same
problem. Agents act with ``agent.policy``: one shared policy with role
prompts or one policy per role, with no difference here.

Task ``code`` (coder + tester). Turn 0: the coder writes code, the tester
writes ``assert`` tests for the problem. Turn t >= 1: the coder refines the
best code given the public-test feedback (:func:`marljax.rewards.error_feedback`)
and a summary of the tester's best tests run against that code; the tester
refines its tests given the code and how its tests fared on it. Rewards:

* coder: fraction of all the problem's tests passed;
* tester, with ``n`` asserts (at most ``max_asserts``), ``v`` of them passed
  by the reference solution and ``c`` of those ``v`` failed by this turn's
  best code: ``(v + tester_bonus * c) / n`` (0 with no asserts or no
  reference). Valid tests earn 1 each, valid tests that catch a bug in the
  code the coder carries forward earn ``1 + tester_bonus``. The reference is
  ``problem.fields["solution"]``, else a coder candidate of this turn that
  passes all tests.

Task ``plan``: the grid game of :mod:`marljax.workflows.games`, one planner.
A tree ends early once its best branch solves the problem (``stop_when_solved``).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any, Literal, Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from pydantic import Field

from marljax import kernels as K
from marljax.rewards import AssertTest, ExecutionResult, Program, error_feedback, extract_code
from marljax.workflows.base import Agent, Generator, Rollout, WorkflowSettings
from marljax.workflows.games import PlanEnv, TurnResult, best_branch
from marljax.workflows.scoring import map_once, score_texts

TESTER_TASK = ("\n\nDo not solve the problem: write Python `assert` statements that a correct solution "
               "passes and a wrong one fails, in a ```python block.")


class AtGrpoConfig(WorkflowSettings):
    """AT-GRPO: tree sampling over turns, groups keyed by (problem, turn, agent)."""

    kind: Literal["at_grpo"] = "at_grpo"
    task: Literal["code", "plan"] = "code"
    coder: str = Field("coder", description="agent writing code (task code)")
    tester: str | None = Field("tester", description="agent writing assert tests (task code); None: coder alone")
    planner: str | None = Field("planner", description="agent planning moves (task plan)")
    num_candidates: int = Field(4, ge=2, description="K: candidates per agent per turn")
    num_turns: int = Field(2, ge=1)
    estimator: Literal["grpo", "dr_grpo"] = "grpo"
    tester_bonus: float = Field(0.5, ge=0, description="extra reward per valid assert the current code fails")
    max_asserts: int = Field(8, ge=1, description="asserts of a tester answer that are run")
    stop_when_solved: bool = Field(True, description="end a tree once its best branch solves the problem")

    def check_agents(self, agents: Mapping[str, Any]):
        roles = (("coder", self.coder), ("tester", self.tester)) if self.task == "code" else \
            (("planner", self.planner),)
        found = []
        for key, name in roles:
            if name is None and key != "tester":
                found.append(((key,), f"task {self.task!r} needs workflow.{key}", None))
            elif name is not None and name not in agents:
                found.append(((key,), f"unknown agent; known: {', '.join(agents)}", name))
        if self.task == "code" and self.tester == self.coder:
            found.append((("tester",), "coder and tester must be different agents", self.tester))
        return found


def parse_asserts(text: str, limit: int) -> list[str]:
    """Top-level ``assert`` statements of the answer's code (line by line if it does not parse)."""
    code = extract_code(text).code
    try:
        tree = ast.parse(code)
        found = [ast.get_source_segment(code, n) for n in tree.body if isinstance(n, ast.Assert)]
    except (SyntaxError, ValueError):
        found = []
        for line in code.splitlines():
            try:
                if isinstance(ast.parse(line.strip()).body[0], ast.Assert):
                    found.append(line.strip())
            except (SyntaxError, ValueError, IndexError):
                pass
    return [a for a in found if a][:limit]


def _public_feedback(result: ExecutionResult | None) -> str:
    if result is None:
        return ""
    # error_feedback(split="public") reads "failed before the tests ran" when only private tests fail.
    if result.pass_fraction("public") == 1.0 and any(t.split == "public" for t in result.tests):
        return "All public tests passed."
    return "On the public tests: " + error_feedback(result, split="public")


def _assert_summary(asserts: Sequence[str], result: ExecutionResult | None, whose: str, limit: int = 3) -> str:
    """How the tester's asserts fared on the code: the count and the first failing ones."""
    if not asserts or result is None:
        return f"{whose} tests: none."
    ok = [t.passed for t in result.tests] if result.tests else [False] * len(asserts)
    lines = [f"{whose} tests on this code: passed {sum(ok)} of {len(asserts)}."]
    if not result.tests and result.error_type:
        lines.append(f"The code failed before the tests ran: {result.error_type}: {result.error_message}")
    for a, t in [(a, t) for a, t in zip(asserts, result.tests) if not t.passed][:limit]:
        lines.append(f"Failed: {a}" + (f" (got {t.actual})" if t.actual is not None else ""))
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CodeState:
    code: str | None = None  # the coder's best code so far
    result: ExecutionResult | None = None  # that code on the problem's tests
    tests: tuple[str, ...] = ()  # the tester's best asserts so far
    test_result: ExecutionResult | None = None  # those asserts on that code


class CodeEnv:
    """Coder + tester (or coder alone) refining code over turns; rewards in the module doc."""

    def __init__(self, coder: str, tester: str | None, bonus: float, max_asserts: int):
        self.roles = (coder,) if tester is None else (coder, tester)
        self.coder, self.tester, self.bonus, self.max_asserts = coder, tester, bonus, max_asserts

    def start(self, problem: Any) -> CodeState:
        return CodeState()

    def request(self, problem: Any, s: CodeState, role: str, turn: int) -> tuple[str, str, str]:
        """(problem text, feedback, history); feedback and history only from turn 1 on."""
        code = f"```python\n{s.code}\n```"
        if role == self.coder:
            if s.code is None:
                return problem.prompt, "", ""
            fb = _public_feedback(s.result)
            if self.tester is not None:
                fb += "\n\n" + _assert_summary(s.tests, s.test_result, "The tester's")
            return problem.prompt, fb, f"Your previous code:\n{code}"
        if s.code is None:
            return problem.prompt + TESTER_TASK, "", ""
        tests = "```python\n" + "\n".join(s.tests) + "\n```" if s.tests else "(none)"
        return problem.prompt + TESTER_TASK, _assert_summary(s.tests, s.test_result, "Your"), \
            f"The coder's current code:\n{code}\nYour previous tests:\n{tests}"

    def step(self, problems: Sequence[Any], states: Sequence[CodeState], texts: Sequence[dict[str, list[str]]],
             pool: Any) -> list[TurnResult]:
        P, Kc = len(problems), len(texts[0][self.coder])
        codes = [[extract_code(t).code for t in cand[self.coder]] for cand in texts]
        scores = score_texts([p for p in problems for _ in range(Kc)], [t for c in texts for t in c[self.coder]],
                             pool)
        scores = [scores[i * Kc:(i + 1) * Kc] for i in range(P)]
        best = [best_branch([s.reward for s in row]) for row in scores]
        tester = self._score_tests(problems, texts, codes, scores, best, pool) if self.tester else None
        out = []
        for i in range(P):
            b = best[i]
            rewards, passed = {self.coder: [s.reward for s in scores[i]]}, {self.coder: [s.passed for s in scores[i]]}
            chosen, asserts, test_result = {self.coder: b}, (), None
            if tester is not None:
                rewards[self.tester], passed[self.tester], runs = tester[i]
                chosen[self.tester] = best_branch(rewards[self.tester])
                asserts, test_result = runs[chosen[self.tester]]
            state = CodeState(codes[i][b], scores[i][b].result, tuple(asserts), test_result)
            out.append(TurnResult(rewards, passed, chosen, state, scores[i][b].passed))
        return out

    def _score_tests(self, problems, texts, codes, scores, best, pool):
        """Per problem: tester rewards, all-valid flags, and (asserts, run on the best code) per candidate."""
        jobs, plan = [], []  # sandbox programs; per (i, k): (asserts, ref job index, code job index)
        for i, p in enumerate(problems):
            solution = p.fields.get("solution")
            if solution is None:  # fall back on a coder candidate of this turn that passes every test
                solution = next((codes[i][k] for k, s in enumerate(scores[i]) if s.passed), None)
            ref = None if solution is None else p.program(solution)
            cur = p.program(codes[i][best[i]])
            row = []
            for text in texts[i][self.tester]:
                asserts = parse_asserts(text, self.max_asserts)
                tests = tuple(AssertTest(a) for a in asserts)
                r_job = c_job = None
                if asserts and ref is not None:
                    r_job = len(jobs)
                    jobs.append(Program(code=ref.code, tests=tests, setup=ref.setup))
                if asserts:
                    c_job = len(jobs)
                    jobs.append(Program(code=cur.code, tests=tests, setup=cur.setup))
                row.append((asserts, r_job, c_job))
            plan.append(row)
        # candidates often repeat asserts, and the reference can equal the best code: run each once
        results = map_once(pool, jobs)
        out = []
        for row in plan:
            rewards, passed, runs = [], [], []
            for asserts, r_job, c_job in row:
                n = len(asserts)
                valid = _per_test(results[r_job], n) if r_job is not None else np.zeros(n, bool)
                fails = ~_per_test(results[c_job], n) if c_job is not None else np.zeros(n, bool)
                rewards.append(float((valid.sum() + self.bonus * (valid & fails).sum()) / n) if n else 0.0)
                passed.append(bool(n and valid.all()))
                runs.append((asserts, results[c_job] if c_job is not None else None))
            out.append((rewards, passed, runs))
        return out


def _per_test(result: ExecutionResult, n: int) -> np.ndarray:
    """Pass flag per assert (all False when the program failed before its tests ran)."""
    flags = np.array([t.passed for t in result.tests], bool)
    return flags if len(flags) == n else np.zeros(n, bool)


def _turn_seed(seed: int, turn: int) -> int:
    return int(np.random.SeedSequence([seed, turn]).generate_state(1)[0])


class AtGrpoWorkflow:
    def __init__(self, task: str = "code", coder: str = "coder", tester: str | None = "tester",
                 planner: str | None = "planner", num_candidates: int = 4, num_turns: int = 2,
                 estimator: str = "grpo", tester_bonus: float = 0.5, max_asserts: int = 8,
                 stop_when_solved: bool = True):
        if num_candidates < 2 or num_turns < 1:
            raise ValueError(f"need num_candidates >= 2 and num_turns >= 1, got {num_candidates}, {num_turns}")
        if estimator not in ("grpo", "dr_grpo") or task not in ("code", "plan"):
            raise ValueError(f"estimator must be grpo|dr_grpo and task code|plan, got {estimator!r}, {task!r}")
        self.env = PlanEnv(planner) if task == "plan" else CodeEnv(coder, tester, tester_bonus, max_asserts)
        self.task, self.K, self.T, self.estimator = task, num_candidates, num_turns, estimator
        self.stop_when_solved = stop_when_solved

    @classmethod
    def from_config(cls, cfg: Any) -> "AtGrpoWorkflow":
        return cls(cfg.task, cfg.coder, cfg.tester, cfg.planner, cfg.num_candidates, cfg.num_turns,
                   cfg.estimator, cfg.tester_bonus, cfg.max_asserts, cfg.stop_when_solved)

    def play(self, problems: Sequence[Any], agents: Mapping[str, Agent], generator: Generator, pool: Any,
             seed: int, n: int) -> tuple[list[dict], list[TurnResult | None]]:
        """Tree sampling: one record per candidate (ids, generation, reward) and each problem's last turn.

        n candidates per agent per turn; node = (turn * A + agent) * n + k within the problem's tree; parent = the node of the same
        agent's branch chosen at the previous turn (-1 at turn 0); depth = turn.
        """
        roles, A = self.env.roles, len(self.env.roles)
        states = [self.env.start(p) for p in problems]
        last: list[TurnResult | None] = [None] * len(problems)
        chosen: dict[tuple[int, int], int] = {}  # (problem, agent) -> node of the branch that continues
        records = []
        for t in range(self.T):
            active = [i for i, r in enumerate(last) if not (self.stop_when_solved and r is not None and r.solved)]
            if not active:
                break
            requests = [(agents[r], agents[r].render_in_context(*self.env.request(problems[i], states[i], r, t)))
                        for i in active for r in roles]
            gens = generator.generate(requests, n, _turn_seed(seed, t))  # one call: one batch per policy
            texts = [{r: [g.text for g in gens[j * A + a]] for a, r in enumerate(roles)} for j in range(len(active))]
            results = self.env.step([problems[i] for i in active], [states[i] for i in active], texts, pool)
            for j, (i, res) in enumerate(zip(active, results)):
                for a, r in enumerate(roles):
                    for k in range(n):
                        records.append({"i": i, "turn": t, "agent": a, "node": (t * A + a) * n + k,
                                        "parent": chosen.get((i, a), -1), "gen": gens[j * A + a][k],
                                        "reward": res.rewards[r][k], "passed": res.passed[r][k]})
                    chosen[(i, a)] = (t * A + a) * n + res.best[r]
                states[i], last[i] = res.state, res
        return records, last

    def rollout(self, problems: Sequence[Any], agents: dict[str, Agent], generator: Generator,
                pool: Any, seed: int) -> Rollout:
        roles = self.env.roles
        records, last = self.play(problems, agents, generator, pool, seed, self.K)
        rewards = np.array([r["reward"] for r in records], np.float32)
        ids = {key: jnp.asarray([r[key] for r in records], jnp.int32) for key in ("i", "turn", "agent")}
        adv = np.asarray(K.at_grpo_advantages(jnp.asarray(rewards), ids["i"], ids["turn"], ids["agent"],
                                              num_problems=len(problems), num_turns=self.T, num_agents=len(roles),
                                              scale="std" if self.estimator == "grpo" else "none"))
        samples, metrics = [], {}
        for r, a in zip(records, adv):
            agent = agents[roles[r["agent"]]]
            samples.append(r["gen"].sample(agent, r["reward"], float(a), generator.versions.get(agent.policy, 0),
                                           problem=problems[r["i"]].id, episode=r["i"], node=r["node"],
                                           parent=r["parent"], depth=r["turn"], turn=r["turn"]))
        group_best: dict[tuple[int, int, int], float] = {}  # best reward of each (problem, turn, agent)
        for r in records:
            key = (r["i"], r["turn"], r["agent"])
            group_best[key] = max(group_best.get(key, -np.inf), r["reward"])
        for a, name in enumerate(roles):
            mine = np.array([r["agent"] == a for r in records])
            metrics.update({f"agent/{name}/reward": float(rewards[mine].mean()),
                            f"agent/{name}/pass_rate": float(np.mean([r["passed"] for r in records
                                                                      if r["agent"] == a])),
                            f"agent/{name}/adv_mean": float(adv[mine].mean()),
                            f"agent/{name}/adv_std": float(adv[mine].std()),
                            f"agent/{name}/best_reward": float(np.mean([v for k, v in group_best.items()
                                                                        if k[2] == a]))})
        metrics["at_grpo/turns"] = float(np.mean([1 + max(r["turn"] for r in records if r["i"] == i)
                                                  for i in range(len(problems))]))
        metrics["at_grpo/solved"] = float(np.mean([r.solved for r in last]))
        return Rollout(samples, metrics)

    def evaluate(self, problems: Sequence[Any], agents: dict[str, Agent], generator: Generator,
                 pool: Any) -> dict[str, float]:
        """One (greedy, with a greedy generator) candidate per agent per turn; the final state counts:
        pass@1 of the coder's last code (all tests), or the planner's success (goal reached)."""
        _, last = self.play(problems, agents, generator, pool, 0, 1)
        main = self.env.roles[0]
        name = "success" if self.task == "plan" else "pass_at_1"
        return {f"eval/{main}/{name}": float(np.mean([r.solved for r in last])),
                f"eval/{main}/reward": float(np.mean([r.rewards[main][r.best[main]] for r in last]))}
