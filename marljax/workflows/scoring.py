"""How a workflow turns a test pass fraction into a reward (the scoring itself is `marljax.rewards.Verifier`)."""

from __future__ import annotations

from typing import Literal

# The fraction itself (dense, but a partly right program earns credit), or 1 only when every test passes.
RewardKind = Literal["fraction", "pass"]


def as_reward(fraction: float, kind: RewardKind) -> float:
    """The reward of a program that passed `fraction` of its tests, under reward `kind`."""
    return float(fraction >= 1.0) if kind == "pass" else fraction
