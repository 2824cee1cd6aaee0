"""The embedded demo's stages: SFT warm start, three RL runs at equal sample budgets, evaluation
(each team's MARS2-T+ search and each policy's pass@1, before and after RL).

Every stage goes through the library's real parts: `Trainer` runs built from
`RunConfig`s, the sandbox for every program, orbax checkpoints per policy and
`Policy.export` for the warm-started Hugging Face checkpoints. Stages that
finished in an earlier invocation are not redone: the warm-started models are
reused, a finished RL run resumes from its last checkpoint, and evaluations it
finished are read back (`<method>/evaluation.json`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from marljax.demo.refine import refine_examples
from marljax.demo.teacher import HABITS, habit_completion
from marljax.rewards import Problem, Verifier
from marljax.train.config import RunConfig, config_from_dict
from marljax.train.files import write_atomically
from marljax.train.loop import Trainer
from marljax.train.metrics import MetricsWriter, task_progress
from marljax.train.sft import run_sft
from marljax.workflows.base import Agent, Generator
from marljax.workflows.mars2 import search_eval

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    sft_steps: int = 200
    sft_batch: int = 32
    sft_lr: float = 1e-2
    refine_examples: int = 256  # broken attempts + feedback -> fix: every 8th SFT batch
    rl_steps: int = 40
    rl_lr: float = 1e-3
    # the Llama's own RL rate: at the Qwen3's it can collapse after a single gradient spike
    llama_rl_lr: float = 5e-4
    mini_batches: int = 1  # optimiser steps per RL update (more made the heterogeneous team collapse)
    problems_per_step: int = 8
    samples_per_problem: int = 8  # GRPO's group size = MARS2's nodes per tree: equal budgets
    # each model's SFT teacher slips at this rate, on its own operation kinds only (teacher.HABITS): high
    # enough that a model mostly has its teacher's habit, low enough that RL can find the fix
    teacher_slips: float = 0.75
    max_steps_per_task: int = 1  # task difficulty: 1..N operations (2 needs far more SFT on a laptop)
    n_train: int = 2000
    n_eval: int = 128
    eval_samples: int = 2  # sampled answers per held-out task for pass@1
    search_nodes: int = 8  # MARS2-T+ nodes per held-out task: as many programs as a training group
    max_new_tokens: int = 40
    reward: str = "pass"  # 1 only when every test passes ("fraction": partial credit)
    seed: int = 0

    @property
    def samples_per_step(self) -> int:
        return self.problems_per_step * self.samples_per_problem


SFT_SEED_OFFSET = 500_000  # SFT tasks: seeds from here; RL tasks from 0, held-out ones from 1,000,000

# method -> (agent -> policy); MARS2 teams search together, GRPO samples groups alone
METHODS = {
    "grpo": {"solver": "qwen3"},
    "mars2_homogeneous": {"alice": "qwen3", "bob": "qwen3"},
    "mars2_heterogeneous": {"alice": "qwen3", "bob": "llama"},
}
LABELS = {
    "grpo": "single-agent GRPO (Qwen3)",
    "mars2_homogeneous": "MARS2, homogeneous (Qwen3 x2)",
    "mars2_heterogeneous": "MARS2, heterogeneous (Qwen3 + Llama)",
}


def run_config(
    name: str,
    run_dir: Path,
    models: dict[str, Path],
    agents: dict[str, str],
    s: DemoConfig,
    *,
    sft: bool = False,
) -> RunConfig:
    used = sorted(set(agents.values()))
    per_policy = s.samples_per_step // len(used)  # each policy updates once per step's worth of its samples
    policies = {
        p: {
            "model": {"path": str(models[p])},
            # the demo's models are drawn at random and taught the raw-text task format: no chat markup
            "chat": "off",
            # SFT decays its rate so that the exported model is not caught mid-oscillation
            "optimizer": (
                {
                    "lr": s.sft_lr,
                    "warmup_steps": 10,
                    "schedule": "cosine",
                    "decay_steps": max(s.sft_steps, 1),
                    "min_lr_ratio": 0.1,
                }
                if sft
                else {"lr": s.llama_rl_lr if p == "llama" else s.rl_lr}
            ),
            # every sample weighs the same: with token-mean, long garbled refinements dominate
            # MARS2's updates
            "loss": {"type": "ppo", "agg_mode": "seq-mean-token-mean"},
            "buffer": {"threshold": per_policy},
            "micro_batch_size": 16,
            "mini_batches": 1 if sft else s.mini_batches,
        }
        for p in used
    }
    if len(agents) == 1:
        workflow = {"kind": "grpo", "group_size": s.samples_per_problem, "reward": s.reward}
    else:  # a team of two models normalises per agent inside each tree: with one group per tree the
        # weaker model's advantages are negative on average and it collapses
        workflow = {
            "kind": "mars2",
            "agents": sorted(agents),
            "max_nodes": s.samples_per_problem,
            "expansions_per_round": s.samples_per_problem // 2,
            "stop_on_solve": False,
            "reward": s.reward,
            "normalization": "tree" if len(used) == 1 else "agent",
        }
    return config_from_dict(
        {
            "name": name,
            "run_dir": str(run_dir),
            "seed": s.seed,
            "policies": policies,
            "agents": {a: {"policy": p} for a, p in agents.items()},
            # SFT sees each of its own tasks once; RL and evaluation use other tasks (seed ranges apart)
            "data": {
                "source": {
                    "kind": "synthetic",
                    "n_train": s.sft_steps * s.sft_batch if sft else s.n_train,
                    "n_eval": s.n_eval,
                    "difficulty": s.max_steps_per_task,
                    "style": "steps",
                    "seed": s.seed + SFT_SEED_OFFSET if sft else s.seed,
                },
                "batch_size": s.sft_batch if sft else s.problems_per_step,
            },
            "sampler": {
                "max_new_tokens": s.max_new_tokens,
                "temperature": 1.0,
                "min_prompt_bucket": 64,
                "min_batch_bucket": 32,
            },
            "workflow": workflow,
            "train": {
                "steps": max(s.rl_steps, 1),
                "save_every": max(s.rl_steps, 1),
                "eval_every": None,
                "log_to": [],
                "keep_checkpoints": 1,
            },
        },
        source=f"<demo {name}>",
    )


def warm_start(out: Path, models: dict[str, Path], s: DemoConfig) -> dict[str, Path]:
    """SFT each base model (named by its family) on its own habit teacher's solutions (plain prompts
    and refinement prompts); returns the exported checkpoints.

    The two teachers slip on disjoint operation kinds (`marljax.demo.teacher.HABITS`), so the two
    families make different errors: with one shared teacher they would make the same ones and the
    heterogeneous team would differ from the homogeneous one only in size, while MARS2's argument for
    heterogeneity is that one model can repair the errors the other makes."""
    exported: dict[str, Path] = {}
    for name, base in models.items():
        dest = out / "models" / f"{name}-sft"
        exported[name] = dest
        if (dest / "config.json").exists():
            continue
        target = functools.partial(habit_completion, kinds=HABITS[name], rate=s.teacher_slips, seed=s.seed)
        cfg = run_config(f"sft_{name}", out / f"sft_{name}", {name: base}, {"solver": name}, s, sft=True)
        trainer = Trainer(cfg)
        try:
            refine = refine_examples(
                trainer.train_problems[: s.refine_examples],
                trainer.agents["solver"],
                trainer.pool,
                seed=s.seed,
                target=target,
            )
            with MetricsWriter(trainer.run_dir, log_to=()) as writer:
                run_sft(
                    trainer, s.sft_steps, writer, desc=f"SFT {name}", extra={"solver": refine}, target=target
                )
            trainer.policies[name].export(dest)
        finally:
            trainer.close()
    return exported


def pass_at_1(
    problems: Sequence[Problem],
    agents: Sequence[Agent],
    generator: Generator,
    verifier: Verifier,
    samples: int,
    seed: int,
    known: dict[str, list[float]] | None = None,
    label: str = "pass@1",
) -> dict[str, list[float]]:
    """Held-out pass@1 per policy, per task: the fraction of `samples` answers at the training
    temperature that pass all tests (the hidden ones included). Policies in `known` are not
    re-measured. A progress line per measured policy, labelled `label`."""
    out = {}
    for policy in sorted({a.policy for a in agents}):
        if known is not None and policy in known:
            out[policy] = known[policy]
            continue
        agent = next(a for a in agents if a.policy == policy)
        with task_progress(f"{label} {policy}", len(problems)) as advance:
            # one sampler call for all tasks (its batch fixes the sampled answers, so no chunks)
            gens = generator.generate([(agent, agent.render(p.prompt)) for p in problems], samples, seed=seed)
            flat = [(p, g) for p, group in zip(problems, gens) for g in group]
            scores = verifier.score([p for p, _ in flat], [g.text for _, g in flat])
            passed = np.reshape([sc.passed for sc in scores], (len(problems), samples))
            advance(len(problems))
        out[policy] = passed.mean(axis=1).tolist()
    return out


def team_search(
    problems: Sequence[Problem],
    agents: Sequence[Agent],
    generator: Generator,
    verifier: Verifier,
    nodes: int,
    seed: int,
    label: str = "team search",
) -> dict[str, float]:
    """`agents` as one team under MARS2-T+ test-time search (`search_eval`, which
    `marljax eval --search` runs): `nodes` nodes per task, 2 expansions per round, failed nodes
    refined with error feedback by the next agent, public tests guide the search and pick the answer,
    private (hidden) tests score it. Sampled at the training temperature: greedy decoding would make
    every fresh node of one agent the same program. A one-agent team searches alone, MARS2's
    single-agent baseline at the same node budget. Progress: the tasks whose tree is done, per round."""
    with task_progress(label, len(problems)) as advance:
        return search_eval(
            problems,
            list(agents),
            generator,
            verifier,
            max_nodes=nodes,
            expansions_per_round=2,
            seed=seed,
            progress=advance,
        )


def evaluate(
    trainer: Trainer, label: str, s: DemoConfig, known: dict[str, list[float]] | None = None
) -> dict[str, Any]:
    """The trainer's team on its held-out tasks: search solve rate and each policy's pass@1, its mean
    (`policies`) and per task (`per_task`, for the standard errors)."""
    problems, agents = trainer.eval_problems, list(trainer.agents.values())
    parts = (problems, agents, trainer.generator, trainer.verifier)
    search = team_search(*parts, s.search_nodes, s.seed, label=f"{label}: team search")
    per_task = pass_at_1(*parts, s.eval_samples, s.seed + 12345, known, label=f"{label}: pass@1")
    policies = {p: float(np.mean(v)) for p, v in per_task.items()}
    return {"search": search, "policies": policies, "per_task": per_task}


def team_score(per_policy: dict[str, float], agents: dict[str, str]) -> float:
    """A team's pass@1: the mean over its agents (an agent scores as its policy)."""
    return float(np.mean([per_policy[p] for p in agents.values()]))


def team_per_task(per_task: dict[str, list[float]], agents: dict[str, str]) -> list[float]:
    """A team's pass@1 per task: the mean over its agents (an agent scores as its policy)."""
    return np.mean([per_task[p] for p in agents.values()], axis=0).tolist()


def train_method(
    out: Path,
    method: str,
    sft_models: dict[str, Path],
    s: DemoConfig,
    warm: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """One RL run with the team's search solve rate and each policy's pass@1 before and after;
    `warm` caches the warm-started models' per-task pass@1 across methods (the same checkpoints and
    sampling seed give the same answers). Every team searches the same held-out tasks with the same seed."""
    agents = METHODS[method]
    trainer = Trainer(run_config(method, out / method, sft_models, agents, s))
    # evaluations an earlier invocation finished: before RL, and after RL at the step it reached
    # (the output directory's settings are this run's, see __main__.same_settings); one saved by a
    # version without per-task pass@1 is redone (the same seeds give the same answers)
    saved = out / method / "evaluation.json"
    done = json.loads(saved.read_text()) if saved.is_file() else {}
    try:
        if "per_task" not in done.get("before", {}):  # before trainer.run() restores the RL checkpoint
            done["before"] = evaluate(trainer, f"{method} before RL", s, warm)
            write_atomically(saved, json.dumps(done, indent=1))
        if warm is not None:
            warm.update(done["before"]["per_task"])
        trainer.run()  # resumes (or skips) from an earlier invocation's checkpoint; closes the sandbox pool,
        after = done.get("after", {})  # which the next use reopens
        if after.get("step") != trainer.step or "per_task" not in after:
            done["after"] = {"step": trainer.step, **evaluate(trainer, f"{method} after RL", s)}
            write_atomically(saved, json.dumps(done, indent=1))
    finally:
        trainer.close()
    before, after = done["before"], done["after"]
    return {
        "method": method,
        "label": LABELS[method],
        "agents": agents,
        # the headline: what the team reaches under MARS2-T+ search (search_eval's metrics)
        "search": {"before": before["search"], "after": after["search"]},
        "policies": {"before": before["policies"], "after": after["policies"]},
        "pass_at_1": {
            "before": team_score(before["policies"], agents),
            "after": team_score(after["policies"], agents),
        },
        # each task's mean over the team's agents: the tasks are the unit of pass@1's standard error
        "pass_at_1_per_task": {
            "before": team_per_task(before["per_task"], agents),
            "after": team_per_task(after["per_task"], agents),
        },
        "samples": s.rl_steps * s.samples_per_step,
    }
