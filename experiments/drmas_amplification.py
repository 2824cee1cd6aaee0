"""Dr. MAS Lemma 4.2 at toy scale: global vs agent-wise advantage normalisation on a solver + verifier team.

    PYTHONPATH=. python experiments/drmas_amplification.py --seeds 0 1 2 [--steps 4 --batch 2]

Dr. MAS (arXiv 2602.08847, Lemma 4.2): normalising all agents' rewards with one
mean and std scales agent k's gradient second moment by
``(sigma_k^2 + (mu_k - mu)^2) / sigma^2`` against agent-wise normalisation; with
agents whose rewards differ this shows as gradient-norm spikes. Here a solver and
a verifier share one warm-started tiny policy (`experiments/_common.py`); the
solver's reward is the fraction of tests its final program passes, the
verifier's whether its verdict was right, so their reward means and variances
differ. Each seed trains twice (`normalization: global` and `agent`) with
`train.agent_grad_norms` on. At every step, on that step's rollout and at the
parameters the update starts from, the script also computes each agent's
gradient under *both* normalisations (the same samples, advantages recomputed),
so the second-moment ratio is measured on paired batches:

* predicted: the amplification factor per problem group (review finding B3),
  averaged over steps;
* measured: mean ||g_k(global)||^2 / mean ||g_k(agent)||^2 over steps (paired), and
  the ratio of the advantages' second moments (what the Lemma scales), over all of
  the agent's samples and over those the factor counts (problem groups where the
  agent's own rewards vary);
* spikes: per-update agent gradient norms logged by the trainer in each run,
  counted above 3x the median of the agent-wise runs' norms.

Writes docs/fidelity/drmas_amplification.json and .png.
"""

from __future__ import annotations

import dataclasses
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

AGENTS = ("solver", "verifier")
SPIKE_FACTOR = 3.0


def both_advantages(rollout) -> dict[str, np.ndarray]:
    """The rollout's advantages under agent-wise and global normalisation, per problem, as the
    workflow computes them."""
    _, problems = np.unique([str(i["problem"]) for i in rollout.ids], return_inverse=True)
    P = int(problems.max()) + 1
    r = jnp.asarray(rollout.rewards, jnp.float32)
    g = jnp.asarray(problems, jnp.int32)
    agent, _ = kernels.dr_mas_advantages(
        r, jnp.asarray(rollout.agent_ids), len(rollout.agent_names), group_ids=g, num_groups=P
    )
    return {
        "agent": np.asarray(agent),
        "global": np.asarray(kernels.group_advantages(r, g, P)),
        "groups": problems,
    }


class Recorder:
    """Wraps the workflow's rollout: after each rollout (before the update), the paired measurements."""

    def __init__(self, trainer: Trainer):
        self.trainer, self.rows = trainer, []
        self.rollout = trainer.workflow.rollout
        trainer.workflow.rollout = self

    def __call__(self, *args, **kwargs):
        rollout = self.rollout(*args, **kwargs)
        policy = self.trainer.policies["shared"]
        adv = both_advantages(rollout)
        names = list(rollout.agent_names)
        factor = kernels.amplification_factor(
            jnp.asarray(rollout.rewards, jnp.float32),
            jnp.asarray(rollout.agent_ids),
            len(names),
            group_ids=jnp.asarray(adv["groups"], jnp.int32),
            num_groups=int(adv["groups"].max()) + 1,
        )
        row = {"step": self.trainer.step + 1}
        for mode in ("agent", "global"):
            rows = dataclasses.replace(rollout.rows, advantage=np.asarray(adv[mode], np.float32))
            for a, norm in policy.learner.agent_grad_norms(policy.state, rows, AGENTS).items():
                row[f"{a}/grad_norm_{mode}"] = norm
        for k, a in enumerate(names):
            mine = rollout.agent_ids == k
            row[f"{a}/predicted"] = float(factor[k])
            row[f"{a}/adv_m2_agent"] = float(np.mean(adv["agent"][mine] ** 2))
            row[f"{a}/adv_m2_global"] = float(np.mean(adv["global"][mine] ** 2))
            row[f"{a}/reward_mean"] = float(rollout.rewards[mine].mean())
            row[f"{a}/reward_std"] = float(rollout.rewards[mine].std())
            row[f"{a}/count"] = int(mine.sum())
            # samples whose problem's rewards vary while this agent's own do not: agent-wise
            # normalisation gives them 0 and global does not, a case the factor leaves out
            flat = np.array(
                [np.ptp(rollout.rewards[mine & (adv["groups"] == g)]) == 0 for g in adv["groups"][mine]]
            )
            varies = np.array([np.ptp(rollout.rewards[adv["groups"] == g]) > 0 for g in adv["groups"][mine]])
            row[f"{a}/flat_in_varying_group"] = float(np.mean(flat & varies))
            # the samples the factor counts: the Lemma's comparison on them alone
            counted = np.flatnonzero(mine)[~flat]
            row[f"{a}/counted"] = int(counted.size)
            for mode in ("agent", "global"):
                row[f"{a}/adv_m2_{mode}_counted"] = (
                    float(np.mean(adv[mode][counted] ** 2)) if counted.size else 0.0
                )
        self.rows.append(row)
        return rollout


def run_one(seed: int, normalization: str, steps: int, root: Path, batch: int) -> dict:
    model = C.warm_start(root=root)
    cfg = C.run_config(
        f"drmas_{normalization}_seed{seed}",
        root / "drmas" / f"{normalization}_seed{seed}",
        seed,
        {"path": str(model)},
        {
            "kind": "dr_mas",
            "solver": "solver",
            "verifier": "verifier",
            "max_loops": 2,
            "group_size": 4,
            "normalization": normalization,
        },
        steps=steps,
        lr=1e-3,
        threshold=16,
        n_train=256,
        n_eval=1,
        batch_size=batch,
        train={"agent_grad_norms": True},
    )
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # an interrupted attempt: start afresh, not resume
    trainer = Trainer(cfg)
    recorder = Recorder(trainer)
    t0 = time.time()
    trainer.run()
    logged = C.read_metrics(trainer.run_dir)
    return {
        "seed": seed,
        "normalization": normalization,
        "paired": recorder.rows,
        "updates": [
            {
                "step": m["step"],
                **{
                    f"{a}/grad_norm": m[f"agent/{a}/grad_norm"] for a in AGENTS if f"agent/{a}/grad_norm" in m
                },
                "policy_grad_norm": m.get("policy/shared/grad_norm"),
            }
            for m in logged
            if any(f"agent/{a}/grad_norm" in m for a in AGENTS)
        ],
        "curves": [
            {
                "step": m["step"],
                **{
                    k: m[k]
                    for k in ("team/reward", "team/pass_rate", "agent/solver/reward", "agent/verifier/reward")
                    if k in m
                },
            }
            for m in logged
        ],
        "seconds": time.time() - t0,
    }


def summarise(runs: list[dict]) -> dict:
    """Per agent: predicted vs measured second-moment ratios (per seed, pooled over both runs'
    steps) and the spike statistics per normalisation."""
    seeds = sorted({r["seed"] for r in runs})
    out: dict = {"agents": {}, "spike_threshold": None}
    norms_agentwise = [
        u[f"{a}/grad_norm"]
        for r in runs
        if r["normalization"] == "agent"
        for u in r["updates"]
        for a in AGENTS
        if u.get(f"{a}/grad_norm", 0) > 0
    ]
    threshold = SPIKE_FACTOR * float(np.median(norms_agentwise)) if norms_agentwise else 0.0
    out["spike_threshold"] = threshold
    for a in AGENTS:
        per_seed = {
            k: []
            for k in (
                "predicted",
                "measured_grad",
                "measured_adv",
                "measured_adv_counted",
                "flat_in_varying_group",
                "reward_mean",
                "reward_std",
            )
        }
        for seed in seeds:
            rows = [
                row for r in runs if r["seed"] == seed for row in r["paired"] if f"{a}/grad_norm_agent" in row
            ]
            g_glob = np.array([row[f"{a}/grad_norm_global"] for row in rows])
            g_agent = np.array([row[f"{a}/grad_norm_agent"] for row in rows])
            m2_agent = np.mean([row[f"{a}/adv_m2_agent"] for row in rows])
            per_seed["measured_grad"].append(float(np.mean(g_glob**2) / max(np.mean(g_agent**2), 1e-30)))
            per_seed["measured_adv"].append(
                float(np.mean([row[f"{a}/adv_m2_global"] for row in rows]) / max(m2_agent, 1e-30))
            )
            # pooled over the steps' counted samples (a step with none adds nothing)
            w = np.array([row[f"{a}/counted"] for row in rows])
            m2 = {
                mode: np.sum(w * np.array([row[f"{a}/adv_m2_{mode}_counted"] for row in rows]))
                for mode in ("agent", "global")
            }
            per_seed["measured_adv_counted"].append(float(m2["global"] / max(m2["agent"], 1e-30)))
            # each step's factor is a mean over its counted samples: pool the steps the same way
            f = np.array([row[f"{a}/predicted"] for row in rows])
            per_seed["predicted"].append(float(np.sum(w * f) / max(w.sum(), 1)))
            per_seed["flat_in_varying_group"].append(
                float(np.mean([row[f"{a}/flat_in_varying_group"] for row in rows]))
            )
            per_seed["reward_mean"].append(float(np.mean([row[f"{a}/reward_mean"] for row in rows])))
            per_seed["reward_std"].append(float(np.mean([row[f"{a}/reward_std"] for row in rows])))
        spikes = {}
        for mode in ("global", "agent"):
            counts, peaks, medians = [], [], []
            for seed in seeds:
                vals = [
                    u[f"{a}/grad_norm"]
                    for r in runs
                    if r["seed"] == seed and r["normalization"] == mode
                    for u in r["updates"]
                    if f"{a}/grad_norm" in u
                ]
                counts.append(float(np.sum(np.array(vals) > threshold)))
                peaks.append(float(np.max(vals)) if vals else 0.0)
                medians.append(float(np.median(vals)) if vals else 0.0)
            spikes[mode] = {
                "updates_above_threshold": C.interval(counts),
                "max_norm": C.interval(peaks),
                "median_norm": C.interval(medians),
                "per_seed": {"above": counts, "max": peaks, "median": medians},
            }
        out["agents"][a] = {
            **{k: C.interval(v) for k, v in per_seed.items()},
            "per_seed": per_seed,
            "spikes": spikes,
        }
    return out


def plot(runs: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    left_out = 0
    for k, a in enumerate(AGENTS):
        rows = [row for r in runs for row in r["paired"] if f"{a}/grad_norm_agent" in row]
        # a zero agent-wise gradient (the agent's rewards constant in every group) has no finite ratio,
        # and no factor (no sample counted)
        kept = [row for row in rows if row[f"{a}/grad_norm_agent"] > 0 and row[f"{a}/counted"] > 0]
        left_out += len(rows) - len(kept)
        rows = kept
        pred = [row[f"{a}/predicted"] for row in rows]
        meas = [row[f"{a}/grad_norm_global"] ** 2 / row[f"{a}/grad_norm_agent"] ** 2 for row in rows]
        ax.scatter(pred, meas, s=12, alpha=0.6, label=a, color=f"C{k}")
    lim = ax.get_xlim()
    ax.plot(lim, lim, "k--", lw=0.8, label="measured = predicted")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="predicted factor (per problem group)",
        ylabel="||g_global||^2 / ||g_agent||^2 (same batch)",
        title=f"per step, paired ({left_out} agent-steps without a counted sample left out)",
    )
    ax.legend(fontsize=8)
    for k, a in enumerate(AGENTS):
        ax = axes[1 + k]
        for mode, style in (("global", "-"), ("agent", "--")):
            for r in runs:
                if r["normalization"] != mode:
                    continue
                xs = [u["step"] for u in r["updates"] if f"{a}/grad_norm" in u]
                ys = [u[f"{a}/grad_norm"] for u in r["updates"] if f"{a}/grad_norm" in u]
                ax.plot(
                    xs,
                    ys,
                    style,
                    color="C3" if mode == "global" else "C0",
                    alpha=0.7,
                    label=f"{mode} seed {r['seed']}",
                )
        ax.axhline(summary["spike_threshold"], color="k", lw=0.8, ls=":", label="spike threshold")
        ax.set(
            yscale="log", xlabel="step", ylabel=f"agent/{a}/grad_norm", title=f"{a}: per-update gradient norm"
        )
        ax.legend(fontsize=6, ncol=2)
    C.save_figure(fig, path)


def main(argv=None) -> None:
    ap = C.arguments(__doc__, steps=4, batch_help="problems per step (4 episodes each)")
    args = ap.parse_args(argv)
    C.quiet()
    runs = []
    for seed in args.seeds:
        for normalization in ("global", "agent"):
            done = args.root / "drmas" / f"{normalization}_seed{seed}_s{args.steps}_b{args.batch}.json"
            if args.summarise and not done.exists():
                continue
            runs.append(C.cached_run(done, run_one, seed, normalization, args.steps, args.root, args.batch))
            print(f"seed {seed} {normalization}: {runs[-1]['seconds']:.0f} s", flush=True)
    summary = summarise(runs)
    C.write_json(
        args.out / "drmas_amplification.json",
        {
            "settings": {
                "seeds": sorted({r["seed"] for r in runs}),
                "steps": args.steps,
                "batch": args.batch,
                "sft": C.SFT,
                "spike_factor": SPIKE_FACTOR,
            },
            "summary": summary,
            "runs": runs,
        },
    )
    plot(runs, summary, args.out / "drmas_amplification.png")
    for a, s in summary["agents"].items():
        sp = s["spikes"]
        print(
            f"{a}: predicted {s['predicted']['mean']:.3f}, measured grad {s['measured_grad']['mean']:.3f} "
            f"[{s['measured_grad']['lo']:.3f}, {s['measured_grad']['hi']:.3f}], adv {s['measured_adv']['mean']:.3f}, "
            f"adv on the counted samples {s['measured_adv_counted']['mean']:.3f}; "
            f"spikes global {sp['global']['updates_above_threshold']['mean']:.1f} "
            f"(max {sp['global']['max_norm']['mean']:.3g}), "
            f"agent {sp['agent']['updates_above_threshold']['mean']:.1f} (max {sp['agent']['max_norm']['mean']:.3g})"
        )


if __name__ == "__main__":
    main()
