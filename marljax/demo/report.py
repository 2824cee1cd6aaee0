"""The demo's printed table and PNG figures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from marljax.train.metrics import read_metrics
from marljax.train.plot import ema

SEARCH = "eval/search/pass_at_1"
SMOOTHING = 0.6  # the reward curves' moving average, as `marljax plot` draws a run's curves


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


def rate_standard_error(p: float, n: int) -> float:
    """Standard error of a solve rate `p` measured on `n` tasks, each solved or not."""
    return math.sqrt(p * (1 - p) / n)


def mean_standard_error(per_task: Sequence[float]) -> float:
    """Standard error of a mean over tasks of per-task scores (pass@1: each task's mean over its
    samples): the samples of one task are not independent, so the tasks are the unit."""
    x = np.asarray(per_task, dtype=np.float64)
    return float(x.std(ddof=1) / math.sqrt(len(x)))


def held_out_bars(results: Sequence[dict[str, Any]], settings: Any) -> list[dict[str, Any]]:
    """The numbers `held_out.png` draws, per panel: `title`, `before` / `after` (per method, in %),
    `before_se` / `after_se` (their standard errors, in points) and `n` (tasks)."""
    n = settings.n_eval
    search = {"title": search_column(settings).replace(" (", "\n("), "n": n}
    pass1 = {"title": f"mean per-policy pass@1 ({settings.eval_samples} samples per task)", "n": n}
    for phase in ("before", "after"):
        rates = [r["search"][phase][SEARCH] for r in results]
        search[phase] = [100 * p for p in rates]
        search[f"{phase}_se"] = [100 * rate_standard_error(p, n) for p in rates]
        pass1[phase] = [100 * r["pass_at_1"][phase] for r in results]
        pass1[f"{phase}_se"] = [100 * mean_standard_error(r["pass_at_1_per_task"][phase]) for r in results]
    return [search, pass1]


def _figure(**kwargs: Any) -> Figure:
    # drawn on Agg without pyplot: no display needed, and the caller's pyplot backend is left alone
    fig = Figure(layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig


def reward_figure(out: Path, results: Sequence[dict[str, Any]]) -> Figure:
    """Each method's mean training reward per RL step, smoothed (`marljax.train.plot.ema`) over the
    faint raw curve; the legend below the axes."""
    fig = _figure(figsize=(6, 4.5))
    ax = fig.add_subplot()
    for r in results:
        steps, rewards = reward_curve(out / r["method"])
        if len(rewards) > 2:
            (raw,) = ax.plot(steps, rewards, marker=".", linewidth=0.8, alpha=0.3)
            ax.plot(steps, ema(rewards, SMOOTHING), color=raw.get_color(), label=r["label"])
        else:  # too few steps to smooth
            ax.plot(steps, rewards, marker=".", label=r["label"])
    ax.set(
        xlabel="RL step",
        ylabel="mean training reward (the workflow's reward)",
        title=f"Training reward (moving average {SMOOTHING}, raw faint)",
    )
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", fontsize=8)
    return fig


def held_out_figure(results: Sequence[dict[str, Any]], settings: Any) -> Figure:
    """Before and after RL, per method: the team's search solve rate and its mean pass@1, with
    ±1 standard error bars (`held_out_bars`); one legend for both panels, below them."""
    fig = _figure(figsize=(11, 5))
    axes = fig.subplots(1, 2)
    x = np.arange(len(results))
    for ax, panel in zip(axes, held_out_bars(results, settings)):
        for phase, shift, label in (("before", -0.2, "before RL (after SFT)"), ("after", 0.2, "after RL")):
            ax.bar(x + shift, panel[phase], 0.4, yerr=panel[f"{phase}_se"], capsize=3, label=label)
        ax.set_xticks(x, [r["label"].replace(" (", "\n(") for r in results], fontsize=7)
        # the whole 0-100% range: a scale cut to the bars' heights makes small gaps look large
        ax.set(ylabel=f"held-out tasks solved (%, n = {panel['n']})", title=panel["title"], ylim=(0, 100))
        ax.title.set_fontsize(9)
    fig.suptitle(
        f"Error bars: ±1 standard error over the {settings.n_eval} held-out tasks (search: sqrt(p(1-p)/n); "
        "pass@1: of the per-task means)",
        fontsize=8,
    )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8)
    return fig


def write_plots(out: Path, results: Sequence[dict[str, Any]], settings: Any) -> list[Path]:
    curves, bars = out / "reward_curves.png", out / "held_out.png"
    reward_figure(out, results).savefig(curves, dpi=120)
    held_out_figure(results, settings).savefig(bars, dpi=120)
    return [curves, bars]
