import pytest
from tool_rise import check_rise


@pytest.mark.slow(seconds=330)
def test_warm_started_search_team_reward_rises(tmp_path):
    # benchmarks/RESULTS.md, 2026-11-26 (warm_started_run's defaults): rises +0.45, ... at seeds 0, 1, 2
    # (std ...); the margin is above that spread and below every seed's rise
    check_rise("dr_mas_search", tmp_path, seed=0, steps=20, window=4, margin=0.15)
