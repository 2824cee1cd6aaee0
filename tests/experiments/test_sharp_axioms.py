"""experiments/sharp_axioms.py's statistics on hand-made coalition tables (no model, no sandbox)."""

from __future__ import annotations

import numpy as np
import pytest
import sharp_axioms


@pytest.fixture(scope="module")
def axioms():
    full = sharp_axioms.PERMUTATIONS
    sharp_axioms.PERMUTATIONS = (1, 4)  # two compiled shapes keep the test fast
    yield sharp_axioms
    sharp_axioms.PERMUTATIONS = full


def constructed_table(value_of) -> np.ndarray:
    """Team table `[32]` (planner bit 0; workers a, a', b, n on bits 1-4) from a worker-coalition value."""
    from marljax.workflows.sharp import team_value_table

    return team_value_table(np.array([value_of(m) for m in range(16)], np.float32))


def test_constructed_team_has_the_axioms(axioms):
    # a or its duplicate a' makes half the program, b the other half; n is ignored
    def value(m):
        return 0.5 * bool(m & 0b11) + 0.5 * bool(m & 0b100)

    tables = np.stack([constructed_table(value), constructed_table(lambda m: 0.25 * bool(m & 0b100))])
    out = axioms.constructed_axioms(tables, axioms.credits(tables, seed=0, draws=2))
    assert out["asymmetric_episodes"] == 0 and out["non_null_episodes"] == 0
    assert out["efficiency_gap_max/exact"] < 1e-6
    assert out["efficiency_gap_max/sampled"] < 1e-6  # permutation estimates telescope exactly
    assert out["symmetry_gap_max/exact"] < 1e-6 and out["null_abs_max/exact"] < 1e-6
    assert out["null_abs_max/sampled"] < 1e-6
    exact = axioms.credits(tables, 0, 1)["exact"]
    np.testing.assert_allclose(
        exact[1], [0.125, 0, 0, 0.125, 0], atol=1e-6
    )  # v = 0.25 iff planner and b: they halve it
    # leave-one-out on table 0: planner 1, a 0 and a' 0 (each covered by the other), b 0.5, n 0:
    # 1.5 against v(all) - v(empty) = 1
    assert out["efficiency_gap_max/counterfactual"] == pytest.approx(0.5, abs=1e-6)
    assert out["symmetry_gap_max/counterfactual"] < 1e-6


def test_a_player_that_matters_is_flagged_not_null(axioms):
    tables = constructed_table(lambda m: 0.5 * bool(m & 0b1000))[None]  # n decides the outcome
    out = axioms.constructed_axioms(tables, axioms.credits(tables, seed=0, draws=1))
    assert out["non_null_episodes"] == 1 and out["null_abs_max/exact"] == pytest.approx(0.25, abs=1e-6)


def test_summary_takes_worst_gaps_and_intervals(axioms):
    rows = []
    for seed, gap in ((0, 0.1), (1, 0.3)):
        row = {"seed": seed}
        for part in ("natural", "constructed"):
            row[part] = {
                "efficiency_gap_max/counterfactual": gap,
                "episodes": 4,
                "sampled_rmse": [gap, gap / 2],
                "symmetry_gap_mean/sampled": [gap, 0.0],
                "credit_mean/exact": [gap] * 5,
                "credit_abs_mean/exact": gap,
                "efficiency_gap_mean/exact": gap,
            }
        rows.append(row)
    s = axioms.summarise(rows)
    assert s["natural"]["efficiency_gap_max/counterfactual"] == 0.3  # the worst seed
    assert s["natural"]["episodes"] == 8  # counts add up
    assert s["natural"]["efficiency_gap_mean/exact"] == pytest.approx(0.2)  # means average
    assert s["constructed"]["sampled_rmse"][0]["mean"] == pytest.approx(0.2)
    assert s["constructed"]["sampled_rmse"][1]["n"] == 2
