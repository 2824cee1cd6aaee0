import pytest
from tool_rise import check_rise


@pytest.mark.slow(seconds=400)
def test_warm_started_sharp_team_reward_rises(tmp_path):
    # benchmarks/RESULTS.md, 2026-11-26 12:00-12:50 UTC (warm_started_run's defaults): rises +0.18,
    # +0.43, +0.29 at seeds 0, 1, 2 (std 0.10); the margin is above that spread, below every rise
    check_rise("sharp_tools", tmp_path, seed=0, steps=20, window=4, margin=0.13)
