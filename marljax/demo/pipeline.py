"""The embedded demo's stages: SFT warm start, three RL runs at equal sample budgets, evaluation.

Every stage goes through the library's real parts: `Trainer` runs built from
`RunConfig`s, the sandbox for every program, orbax checkpoints per policy and
`Policy.export` for the warm-started Hugging Face checkpoints. Stages that
finished in an earlier invocation are not redone: the warm-started models are
reused and a finished RL run resumes from its last checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np

from marljax.demo.refine import refine_examples
from marljax.demo.teacher import teacher_completion
from marljax.train.config import RunConfig, config_from_dict
from marljax.train.loop import Trainer
from marljax.train.metrics import MetricsWriter
from marljax.train.sft import run_sft

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
    teacher_slips: float = 0.5  # rate of the SFT teacher's classic slips (marljax.demo.teacher)
    max_steps_per_task: int = 1  # task difficulty: 1..N operations (2 needs far more SFT on a laptop)
    n_train: int = 2000
    n_eval: int = 128
    eval_samples: int = 2  # sampled answers per held-out task for pass@1
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
                "synthetic": {
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
                "tensorboard": False,
                "keep_checkpoints": 1,
            },
        },
        source=f"<demo {name}>",
    )


def warm_start(
    out: Path, models: dict[str, Path], s: DemoConfig, targets: dict[str, Any] | None = None
) -> dict[str, Path]:
    """SFT each base model on a teacher's solutions (plain prompts and refinement prompts); returns
    the exported checkpoints. `targets`: a model's own teacher (a `reference_completion`-like
    function) where given; the others learn from the demo's sloppy teacher. Models of one teacher
    share its broken attempts for the refinement prompts."""
    exported: dict[str, Path] = {}
    refine: dict[Any, list] = {}  # teacher -> its refinement examples
    sloppy = functools.partial(teacher_completion, rate=s.teacher_slips, seed=s.seed)
    for name, base in models.items():
        dest = out / "models" / f"{name}-sft"
        exported[name] = dest
        if (dest / "config.json").exists():
            continue
        target = (targets or {}).get(name, sloppy)
        cfg = run_config(f"sft_{name}", out / f"sft_{name}", {name: base}, {"solver": name}, s, sft=True)
        trainer = Trainer(cfg)
        try:
            if target not in refine:
                refine[target] = refine_examples(
                    trainer.train_problems[: s.refine_examples],
                    trainer.agents["solver"],
                    trainer.pool,
                    seed=s.seed,
                    target=target,
                )
            with MetricsWriter(trainer.run_dir, tensorboard=False) as writer:
                run_sft(
                    trainer,
                    s.sft_steps,
                    writer,
                    desc=f"SFT {name}",
                    extra={"solver": refine[target]},
                    target=target,
                )
            trainer.policies[name].export(dest)
        finally:
            trainer.close()
    return exported


def pass_at_1(trainer: Trainer, s: DemoConfig, known: dict[str, float] | None = None) -> dict[str, float]:
    """Held-out pass@1 per policy: `eval_samples` answers per task at the training temperature,
    scored on all tests (the hidden ones included). Policies in `known` are not re-measured."""
    problems, out = trainer.eval_problems, {}
    for policy in sorted({a.policy for a in trainer.agents.values()}):
        if known is not None and policy in known:
            out[policy] = known[policy]
            continue
        agent = next(a for a in trainer.agents.values() if a.policy == policy)
        gens = trainer.generator.generate(
            [(agent, agent.render(p.prompt)) for p in problems], s.eval_samples, seed=s.seed + 12345
        )
        flat = [(p, g) for p, group in zip(problems, gens) for g in group]
        scores = trainer.verifier.score([p for p, _ in flat], [g.text for _, g in flat])
        out[policy] = float(np.mean([sc.passed for sc in scores]))
    return out


def team_score(per_policy: dict[str, float], agents: dict[str, str]) -> float:
    """A team's pass@1: the mean over its agents (an agent scores as its policy)."""
    return float(np.mean([per_policy[p] for p in agents.values()]))


def train_method(
    out: Path, method: str, sft_models: dict[str, Path], s: DemoConfig, warm: dict[str, float] | None = None
) -> dict[str, Any]:
    """One RL run with pass@1 before and after; `warm` caches the warm-started models' pass@1
    across methods (the same checkpoints and sampling seed give the same answers)."""
    agents = METHODS[method]
    trainer = Trainer(run_config(method, out / method, sft_models, agents, s))
    try:
        before = pass_at_1(trainer, s, warm)
        if warm is not None:
            warm.update(before)
        trainer.run()  # resumes (or skips) from an earlier invocation's checkpoint; closes the sandbox pool,
        after = pass_at_1(trainer, s)  # which the next use reopens
    finally:
        trainer.close()
    return {
        "method": method,
        "label": LABELS[method],
        "agents": agents,
        "policies": {"before": before, "after": after},
        "before": team_score(before, agents),
        "after": team_score(after, agents),
        "samples": s.rl_steps * s.samples_per_step,
    }
