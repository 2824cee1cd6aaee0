"""experiments/magrpo_cooperation.py's summary on hand-made runs (no model, no training)."""

from __future__ import annotations

import magrpo_cooperation as magrpo
import pytest


def run(seed, setting, reward):
    after = {m: reward for m in ("reward", "pass", "cooperation", "tests", "structure")}
    return {"seed": seed, "setting": setting, "after": after, "curves": []}


def test_summary_means_and_paired_differences():
    rewards = {"untrained": (0.1, 0.2, 0.3), "helper_alone": (0.2, 0.2, 0.2), "main_alone": (0.0, 0.1, 0.5)}
    rewards["joint"] = (0.4, 0.5, 0.9)
    runs = [run(seed, s, r[seed]) for s, r in rewards.items() for seed in range(3)]
    s = magrpo.summarise(runs)
    assert s["joint"]["reward"]["mean"] == pytest.approx(0.6)
    assert s["joint"]["per_seed_reward"] == [0.4, 0.5, 0.9]
    d = s["joint_minus_untrained"]["reward"]  # paired: 0.3, 0.3, 0.6
    assert d["mean"] == pytest.approx(0.4)
    assert d["std"] == pytest.approx(0.17320508)
    half = 4.302652729911275 * 0.17320508 / 3**0.5  # t(0.975, 2) * s / sqrt(n)
    assert d["lo"] == pytest.approx(0.4 - half) and d["hi"] == pytest.approx(0.4 + half)
    assert s["joint_minus_main_alone"]["reward"]["mean"] == pytest.approx(0.4)
    assert "train_reward_first" not in s["joint"]  # no curves, no training statistics


def test_summary_training_reward_quarters():
    runs = [run(0, "joint", 0.5), run(1, "joint", 0.5)]
    for r, rewards in zip(runs, ([0.0, 0.2, 0.4, 0.6], [0.2, 0.2, 0.2, 1.0])):
        r["curves"] = [{"step": k + 1, "team/reward": v} for k, v in enumerate(rewards)]
    s = magrpo.summarise(runs)["joint"]
    assert s["train_reward_first"]["mean"] == pytest.approx(0.1)  # (0.0 + 0.2) / 2
    assert s["train_reward_last"]["mean"] == pytest.approx(0.8)  # (0.6 + 1.0) / 2


def test_summary_pairs_only_common_seeds():
    runs = [run(0, "joint", 1.0), run(1, "joint", 0.0), run(1, "untrained", 0.5)]
    s = magrpo.summarise(runs)
    assert s["joint_minus_untrained"]["reward"]["n"] == 1
    assert s["joint_minus_untrained"]["reward"]["mean"] == pytest.approx(-0.5)
    assert "helper_alone" not in s and "joint_minus_helper_alone" not in s
