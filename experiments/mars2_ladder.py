"""MARS2 ladder at toy scale: single-agent GRPO vs a homogeneous vs a heterogeneous team, judged by search.

    PYTHONPATH=. python experiments/mars2_ladder.py --seeds 0 1 2 [--steps 20 --batch 8]

MARS2 (arXiv 2602.07848) claims single agent < homogeneous team < heterogeneous
team, because models of different families make different errors and one can
repair the other's. Here the heterogeneity is made real at toy scale: the
embedded demo's two tiny models of different families (a 4-layer Qwen3 and a
3-layer Llama, `marljax.demo.models`, one tokenizer) are warm-started by SFT
on two teachers with *disjoint* habits (`HABITS`): each writes the reference
program of a synthetic "steps" task but, in `SLIP_RATE` of the lines of *its
own* four operation kinds, makes the demo teacher's classic slip for that kind
(`marljax.demo.teacher.SLIPS`); lines of the other teacher's kinds are always
right. So the Qwen3 learns to slip on floor division, subtraction, `max` and
squaring, the Llama on `min`, multiplication, modulo and `abs`; the script
checks that the warm starts' errors really differ (pass rate per kind, slips
seen in their greedy programs, overlap of failed tasks).

Three settings at equal sample budgets (the demo's `METHODS` and run configs,
`marljax.demo.pipeline.run_config`: 8 problems x 8 samples per step): GRPO on the
Qwen3 alone, MARS2 with two agents on the Qwen3, MARS2 with the Qwen3 and the
Llama. Before and after RL, on `N_EVAL` held-out tasks (one fixed set for every
seed and setting):

* (i) each policy's greedy pass@1 (all tests);
* (ii) the team's MARS2-T+ solve rate: `marljax.workflows.mars2.search_eval`
  (the search `marljax eval --search` runs), `NODES` nodes per task, public
  tests guide the search and pick the answer, hidden tests score it; sampled at
  the training temperature (1), because greedy decoding makes every fresh node
  of one agent the same program;
* (iii) pass@k of `K` samples per task (a team splits them evenly over its
  agents) and their diversity (`marljax.workflows.diversity`: distinct
  programs and AST-shape buckets per task).

The seeds vary RL (sampling, task order, search draws); one warm start per
family serves every seed. Writes docs/fidelity/mars2_ladder.json and .png.
"""

from __future__ import annotations

import functools
import random
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from marljax.demo.models import ensure_models, steps_problems  # noqa: E402
from marljax.demo.pipeline import METHODS, DemoConfig, run_config  # noqa: E402
from marljax.demo.refine import refine_examples  # noqa: E402
from marljax.demo.teacher import SLIPS, slip  # noqa: E402
from marljax.rewards import SandboxPool, extract_code  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402
from marljax.train.metrics import MetricsWriter  # noqa: E402
from marljax.train.sft import reference_completion, run_sft  # noqa: E402
from marljax.workflows.diversity import grouped_diversity  # noqa: E402
from marljax.workflows.mars2 import search_eval  # noqa: E402

# the operation kind of each of the demo teacher's slips, in `SLIPS` order
KINDS = ("floordiv", "sub", "max", "min", "mul", "mod", "square", "abs")
# each family's teacher slips only on its own kinds: two each of arithmetic and comparison-like,
# so neither habit set is easier to notice from the tests
HABITS = {"qwen3": ("floordiv", "sub", "max", "square"), "llama": ("min", "mul", "mod", "abs")}
SLIP_RATE = (
    0.75  # high enough that a model mostly has its teacher's habit, low enough that RL can find the fix
)
WARM_SEED = 0
EVAL_SEED = (
    2_000_000  # held-out tasks (train 0.., SFT 500,000.., the demo's eval 1,000,000.., tokenizer 10M..)
)
N_EVAL = 128
K = 8  # samples per task for pass@k, and the search's node budget: equal generations
NODES = K


def line_kind(line: str) -> str | None:
    """The operation kind of a program line that admits a slip (the first matching pattern, as `slip`)."""
    return next((KINDS[i] for i, (pattern, _) in enumerate(SLIPS) if re.search(pattern, line)), None)


def habit_completion(problem: Any, kinds: tuple[str, ...], rate: float, seed: int = WARM_SEED) -> str | None:
    """A teacher with habits: the reference answer with `slip` applied at `rate` to lines of `kinds` only."""
    answer = reference_completion(problem)
    if answer is None:
        return None
    rng = random.Random(f"ladder-teacher:{seed}:{'+'.join(kinds)}:{problem.id}")
    return "\n".join(slip(s, rng, rate) if line_kind(s) in kinds else s for s in answer.split("\n"))


def slipped_kinds(code: str, reference: str) -> list[str]:
    """Kinds whose reference line appears in `code` in its slipped form (the teacher's habit)."""
    out = []
    for line in reference.splitlines():
        kind = line_kind(line)
        if kind is not None:
            pattern, wrong = SLIPS[KINDS.index(kind)]
            if re.sub(pattern, wrong, line).strip() in {s.strip() for s in code.splitlines()}:
                out.append(kind)
    return out


def settings(seed: int, steps: int, batch: int) -> DemoConfig:
    return DemoConfig(seed=seed, rl_steps=steps, problems_per_step=batch)


def warm_start(root: Path) -> dict[str, Path]:
    """Each family SFT'd on its own habit teacher (plain and refinement prompts), exported once."""
    s = settings(WARM_SEED, 1, 8)
    with SandboxPool(max_workers=1) as pool:
        bases = ensure_models(root / "models", pool, seed=WARM_SEED)
    out = {}
    for name, base in bases.items():
        dest = out[name] = root / "models" / f"{name}-sft"
        if (dest / "config.json").exists():
            continue
        target = functools.partial(habit_completion, kinds=HABITS[name], rate=SLIP_RATE)
        trainer = Trainer(
            run_config(f"sft_{name}", root / f"sft_{name}", {name: base}, {"solver": name}, s, sft=True)
        )
        try:
            refine = refine_examples(
                trainer.train_problems[: s.refine_examples],
                trainer.agents["solver"],
                trainer.pool,
                WARM_SEED,
                target,
            )
            with MetricsWriter(trainer.run_dir, tensorboard=False) as writer:
                run_sft(
                    trainer, s.sft_steps, writer, desc=f"SFT {name}", extra={"solver": refine}, target=target
                )
            trainer.policies[name].export(dest)
        finally:
            trainer.close()
    return out


def measure(trainer: Trainer, problems: list, seed: int) -> dict:
    """(i)-(iii) of the module doc for the trainer's agents as one team, at its current parameters."""
    agents = list(trainer.agents.values())
    by_policy = {p: next(a for a in agents if a.policy == p) for p in sorted({a.policy for a in agents})}
    out: dict[str, Any] = {"policies": {}}
    for policy, agent in by_policy.items():
        gens = trainer.eval_generator.generate([(agent, agent.render(p.prompt)) for p in problems], 1, 0)
        codes = [g[0].text for g in gens]
        scores = trainer.verifier.score(problems, codes)
        out["policies"][policy] = {
            "greedy_passed": [bool(s.passed) for s in scores],
            "slipped": [
                slipped_kinds(extract_code(c).code, p.fields["solution"]) for c, p in zip(codes, problems)
            ],
        }
    # pass@k and diversity: K samples per task, split evenly over the team's agents
    per = K // len(agents)
    gens = trainer.generator.generate(
        [(a, a.render(p.prompt)) for a in agents for p in problems], per, C.SFT_SEED_OFFSET + seed
    )
    texts = [
        [g.text for j in range(len(agents)) for g in gens[j * len(problems) + i]]
        for i in range(len(problems))
    ]
    passed = trainer.verifier.score(
        [p for p, t in zip(problems, texts) for _ in t], [x for t in texts for x in t]
    )
    passed = np.array([s.passed for s in passed]).reshape(len(problems), -1)
    out["pass_at_k"] = float(passed.any(axis=1).mean())
    out["sample_pass_rate"] = float(passed.mean())
    out.update(grouped_diversity([[extract_code(x).code or x for x in t] for t in texts], "diversity"))
    out["search"] = search_eval(
        problems,
        agents,
        trainer.generator,
        trainer.verifier,
        max_nodes=NODES,
        expansions_per_round=2,
        seed=seed,
    )
    return out


def run_one(seed: int, method: str, steps: int, root: Path, batch: int, models: dict[str, Path]) -> dict:
    s = settings(seed, steps, batch)
    cfg = run_config(method, root / "ladder" / f"{method}_seed{seed}", models, METHODS[method], s)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # an interrupted attempt: start afresh, not resume
    problems = steps_problems(N_EVAL, EVAL_SEED, s.max_steps_per_task)
    trainer = Trainer(cfg)
    try:
        t0 = time.time()
        before = measure(trainer, problems, seed)
        t1 = time.time()
        trainer.run()
        t2 = time.time()
        after = measure(trainer, problems, seed)
    finally:
        trainer.close()
    curve = [
        float(np.mean([v for k, v in m.items() if k.startswith("agent/") and k.endswith("/reward")]))
        for m in C.read_metrics(trainer.run_dir)
        if any(k.startswith("agent/") and k.endswith("/reward") for k in m)
    ]
    return {
        "seed": seed,
        "method": method,
        "agents": METHODS[method],
        "before": before,
        "after": after,
        "reward_curve": curve,
        "samples": s.rl_steps * s.samples_per_step,
        "seconds": {"measure": t1 - t0, "rl": t2 - t1, "total": time.time() - t0},
    }


def main(argv=None) -> None:
    ap = C.arguments(__doc__, steps=20, batch_help="problems per RL step (8 samples each)")
    ap.set_defaults(batch=8)
    args = ap.parse_args(argv)
    C.quiet()
    t0 = time.time()
    models = warm_start(args.root)
    print(f"warm start: {time.time() - t0:.0f} s", flush=True)
    runs = []
    for seed in args.seeds:
        for method in METHODS:
            done = args.root / "ladder" / f"{method}_seed{seed}_s{args.steps}_b{args.batch}.json"
            if args.summarise and not done.exists():
                continue
            runs.append(C.cached_run(done, run_one, seed, method, args.steps, args.root, args.batch, models))
            print(f"seed {seed} {method}: {runs[-1]['seconds']}", flush=True)


if __name__ == "__main__":
    main()
