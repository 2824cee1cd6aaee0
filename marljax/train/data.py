"""A checkpointable stream of problem batches for RL training.

    problems = cfg.data.source.split("train")                # marljax.tasks
    stream = ProblemStream(problems, batch_size=32, seed=0)  # this process's shard, forever
    for batch in stream:                                      # a list of Problem
        ...
        save(stream.get_state())                              # JSON; set_state() resumes exactly

Where problems come from (files, row schemas, generated sets) is :mod:`marljax.tasks`.
"""

from __future__ import annotations

import numbers
import zlib
from collections.abc import Sequence

import grain

from marljax.rewards import Problem

__all__ = ["ProblemStream"]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)  # numpy ints too


class ProblemStream:
    """Batches (lists) of problems from a grain pipeline: shuffled per epoch, sharded, checkpointable.

    Pipeline: source -> shuffle(seed) -> slice(shard_index::shard_count) ->
    repeat(epochs) -> batch.  Grain folds the epoch into the shuffle seed, so
    each epoch is a fresh permutation of all problems; every process slices the
    same permutation, so within an epoch the shards are disjoint and cover all
    problems, and a process sees different problems in different epochs.

    Batches run across epoch boundaries; only the last batch of a finite stream
    can be short (dropped with ``drop_remainder``).  When ``shard_count`` does
    not divide ``len(problems)`` shards differ by one problem, so with finite
    ``epochs`` processes can run different numbers of steps.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        *,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        epochs: int | None = None,
        shard_index: int | None = None,
        shard_count: int | None = None,
        drop_remainder: bool = False,
    ):
        problems = list(problems)
        if (shard_index is None) != (shard_count is None):
            raise ValueError("pass both shard_index and shard_count, or neither")
        if shard_index is None:
            import jax  # one shard per host process

            shard_index, shard_count = jax.process_index(), jax.process_count()
        grain.sharding.ShardOptions(shard_index, shard_count)  # validates 0 <= index < count
        # grain needs exact ints; a float (even 2.0 or inf) would fail deep inside it
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if epochs is not None and (not _is_int(epochs) or epochs < 1):
            raise ValueError(f"epochs must be None (forever) or an int >= 1, got {epochs!r}")
        if not _is_int(seed) or not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
        batch_size, seed = int(batch_size), int(seed)  # plain ints: the state is JSON
        epochs = None if epochs is None else int(epochs)

        ds = grain.MapDataset.source(problems)
        if shuffle:
            ds = ds.shuffle(seed=seed)
        ds = ds[shard_index::shard_count]
        self.epoch_size = len(ds)  # problems per epoch in this shard
        if self.epoch_size == 0:
            raise ValueError(f"shard {shard_index} of {shard_count} is empty ({len(problems)} problems)")
        # repeat(None) has length sys.maxsize, and grain's batch takes ceil(length / batch_size)
        # in floats: 2**63 for batch_size 1, which len() cannot return (OverflowError).  Floor
        # division is exact, and an endless stream has no last batch to keep or drop anyway.
        drop_remainder = drop_remainder or epochs is None
        ds = ds.repeat(epochs).batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
        # Elements are in memory: no reader threads or prefetch buffer (grain's default is 16 threads).
        self._dataset = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        self._iter = iter(self._dataset)
        self.batch_size = batch_size
        # What fixes the order; a state from a stream that differs in any of these would not resume it.
        ids = "\n".join(p.id for p in problems).encode()
        self._config = {
            "num_problems": len(problems),
            "ids_crc32": zlib.crc32(ids),
            "batch_size": batch_size,
            "seed": seed,
            "shuffle": shuffle,
            "shard_index": shard_index,
            "shard_count": shard_count,
        }

    def __iter__(self) -> ProblemStream:
        return self

    def __next__(self) -> list[Problem]:
        return next(self._iter)

    next_batch = __next__

    @property
    def step(self) -> int:
        """Batches served so far."""
        return int(self._iter.get_state()["next_index"])

    @property
    def epoch(self) -> int:
        """Completed epochs of this shard (problems served // epoch_size)."""
        return self.step * self.batch_size // self.epoch_size

    @property
    def steps_per_epoch(self) -> float:
        """Batches per epoch; fractional when ``batch_size`` does not divide ``epoch_size``."""
        return self.epoch_size / self.batch_size

    def get_state(self) -> dict:
        """A JSON-serialisable position; ``set_state`` on a stream built the same way resumes from it."""
        return {"next_index": self.step, **self._config}

    def set_state(self, state: dict) -> None:
        differs = sorted(k for k, v in self._config.items() if state.get(k) != v)
        if differs:
            raise ValueError(
                f"state is from a different stream: {', '.join(differs)} differ "
                f"(state {[state.get(k) for k in differs]}, stream {[self._config[k] for k in differs]})"
            )
        self._iter.set_state({"next_index": int(state["next_index"])})
