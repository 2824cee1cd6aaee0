"""Per-policy experience buffers: a full buffer triggers that policy's update alone.

MARS2's asynchronous dynamic training: each policy collects its own samples
and updates as soon as it has `threshold` of them, without waiting for the
other policies. `take` hands out exactly `threshold` samples, oldest first;
the rest stay for the next update (nothing is dropped), except that with
`max_staleness` a sample generated more than that many versions ago is
dropped, and counted so the trainer can say so.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from marljax.workflows.types import Sample


class ExperienceBuffer:
    """FIFO of `Sample`s for one policy."""

    def __init__(self, threshold: int, max_staleness: int | None = None):
        if threshold < 1:
            raise ValueError(f"buffer threshold must be >= 1, got {threshold}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.threshold, self.max_staleness = threshold, max_staleness
        self._samples: deque[Sample] = deque()
        self.added = self.taken = self.dropped = 0  # running totals, checkpointed

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, samples: Iterable[Sample]) -> None:
        for s in samples:
            self._samples.append(s)
            self.added += 1

    def drop_stale(self, version: int) -> int:
        """Drop samples more than `max_staleness` versions older than `version`; returns how many."""
        if self.max_staleness is None:
            return 0
        keep = [s for s in self._samples if version - s.version <= self.max_staleness]
        dropped = len(self._samples) - len(keep)
        self._samples = deque(keep)
        self.dropped += dropped
        return dropped

    def ready(self, version: int) -> bool:
        """True when, after dropping stale samples, `threshold` samples are waiting."""
        self.drop_stale(version)
        return len(self._samples) >= self.threshold

    def take(self, version: int) -> tuple[list[Sample], dict[str, float]]:
        """The `threshold` oldest samples and their staleness statistics (call after `ready`)."""
        if not self.ready(version):
            raise RuntimeError(f"buffer holds {len(self)} samples, fewer than its threshold {self.threshold}")
        batch = [self._samples.popleft() for _ in range(self.threshold)]
        self.taken += len(batch)
        staleness = [version - s.version for s in batch]
        return batch, {
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": float(max(staleness)),
            "buffer_left": float(len(self._samples)),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "samples": [s.to_json() for s in self._samples],
            "added": self.added,
            "taken": self.taken,
            "dropped": self.dropped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._samples = deque(Sample.from_json(s) for s in state["samples"])
        self.added, self.taken, self.dropped = state["added"], state["taken"], state["dropped"]
