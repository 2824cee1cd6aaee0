"""What workflows hand to the trainer: flat samples with their tree/turn ids.

A `Sample` is one agent's completion at one node of one episode (or search
tree). Workflows fill in everything but `advantage`'s final value is theirs
too: credit assignment (the kernels) runs inside the workflow, because only
it knows the group structure. The trainer routes samples by `policy`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

ID_FIELDS = ("problem", "episode", "node", "parent", "depth", "turn")


@dataclasses.dataclass
class Sample:
    """One completion. Token arrays are host numpy int32 / float32.

    prompt_ids `[P]`, completion_ids `[C]`, sampling_logprobs `[C]` (the
    sampler's log-probs of the completion tokens, for truncated importance
    sampling). `version` is the policy version that generated it (for
    staleness). `ids` holds the integer or string ids in `ID_FIELDS`
    (problem, episode/tree, node, parent (-1 at a root), depth, turn).
    """

    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    sampling_logprobs: np.ndarray
    reward: float
    advantage: float = 0.0
    agent: str = ""
    policy: str = ""
    version: int = 0
    ids: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.prompt_ids = np.asarray(self.prompt_ids, np.int32).reshape(-1)
        self.completion_ids = np.asarray(self.completion_ids, np.int32).reshape(-1)
        self.sampling_logprobs = np.asarray(self.sampling_logprobs, np.float32).reshape(-1)
        if self.sampling_logprobs.shape != self.completion_ids.shape:
            raise ValueError(f"sampling_logprobs has shape {self.sampling_logprobs.shape}, "
                             f"completion_ids {self.completion_ids.shape}: one log-prob per completion token")
        unknown = set(self.ids) - set(ID_FIELDS)
        if unknown:
            raise ValueError(f"unknown sample ids {sorted(unknown)}; known: {ID_FIELDS}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (for the loop checkpoint); `from_json` inverts it exactly."""
        return {"prompt_ids": self.prompt_ids.tolist(), "completion_ids": self.completion_ids.tolist(),
                # float32 -> float64 -> JSON text -> float64 -> float32 is exact
                "sampling_logprobs": [float(x) for x in self.sampling_logprobs],
                "reward": float(self.reward), "advantage": float(self.advantage), "agent": self.agent,
                "policy": self.policy, "version": int(self.version), "ids": dict(self.ids)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Sample":
        return cls(**data)
