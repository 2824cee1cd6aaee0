"""The demo's printed table and PNG figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from marljax.train.metrics import read_metrics

SEARCH = "eval/search/pass_at_1"


def search_column(settings: Any) -> str:
    return f"team search solve rate (MARS2-T+, {settings.search_nodes} nodes, hidden tests)"


def before_after(pair: dict[str, float]) -> str:
    b, a = pair["before"], pair["after"]
    return f"{100 * b:.1f}% -> {100 * a:.1f}% ({100 * (a - b):+.1f})"


def headline(results: Sequence[dict[str, Any]], settings: Any) -> str:
    """What each team reaches under search after RL: the number MARS2's claim is about."""
    return f"Headline, {search_column(settings)} after RL: " + ", ".join(
        f"{r['label']} {100 * r['search']['after'][SEARCH]:.1f}%" for r in results
    )


def results_table(results: Sequence[dict[str, Any]], settings: Any, minutes: float) -> str:
    s = settings
    lines = [
        headline(results, s),
        "",
        f"On {s.n_eval} unseen tasks, before -> after {s.rl_steps} RL steps of {s.samples_per_step} "
        "samples each (change in points):",
        "",
        f"| method | agents -> policy | {search_column(s)} | mean per-policy pass@1 |",
        "|---|---|---|---|",
    ]
    for r in results:
        agents = ", ".join(f"{a} -> {p}" for a, p in r["agents"].items())
        search = {phase: r["search"][phase][SEARCH] for phase in ("before", "after")}
        lines.append(f"| {r['label']} | {agents} | {before_after(search)} | {before_after(r['pass_at_1'])} |")
    lines += [
        "",
        f"Team search: per task, the team's agents write {s.search_nodes} programs at temperature 1 in one "
        "MARS2-T+ tree (failed programs refined by the next agent with the sandbox's error feedback); the "
        "public tests guide the search and pick the answer, the hidden tests score it. GRPO's one agent "
        f"searches alone. pass@1: {s.eval_samples} sampled answers per task at temperature 1, scored on "
        "all tests, averaged over the team's agents.",
        "",
        f"Total wall time {minutes:.1f} min (models, SFT, RL, evaluation).",
    ]
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


def write_plots(out: Path, results: Sequence[dict[str, Any]], settings: Any) -> list[Path]:
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

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(results))
    panels = (
        (
            [{k: r["search"][k][SEARCH] for k in ("before", "after")} for r in results],
            search_column(settings).replace(" (", "\n("),
        ),
        ([r["pass_at_1"] for r in results], "mean per-policy pass@1"),
    )
    for ax, (values, title) in zip(axes, panels):
        ax.bar(x - 0.2, [100 * v["before"] for v in values], 0.4, label="before RL (after SFT)")
        ax.bar(x + 0.2, [100 * v["after"] for v in values], 0.4, label="after RL")
        ax.set_xticks(x, [r["label"].replace(" (", "\n(") for r in results], fontsize=7)
        ax.set(ylabel="held-out tasks solved (%)", title=title)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    bars = out / "held_out.png"
    fig.savefig(bars, dpi=120)
    plt.close(fig)
    return [curves, bars]
