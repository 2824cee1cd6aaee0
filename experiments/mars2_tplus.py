"""MARS2-T+ ablations at toy scale: error feedback and depth guidance in test-time search, at a fixed node budget.

    PYTHONPATH=. python experiments/mars2_tplus.py --seeds 0 1 2 3 4 [--steps 24 --batch 8]

MARS2-T+ (arXiv 2602.07848) refines failed nodes with structured error feedback
(failing input, expected and actual output, or the traceback) and weights each
expansion by depth guidance ``gamma(d) ** c_d``. Here both are switched off in
turn in `marljax.workflows.mars2.search_eval` (`use_feedback=False`;
``depth_gamma=[1.0]``, i.e. weight 1 at every depth), at `NODES` nodes per task,
on the MARS2 ladder's teams (`experiments/mars2_ladder.py`, which must have run
with the same ``--steps``/``--batch``): the homogeneous (Qwen3 x2) and the
heterogeneous (Qwen3 + Llama) team, warm-started and after RL, each seed's
trained checkpoint, on the ladder's held-out tasks. The three variants of one
team and seed use the same search seed, so their differences are paired.

Writes docs/fidelity/mars2_tplus.json and .png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import mars2_ladder as L  # noqa: E402

from marljax.demo.models import steps_problems  # noqa: E402
from marljax.demo.pipeline import METHODS, run_config  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402
from marljax.workflows.mars2 import search_eval  # noqa: E402

NODES = 16  # twice the ladder's budget: room for refinements to go deep enough for guidance to act
VARIANTS = {
    "full": {},
    "no_feedback": {"use_feedback": False},
    "no_depth_guidance": {"depth_gamma": [1.0]},
}
TEAMS = ("mars2_homogeneous", "mars2_heterogeneous")


def run_one(seed: int, method: str, steps: int, root: Path, batch: int, models: dict[str, Path]) -> dict:
    """Every variant's search for the warm-started and the trained team of one ladder run."""
    s = L.settings(seed, steps, batch)
    cfg = run_config(method, root / "ladder" / f"{method}_seed{seed}", models, METHODS[method], s)
    problems = steps_problems(L.N_EVAL, L.EVAL_SEED, s.max_steps_per_task)
    out, t0 = {"seed": seed, "method": method}, time.time()
    trainer = Trainer(cfg)
    try:
        for phase in ("before", "after"):
            if phase == "after" and (not trainer.restore() or trainer.step != steps):
                raise SystemExit(f"{cfg.run_dir}: no checkpoint at step {steps}; run mars2_ladder.py first")
            agents = list(trainer.agents.values())
            out[phase] = {
                v: search_eval(
                    problems,
                    agents,
                    trainer.generator,
                    trainer.verifier,
                    max_nodes=NODES,
                    expansions_per_round=2,
                    seed=seed,
                    **opts,
                )
                for v, opts in VARIANTS.items()
            }
    finally:
        trainer.close()
        L.release_programs()
    out["seconds"] = time.time() - t0
    return out


def summarise(runs: list[dict]) -> dict:
    """Per team and phase: each variant's solve rate and depth, and its paired difference from the full
    search, as 95% t intervals over seeds."""
    out: dict = {}
    for method in TEAMS:
        mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        if not mine:
            continue
        for phase in ("before", "after"):
            res = {}
            for v in VARIANTS:
                solved = [r[phase][v]["eval/search/pass_at_1"] for r in mine]
                full = [r[phase]["full"]["eval/search/pass_at_1"] for r in mine]
                res[v] = {
                    "pass_at_1": C.interval(solved),
                    "oracle": C.interval([r[phase][v]["eval/search/oracle"] for r in mine]),
                    "nodes": C.interval([r[phase][v]["eval/search/nodes"] for r in mine]),
                    "minus_full": C.interval(list(np.subtract(solved, full))),
                    "per_seed": solved,
                }
            out[f"{method}/{phase}"] = res
    return out


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    groups = list(summary)
    x = np.arange(len(groups))
    for k, v in enumerate(VARIANTS):
        rows = [summary[g][v]["pass_at_1"] for g in groups]
        mean = np.array([r["mean"] for r in rows])
        err = np.array([[r["mean"] - r["lo"], r["hi"] - r["mean"]] for r in rows]).T
        ax.bar(x + (k - 1) * 0.27, mean, 0.27, yerr=err, capsize=3, label=v.replace("_", " "))
    ax.set_xticks(x, [g.replace("mars2_", "").replace("/", "\n") for g in groups], fontsize=8)
    ax.set(ylabel="held-out tasks solved (hidden tests)", title=f"MARS2-T+ at {NODES} nodes per task")
    ax.legend(fontsize=8)
    C.save_figure(fig, path)


def main(argv=None) -> None:
    ap = C.arguments(__doc__, steps=24, batch_help="the ladder's problems per RL step")
    ap.set_defaults(batch=8)
    args = ap.parse_args(argv)
    C.quiet()
    jax.config.update("jax_compilation_cache_dir", str((args.root / "xla_cache").resolve()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    models = None if args.summarise else L.warm_start(args.root)  # --summarise trains nothing
    runs = []
    for seed in args.seeds:
        for method in TEAMS:
            done = args.root / "tplus" / f"{method}_seed{seed}_s{args.steps}_b{args.batch}.json"
            if args.summarise and not done.exists():
                continue
            runs.append(C.cached_run(done, run_one, seed, method, args.steps, args.root, args.batch, models))
            print(f"seed {seed} {method}: {runs[-1]['seconds']:.0f} s", flush=True)
    summary = summarise(runs)
    settings = {"seeds": sorted({r["seed"] for r in runs}), "steps": args.steps, "batch": args.batch}
    settings.update(nodes=NODES, n_eval=L.N_EVAL, variants=VARIANTS)
    C.write_json(args.out / "mars2_tplus.json", {"settings": settings, "summary": summary, "runs": runs})
    plot(summary, args.out / "mars2_tplus.png")
    for group, res in summary.items():
        for v, r in res.items():
            p, d = r["pass_at_1"], r["minus_full"]
            print(
                f"{group} {v}: {p['mean']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}], "
                f"minus full {d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}], nodes {r['nodes']['mean']:.1f}"
            )


if __name__ == "__main__":
    main()
