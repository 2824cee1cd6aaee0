"""The demo's figures: the numbers they draw (standard errors, smoothed curves) and legends that
stay off the data."""

import json
import math

import numpy as np
import pytest
from matplotlib.container import BarContainer
from matplotlib.transforms import Bbox

from marljax.demo.pipeline import DemoConfig
from marljax.demo.report import (
    held_out_bars,
    held_out_figure,
    mean_standard_error,
    rate_standard_error,
    reward_figure,
)

SEARCH = "eval/search/pass_at_1"


def result(method, search, per_task):
    """A method's result as `train_method` returns it, with only the fields the figures read."""
    return {
        "method": method,
        "label": f"{method} (a team)",
        "search": {phase: {SEARCH: search[phase]} for phase in search},
        "pass_at_1": {phase: float(np.mean(v)) for phase, v in per_task.items()},
        "pass_at_1_per_task": per_task,
    }


RESULTS = [
    result("grpo", {"before": 0.5, "after": 0.75}, {"before": [1, 0, 0.5, 0.5], "after": [1, 1, 0.5, 0.5]}),
    result("mars2", {"before": 0.25, "after": 1.0}, {"before": [0, 0, 0, 0.5], "after": [1, 1, 1, 1]}),
]
SETTINGS = DemoConfig(n_eval=4, eval_samples=2)


def test_standard_errors_by_hand():
    assert rate_standard_error(0.5, 128) == pytest.approx(0.5 / math.sqrt(128))
    assert rate_standard_error(1.0, 10) == 0.0
    # per-task means 1, 0, .5, .5: mean .5, sample variance (.25 + .25 + 0 + 0) / 3
    assert mean_standard_error([1, 0, 0.5, 0.5]) == pytest.approx(math.sqrt(0.5 / 3) / 2)


def test_held_out_bars_carry_the_standard_errors():
    search, pass1 = held_out_bars(RESULTS, SETTINGS)
    assert search["n"] == pass1["n"] == 4
    assert search["before"] == [50.0, 25.0] and search["after"] == [75.0, 100.0]
    # sqrt(p (1 - p) / 4) in points
    assert search["before_se"] == pytest.approx([25.0, 100 * math.sqrt(0.25 * 0.75 / 4)])
    assert search["after_se"] == pytest.approx([100 * math.sqrt(0.75 * 0.25 / 4), 0.0])
    assert pass1["before"] == [50.0, 12.5] and pass1["after"] == [75.0, 100.0]
    assert pass1["before_se"] == pytest.approx([100 * math.sqrt(0.5 / 3) / 2, 12.5])  # [0,0,0,.5]: sd .25
    assert pass1["after_se"] == pytest.approx(
        [100 * math.sqrt(1 / 12) / 2, 0.0]
    )  # [1,1,.5,.5]: sd sqrt(1/12)


def drawn_error_bars(ax):
    """Half the length of each bar's drawn error line, per bar container."""
    return [
        [(seg[1][1] - seg[0][1]) / 2 for seg in bars.errorbar.lines[2][0].get_segments()]
        for bars in ax.containers
        if isinstance(bars, BarContainer)
    ]


def assert_legend_off_the_axes(fig):
    fig.canvas.draw()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert Bbox.intersection(box, fig.bbox) is not None  # on the figure
    for ax in fig.axes:
        inside = Bbox.intersection(box, ax.get_window_extent())
        assert inside is None or inside.width * inside.height == 0, (box, ax.get_window_extent())


def test_held_out_figure_draws_those_error_bars_and_keeps_its_legend_outside():
    fig = held_out_figure(RESULTS, SETTINGS)
    for ax, panel in zip(fig.axes, held_out_bars(RESULTS, SETTINGS)):
        assert drawn_error_bars(ax) == [pytest.approx(panel["before_se"]), pytest.approx(panel["after_se"])]
        assert "n = 4" in ax.get_ylabel()
    assert_legend_off_the_axes(fig)


def test_reward_figure_smooths_each_curve_over_its_raw_points(tmp_path):
    # metrics.jsonl as the trainer writes it: RL steps from 1, one reward per agent
    rewards = {"grpo": [1.0, 0.0, 0.0, 1.0], "mars2": [0.5, 0.5]}
    for method, values in rewards.items():
        (tmp_path / method).mkdir()
        lines = [{"step": 0, "agent/a/reward": 9.0}]  # step 0 is not an RL step
        lines += [{"step": k + 1, "agent/a/reward": v, "agent/b/reward": v} for k, v in enumerate(values)]
        (tmp_path / method / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    fig = reward_figure(tmp_path, RESULTS)
    (ax,) = fig.axes
    raw, smooth, short = ax.lines
    assert raw.get_alpha() < 1 and raw.get_ydata().tolist() == rewards["grpo"]
    # moving average 0.6: 1, .6 * 1 + .4 * 0, .6 * .6, .6 * .36 + .4
    assert smooth.get_ydata() == pytest.approx([1.0, 0.6, 0.36, 0.616])
    assert short.get_ydata().tolist() == [0.5, 0.5]  # two points: not smoothed
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["grpo (a team)", "mars2 (a team)"]
    assert_legend_off_the_axes(fig)
