"""Training curves from ``RUN_DIR/metrics.jsonl`` to PNG files.

One figure per metric among ``PLOTTED`` that the run logged: a line per agent
for ``agent/<agent>/<metric>``, a line per policy for
``policy/<policy>/<metric>`` (labels get an ``agent/`` or ``policy/`` prefix
when a metric has both), and an ``eval`` figure with a line per ``eval/*`` key.
x is the step; a record without a key simply adds no point to that line.
Lines are smoothed by an exponential moving average (`ema`) drawn over the
faint raw points, and the legend sits outside the axes, right of them, so that
it never covers a curve.

Figures are drawn on matplotlib's Agg canvas without pyplot, so no display is
needed and the caller's pyplot backend is left alone.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from marljax.train.metrics import METRICS_FILE, read_metrics

PLOTTED = ("reward", "pass_rate", "kl_ref", "entropy", "loss", "grad_norm")

Series = dict[str, tuple[np.ndarray, np.ndarray]]


def curves(records: list[dict]) -> dict[str, Series]:
    """``{metric: {label: (steps, values)}}`` for the plotted metrics and ``eval``, sorted by step."""
    points: dict[str, dict[tuple[str, str], list[tuple[int, float]]]] = {}
    for record in records:
        for key, value in record.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] in ("agent", "policy") and parts[2] in PLOTTED:
                metric, label = parts[2], (parts[0], parts[1])
            elif len(parts) >= 2 and parts[0] == "eval":
                metric, label = "eval", ("eval", key[len("eval/") :])
            else:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            points.setdefault(metric, {}).setdefault(label, []).append((record["step"], float(value)))
    out: dict[str, Series] = {}
    for metric in (*PLOTTED, "eval"):
        if metric not in points:
            continue
        mixed = len({kind for kind, _ in points[metric]}) > 1
        out[metric] = {}
        for (kind, name), pts in points[metric].items():
            pts.sort(key=lambda p: p[0])
            steps = np.array([p[0] for p in pts], dtype=np.int64)
            values = np.array([p[1] for p in pts], dtype=np.float64)
            out[metric][f"{kind}/{name}" if mixed else name] = (steps, values)
    return out


def ema(values: np.ndarray, smoothing: float) -> np.ndarray:
    """Exponential moving average ``s_i = smoothing * s_{i-1} + (1 - smoothing) * v_i`` from
    ``s_0 = v_0`` (TensorBoard's smoothing, without its start-up correction); non-finite points are
    skipped (NaN in the output, state kept)."""
    out = np.full_like(values, np.nan)
    acc = math.nan
    for i, v in enumerate(values):
        if math.isfinite(v):
            acc = v if math.isnan(acc) else smoothing * acc + (1 - smoothing) * v
            out[i] = acc
    return out


def make_figure(title: str, series: Series, *, smoothing: float = 0.6) -> Figure:
    """One axes, one labelled line per series; with ``smoothing > 0`` the raw points stay as faint markers."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, (steps, values) in series.items():
        if smoothing > 0 and len(values) > 2:
            (raw,) = ax.plot(steps, values, marker=".", linewidth=0.8, alpha=0.3, label="_raw")
            ax.plot(steps, ema(values, smoothing), color=raw.get_color(), label=label)
        else:
            ax.plot(steps, values, marker=".", label=label)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if series:
        # outside the axes: inside, matplotlib's "best" place still covers points when lines fill the plot
        fig.legend(loc="outside right upper", fontsize="small")
    return fig


def plot_run(
    run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, *, smoothing: float = 0.6
) -> list[Path]:
    """Write ``<metric>.png`` for each metric present to ``out_dir`` (default ``RUN_DIR/plots``); return the paths."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)  # FileNotFoundError naming the file when missing
    if not records:
        raise ValueError(f"{run_dir / METRICS_FILE} has no records to plot")
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric, series in curves(records).items():
        path = out / f"{metric}.png"
        make_figure(metric, series, smoothing=smoothing).savefig(path, dpi=100)
        paths.append(path)
    return paths
