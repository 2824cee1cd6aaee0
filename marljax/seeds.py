"""Seeds of a run's random streams, each derived from its parent stream's seed.

The trainer derives one seed per step from the run seed; a workflow derives
one per turn, search round or generate call from the step's seed; the policy
generator derives one per sampler call from the workflow's. `derive_seed` is
the one place where those derivations are written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

Rule = Literal["hashed", "round", "policy", "stage"]


def _hashed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


# `hashed` mixes the parent seed and the index thoroughly (nearby seeds give unrelated
# streams): use it for new streams. The linear rules are kept for the streams that already
# use them, so that the same run seed keeps giving the same samples.
_RULES: dict[str, Callable[[int, int], int]] = {
    "hashed": _hashed,
    "round": lambda seed, index: (seed * 1_000_003 + index) % 2**31,  # MARS2 search rounds
    "policy": lambda seed, index: (seed * 1009 + index) % 2**32,  # one sampler call per policy
    "stage": lambda seed, index: seed + 7919 * index,  # Dr. MAS and SHARP generate calls
}


def derive_seed(seed: int, index: int, rule: Rule = "hashed") -> int:
    """The seed of sub-stream `index` (a step, turn, round, policy or stage) of the stream `seed`."""
    if rule not in _RULES:
        raise ValueError(f"unknown seed rule {rule!r}; known: {sorted(_RULES)}")
    return _RULES[rule](int(seed), int(index))
