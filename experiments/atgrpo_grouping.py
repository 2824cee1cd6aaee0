"""AT-GRPO grouping at toy scale: (problem, turn, agent) groups vs pooled problems vs one group per problem.

    PYTHONPATH=. python experiments/atgrpo_grouping.py --seeds 0 1 2 [--steps 3 --n-eval 16 --batch 2]

AT-GRPO (arXiv 2510.11062) compares a candidate only with the other candidates of
the same agent at the same turn of the same problem. PettingLLMs' code divides an
already per-problem index by the sample count again, so each of its groups pools
several problems (`grouping: pooled`; it pools `sample_num` problems, here
`pool_size` = 2 = the whole batch of 2 problems); plain GRPO would put a problem's every turn and agent in one group
(`grouping: problem`). A coder and a tester share one warm-started tiny policy
(`experiments/_common.py`) on synthetic tasks, two turns, K = 4 candidates; each
seed trains once per grouping from the same warm start, and reports reward
curves and the held-out pass@1 (greedy, the coder's final code, all tests) before
and after RL.

Writes docs/fidelity/atgrpo_grouping.json and .png.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from marljax import kernels  # noqa: E402
from marljax.train.loop import Trainer  # noqa: E402

GROUPINGS = {
    "problem_turn_agent": {"grouping": "problem_turn_agent"},
    "pooled": {"grouping": "pooled", "pool_size": 2},
    "problem": {"grouping": "problem"},
}
K = 4
CURVES = ("agent/coder/reward", "agent/tester/reward", "at_grpo/solved", "agent/coder/adv_std")


def config(seed: int, grouping: str, steps: int, root: Path, n_eval: int, batch: int):
    return C.run_config(
        f"atgrpo_{grouping}_seed{seed}",
        root / "atgrpo" / f"{grouping}_seed{seed}",
        seed,
        {"path": str(C.warm_start(root=root))},
        {
            "kind": "at_grpo",
            "task": "code",
            "coder": "coder",
            "tester": "tester",
            "num_candidates": K,
            "num_turns": 2,
            **GROUPINGS[grouping],
        },
        steps=steps,
        lr=1e-3,
        threshold=32,
        n_train=256,
        n_eval=n_eval,
        batch_size=batch,
    )


def key_effects(rollout, num_problems: int) -> dict[str, float]:
    """On one rollout: for each other key, the mean |A_key - A_own| and the share of samples whose
    advantage sign flips against the (problem, turn, agent) groups (model-free: kernels only)."""
    problems = {p: k for k, p in enumerate(dict.fromkeys(str(i["problem"]) for i in rollout.ids))}
    cols = [
        jnp.asarray([problems[str(i["problem"])] for i in rollout.ids], jnp.int32),
        jnp.asarray([i["turn"] for i in rollout.ids], jnp.int32),
        jnp.asarray(rollout.agent_ids),
    ]
    kw = dict(num_problems=len(problems), num_turns=2, num_agents=len(rollout.agent_names))
    r = jnp.asarray(rollout.rewards, jnp.float32)
    own = np.asarray(kernels.at_grpo_advantages(r, *cols, **kw))
    out = {"zero_adv_share/problem_turn_agent": float(np.mean(own == 0))}
    for g, opts in GROUPINGS.items():
        if g == "problem_turn_agent":
            continue
        other = np.asarray(
            kernels.at_grpo_advantages(
                r, *cols, key=opts["grouping"], pool_size=opts.get("pool_size", 1), **kw
            )
        )
        out[f"mean_abs_diff/{g}"] = float(np.mean(np.abs(other - own)))
        out[f"sign_flip_share/{g}"] = float(np.mean(np.sign(other) != np.sign(own)))
        out[f"zero_adv_share/{g}"] = float(np.mean(other == 0))
    return out


def run_one(seed: int, grouping: str, steps: int, root: Path, n_eval: int, batch: int) -> dict:
    cfg = config(seed, grouping, steps, root, n_eval, batch)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # an interrupted attempt: start afresh, not resume
    trainer = Trainer(cfg)
    effects, rollout_fn = [], trainer.workflow.rollout

    def recorded(problems, *args, **kwargs):
        rollout = rollout_fn(problems, *args, **kwargs)
        effects.append(key_effects(rollout, len(problems)))
        return rollout

    trainer.workflow.rollout = recorded
    t0 = time.time()
    trainer.run()
    after = trainer.evaluate()
    trainer.close()
    logged = C.read_metrics(trainer.run_dir)
    return {
        "seed": seed,
        "grouping": grouping,
        "after": after,
        "key_effects": effects,
        "curves": [{"step": m["step"], **{k: m[k] for k in CURVES if k in m}} for m in logged],
        "seconds": time.time() - t0,
    }


def before(seed: int, steps: int, root: Path, n_eval: int, batch: int) -> dict:
    """Held-out pass@1 of the warm start (the same for every grouping of a seed)."""
    trainer = Trainer(config(seed, "problem_turn_agent", steps, root, n_eval, batch))
    try:
        return trainer.evaluate()
    finally:
        trainer.close()


def summarise(runs: list[dict], warm: dict[int, dict]) -> dict:
    out = {}
    key = "eval/coder/pass_at_1"
    for g in GROUPINGS:
        mine = [r for r in runs if r["grouping"] == g]
        if not mine:  # --summarise before every grouping ran
            continue
        last = max(1, len(mine[0]["curves"]) // 4)  # the last quarter of the steps
        out[g] = {
            "pass_after": C.interval([r["after"][key] for r in mine]),
            "gain": C.interval([r["after"][key] - warm[r["seed"]][key] for r in mine]),
            **{
                f"{name}_last": C.interval(
                    [np.mean([c[name] for c in r["curves"][-last:] if name in c]) for r in mine]
                )
                for name in CURVES
            },
            "per_seed_pass_after": [r["after"][key] for r in mine],
        }
    out["pass_before"] = C.interval([w[key] for w in warm.values()])
    effects = [e for r in runs for e in r["key_effects"]]  # every rollout of every run
    out["key_effects"] = {k: C.interval([e[k] for e in effects]) for k in effects[0]} if effects else {}
    return out


def plot(runs: list[dict], warm: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for k, name in enumerate(CURVES[:3]):
        ax = axes[k]
        for c, g in enumerate(GROUPINGS):
            mine = [r for r in runs if r["grouping"] == g]
            if not mine:
                continue
            steps = sorted({cv["step"] for r in mine for cv in r["curves"]})
            ys = np.array(
                [
                    [
                        next((cv.get(name, np.nan) for cv in r["curves"] if cv["step"] == s), np.nan)
                        for s in steps
                    ]
                    for r in mine
                ]
            )
            mean = np.nanmean(ys, axis=0)
            ax.plot(steps, mean, color=f"C{c}", label=g)
            ax.fill_between(steps, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0), color=f"C{c}", alpha=0.15)
        ax.set(xlabel="step", ylabel=name, title=f"{name} (mean, min-max over seeds)")
        ax.legend(fontsize=8)
    ax = axes[3]
    key = "eval/coder/pass_at_1"
    for c, g in enumerate(GROUPINGS):
        vals = [r["after"][key] for r in runs if r["grouping"] == g]
        if not vals:
            continue
        ax.scatter([c] * len(vals), vals, color=f"C{c}")
        ax.errorbar(
            [c],
            [np.mean(vals)],
            yerr=[[np.mean(vals) - min(vals)], [max(vals) - np.mean(vals)]],
            color="k",
            capsize=4,
        )
    ax.axhline(np.mean([w[key] for w in warm.values()]), color="k", ls=":", label="warm start (mean)")
    ax.set_xticks(range(len(GROUPINGS)), list(GROUPINGS), fontsize=8)
    ax.set(ylabel="held-out pass@1 after RL", title="final pass rate per seed")
    ax.legend(fontsize=8)
    C.save_figure(fig, path)


def main(argv=None) -> None:
    ap = C.arguments(__doc__, steps=3, batch_help="problems per step")
    ap.add_argument("--n-eval", type=int, default=16)
    args = ap.parse_args(argv)
    C.quiet()
    runs, warm = [], {}
    tag = f"s{args.steps}_e{args.n_eval}_b{args.batch}"
    for seed in args.seeds:
        done = args.root / "atgrpo" / f"before_seed{seed}_{tag}.json"
        if args.summarise and not done.exists():
            continue
        warm[seed] = C.cached_run(done, before, seed, args.steps, args.root, args.n_eval, args.batch)
        for g in GROUPINGS:
            done = args.root / "atgrpo" / f"{g}_seed{seed}_{tag}.json"
            if args.summarise and not done.exists():
                continue
            runs.append(C.cached_run(done, run_one, seed, g, args.steps, args.root, args.n_eval, args.batch))
            print(f"seed {seed} {g}: {runs[-1]['seconds']:.0f} s, {runs[-1]['after']}", flush=True)
    warm = {s: w for s, w in warm.items() if any(r["seed"] == s for r in runs)}
    summary = summarise(runs, warm)
    settings = {
        "seeds": sorted(warm),
        "steps": args.steps,
        "n_eval": args.n_eval,
        "batch": args.batch,
        "K": K,
        "sft": C.SFT,
    }
    C.write_json(
        args.out / "atgrpo_grouping.json",
        {"settings": settings, "summary": summary, "warm": warm, "runs": runs},
    )
    plot(runs, warm, args.out / "atgrpo_grouping.png")
    print(f"warm start pass@1 {summary['pass_before']['mean']:.3f}")
    for g in GROUPINGS:
        if g not in summary:
            continue
        s = summary[g]
        print(
            f"{g}: pass@1 after {s['pass_after']['mean']:.3f} "
            f"[{s['pass_after']['lo']:.3f}, {s['pass_after']['hi']:.3f}], "
            f"gain {s['gain']['mean']:+.3f}; coder reward (last quarter) {s['agent/coder/reward_last']['mean']:.3f}, "
            f"tester {s['agent/tester/reward_last']['mean']:.3f}"
        )


if __name__ == "__main__":
    main()
