"""Per-policy experience buffers: a full buffer triggers that policy's update alone.

MARS2's asynchronous dynamic training: each policy collects its own rows
(`Rows`, one per completion) and updates as soon as it has `threshold` of
them, without waiting for the other policies. `take` hands out exactly
`threshold` rows, oldest first; the rest stay for the next update (nothing
is dropped), except that with `max_staleness` a row generated more than that
many versions ago is dropped, and counted so the trainer can say so.
"""

from __future__ import annotations

from typing import Any

from marljax.workflows.types import Rows

EMPTY = Rows((), (), ())


class ExperienceBuffer:
    """FIFO of training rows for one policy."""

    def __init__(self, threshold: int, max_staleness: int | None = None):
        if threshold < 1:
            raise ValueError(f"buffer threshold must be >= 1, got {threshold}")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.threshold, self.max_staleness = threshold, max_staleness
        self.rows = EMPTY
        self.added = self.taken = self.dropped = 0  # running totals, checkpointed

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Rows) -> None:
        self.rows = Rows.concatenate([self.rows, rows])
        self.added += len(rows)

    def drop_stale(self, version: int) -> int:
        """Drop rows more than `max_staleness` versions older than `version`; returns how many."""
        if self.max_staleness is None:
            return 0
        keep = version - self.rows.version <= self.max_staleness
        dropped = len(self.rows) - int(keep.sum())
        self.rows = self.rows[keep]
        self.dropped += dropped
        return dropped

    def ready(self, version: int) -> bool:
        """True when, after dropping stale rows, `threshold` rows are waiting."""
        self.drop_stale(version)
        return len(self.rows) >= self.threshold

    def take(self, version: int) -> tuple[Rows, dict[str, float]]:
        """The `threshold` oldest rows and their staleness statistics (call after `ready`)."""
        if not self.ready(version):
            raise RuntimeError(f"buffer holds {len(self)} rows, fewer than its threshold {self.threshold}")
        batch, self.rows = self.rows[: self.threshold], self.rows[self.threshold :]
        self.taken += len(batch)
        staleness = [version - int(v) for v in batch.version]
        return batch, {
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": float(max(staleness)),
            "buffer_left": float(len(self.rows)),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows.to_json(),
            "added": self.added,
            "taken": self.taken,
            "dropped": self.dropped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = Rows.from_json(state["rows"])
        self.added, self.taken, self.dropped = state["added"], state["taken"], state["dropped"]
