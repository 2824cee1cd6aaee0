"""`marljax plot`'s smoothing and layout (its files and series: test_metrics.py)."""

import math

import numpy as np
import pytest
from matplotlib.transforms import Bbox

from marljax.train.plot import ema, make_figure


def test_ema_by_hand():
    # s0 = 1; s1 = .5 * 1 + .5 * 0; s2 = .5 * .5 + .5 * 0; s3 = .5 * .25 + .5 * 1
    assert ema(np.array([1.0, 0.0, 0.0, 1.0]), 0.5).tolist() == [1.0, 0.5, 0.25, 0.625]
    # a NaN point is skipped: no value there, and the next point continues from the last one
    got = ema(np.array([2.0, math.nan, 0.0]), 0.75)
    assert got[0] == 2.0 and math.isnan(got[1]) and got[2] == pytest.approx(1.5)
    assert ema(np.array([3.0, 1.0]), 0.0).tolist() == [3.0, 1.0]  # no smoothing


def test_legend_is_outside_the_data_area():
    steps = np.arange(20)
    # lines filling the whole plot: no corner inside is free for a legend
    series = {f"agent{k}": (steps, np.sin(steps / 3 + k)) for k in range(4)}
    fig = make_figure("reward", series)
    fig.canvas.draw()
    (ax,) = fig.axes
    (legend,) = fig.legends
    box = legend.get_window_extent()
    inside = Bbox.intersection(box, ax.get_window_extent())
    assert inside is None or inside.width * inside.height == 0
    assert box.x1 <= fig.bbox.x1 + 1 and box.y0 >= fig.bbox.y0 - 1  # not cut off by the figure's edge
