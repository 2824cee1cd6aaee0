"""The demo's printed table and PNG figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from marljax.train.metrics import read_metrics


def results_table(results: Sequence[dict[str, Any]], settings: Any, minutes: float) -> str:
    s = settings
    lines = [
        f"Held-out pass@1 on {s.n_eval} unseen tasks ({s.eval_samples} sampled answers per task at "
        f"temperature 1, hidden tests), before and after {s.rl_steps} RL steps of "
        f"{s.samples_per_step} samples each:",
        "",
        "| method | agents -> policy | pass@1 before | pass@1 after | change |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        agents = ", ".join(f"{a} -> {p}" for a, p in r["agents"].items())
        change = 100 * (r["after"] - r["before"])
        lines.append(
            f"| {r['label']} | {agents} | {100 * r['before']:.1f}% | {100 * r['after']:.1f}% | "
            f"{change:+.1f} points |"
        )
    lines += ["", f"Total wall time {minutes:.1f} min (models, SFT, RL, evaluation)."]
    return "\n".join(lines)


def reward_curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(steps, mean training reward over the run's agents) of an RL run's metrics."""
    steps, rewards = [], []
    for rec in read_metrics(run_dir):
        values = [v for k, v in rec.items() if k.startswith("agent/") and k.endswith("/reward")]
        if rec["step"] > 0 and values:
            steps.append(rec["step"])
            rewards.append(np.mean(values))
    return np.asarray(steps), np.asarray(rewards)


def write_plots(out: Path, results: Sequence[dict[str, Any]]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        steps, rewards = reward_curve(out / r["method"])
        ax.plot(steps, rewards, marker=".", label=r["label"])
    ax.set(xlabel="RL step", ylabel="mean training reward (the workflow's reward)", title="Training reward")
    ax.legend(fontsize=8)
    fig.tight_layout()
    curves = out / "reward_curves.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.arange(len(results))
    ax.bar(x - 0.2, [100 * r["before"] for r in results], 0.4, label="before RL (after SFT)")
    ax.bar(x + 0.2, [100 * r["after"] for r in results], 0.4, label="after RL")
    ax.set_xticks(x, [r["label"].replace(" (", "\n(") for r in results], fontsize=7)
    ax.set(ylabel="held-out pass@1 (%)", title="Held-out pass@1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    bars = out / "pass_at_1.png"
    fig.savefig(bars, dpi=120)
    plt.close(fig)
    return [curves, bars]
