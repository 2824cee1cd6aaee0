"""experiments/mars2_recipes.py without training: pass@k, the team's union pass@k, the recipes' configs."""

from __future__ import annotations

import itertools

import mars2_recipes as R
import numpy as np
import pytest


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of k-subsets of n samples (c of them passing) that hold a passing one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(6, 0, 2), (6, 1, 1), (6, 2, 3), (6, 5, 4), (5, 5, 5)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_pass(n, c, k):
    assert R.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))


def test_numbers_of_a_hand_made_measurement(monkeypatch):
    monkeypatch.setattr(R, "SAMPLES", 4)
    monkeypatch.setattr(R, "NODES", (4, 8))
    search = {
        "eval/search/pass_at_1": 0.5,
        "eval/search/oracle": 0.75,
        "eval/search/gen_nodes": 3.0,
        "eval/search/cont_nodes": 1.0,
        "eval/search/gen_success": 0.25,
    }
    m = {
        "greedy": {"alice": [True, False, False, True], "bob": [False, False, True, True]},
        "passed": {"alice": [4, 0, 1, 2], "bob": [0, 0, 2, 4]},  # of 4 samples per task
        "search": {"4": {**search, "eval/search/pass_at_1": 0.25}, "8": search},
    }
    out = R.numbers(m)
    assert out["greedy/alice"] == 0.5 and out["pass@1/alice"] == pytest.approx((1 + 0 + 0.25 + 0.5) / 4)
    assert out["pass@4/bob"] == 0.5  # a task with any pass among all 4 samples
    # team pass@2: one sample from each; task 0: alice always passes; task 1: never; task 2: 1 -
    # (3/4)(2/4); task 3: 1
    assert out["team_pass@2"] == pytest.approx((1 + 0 + (1 - 0.75 * 0.5) + 1) / 4)
    assert out["team_pass@8"] == 0.75  # all 4 samples of each: any pass on tasks 0, 2, 3
    # greedy failures: alice fails tasks 1, 2; bob tasks 0, 1: both fail 1 of the 3 failed by any
    assert out["failed_jaccard"] == pytest.approx(1 / 3)
    assert (out["search@4"], out["search@8"], out["oracle@8"]) == (0.25, 0.5, 0.75)
    # the largest budget's node kinds; no refinement passed: no cont_success in, NaN out
    assert out["gen_success"] == 0.25 and out["cont_nodes"] == 1.0 and np.isnan(out["cont_success"])


def test_each_recipe_changes_what_it_names(tmp_path):
    models = {"qwen3": tmp_path / "qwen3", "llama": tmp_path / "llama"}  # read only when a run starts
    cfgs = {r: R.recipe_config(r, 3, 24, 8, tmp_path, models) for r in R.RECIPES}
    demo = cfgs["demo"]
    assert demo.workflow.normalization == "agent" and demo.workflow.reward == "pass"
    assert demo.workflow.overlong is None and demo.seed == 3 and demo.data.batch_size == 8
    lrs = {name: p.optimizer.lr for name, p in demo.policies.items()}
    for p in demo.policies.values():
        assert (p.loss.type, p.loss.kl_coef, p.reference, p.mini_batches) == ("ppo", 0.0, False, 1)
    assert cfgs["tree"].workflow.normalization == "tree" and cfgs["kind"].workflow.normalization == "kind"
    assert cfgs["fraction"].workflow.reward == "fraction" and cfgs["equal_budget"].data.batch_size == 16
    for recipe, coef in (("kl", 1e-3), ("kl_strong", 0.1)):
        for p in cfgs[recipe].policies.values():
            assert (p.loss.type, p.loss.kl_coef, p.loss.kl_estimator, p.reference) == (
                "ppo",
                coef,
                "k3",
                True,
            )
    assert {n: p.optimizer.lr for n, p in cfgs["half_lr"].policies.items()} == {
        n: v / 2 for n, v in lrs.items()
    }
    plus = cfgs["mars2_plus"]
    assert (plus.workflow.normalization, plus.workflow.reward) == ("tree", "fraction")
    assert plus.workflow.overlong is not None and plus.workflow.overlong.max_len == 40
    for p in plus.policies.values():
        assert (p.loss.type, p.loss.kl_coef, p.reference, p.mini_batches) == ("gspo", 1e-3, True, 2)
    # nothing else moved: the workflows differ from the demo's only in what each recipe names
    base = demo.workflow.model_dump()
    for recipe, cfg in cfgs.items():
        changed = {k for k, v in cfg.workflow.model_dump().items() if base[k] != v}
        assert changed == set(R.RECIPES[recipe].get("workflow", {})), recipe
