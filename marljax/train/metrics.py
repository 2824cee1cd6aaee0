"""Training metrics: a JSONL log, TensorBoard scalars and a progress bar.

Key convention. A record is a flat dict of numbers with slash-separated keys:

- ``agent/<agent>/<metric>``: per agent, e.g. ``agent/coder/reward``,
  ``agent/coder/pass_rate``, ``agent/coder/adv_mean``;
- ``policy/<policy>/<metric>``: per trained policy, e.g. ``policy/main/loss``,
  ``policy/main/kl_ref``, ``policy/main/entropy``, ``policy/main/grad_norm``;
- free keys such as ``time/step_s`` or ``eval/pass_at_1``.

Every record also has ``step`` (int); ``metrics.jsonl`` adds ``time`` (unix
seconds). ``marljax.train.plot`` relies on this layout.

File format. ``RUN_DIR/metrics.jsonl`` holds one JSON object per line. Values
are Python ints or floats; NaN and +-Inf, which strict JSON cannot hold, are
written as the strings ``"nan"``, ``"inf"`` and ``"-inf"`` and read back as
floats. Each line is flushed to the OS as it is written, so a killed process
loses at most the line in progress; that torn last line is skipped on read and
repaired when a writer reopens the file.

Only process 0 writes on multi-host runs: on other processes the writer and
the progress bar are no-ops.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from marljax.train.files import write_atomically

METRICS_FILE = "metrics.jsonl"
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# TensorBoard event file names carry only whole seconds and the host: a per-process counter keeps
# a writer opened in the same second (a resume, a second MetricsWriter) from overwriting the last file.
_TB_FILES = itertools.count(1)


def _is_main_process() -> bool:
    import jax

    return jax.process_index() == 0


def _to_number(key: str, value: Any) -> int | float:
    """Python int/float from a Python, numpy or jax scalar (0-d or size-1 array)."""
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(f"metric {key!r} must be a scalar, got shape {arr.shape}")
    item = arr.reshape(()).item()
    if isinstance(item, bool) or np.issubdtype(arr.dtype, np.integer):
        return int(item)
    if isinstance(item, (int, float)):
        return float(item)
    raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}")


def _encode(value: int | float) -> int | float | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _decode(record: dict) -> dict:
    return {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in record.items()}


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps({k: _encode(v) for k, v in record.items()}, allow_nan=False) + "\n"


def _parse(path: Path) -> tuple[list[dict], bool]:
    """(records, torn) of a metrics file; torn when it does not end with a newline.

    Each line is written with its newline last, so only an unterminated final
    line can have been cut by a kill: it is dropped if it does not parse.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    torn = lines[-1] != ""
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("not an object with a step")
        except ValueError as e:
            if torn and i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: corrupt metrics line ({e})") from None
        records.append(_decode(record))
    return records, torn


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """Records of ``RUN_DIR/metrics.jsonl`` in file order (torn last line skipped).

    Raises FileNotFoundError when the file is missing and ValueError naming
    ``file:line`` for a corrupt line before the last one.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    return _parse(path)[0]


class MetricsWriter:
    """Appends metric records to ``RUN_DIR/metrics.jsonl`` and TensorBoard.

    ``enabled`` defaults to ``jax.process_index() == 0``; a disabled writer
    creates no files and all its methods do nothing.
    """

    def __init__(self, run_dir: str | os.PathLike, *, tensorboard: bool = True, enabled: bool | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = _is_main_process() if enabled is None else bool(enabled)
        self.tensorboard = tensorboard
        self._file = None
        self._tb = None
        self._purge_step: int | None = None
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            records, torn = _parse(self.path)
            if torn:  # appending after a torn line would glue two records into one corrupt line
                self._rewrite(records)
        self._file = open(self.path, "a", encoding="utf-8")

    def _rewrite(self, records: list[dict]) -> None:
        """Replace metrics.jsonl with `records`, atomically (a crash leaves the old or the new file)."""
        if self._file is not None:
            self._file.close()
        write_atomically(self.path, "".join(_dumps(r) for r in records))
        if self._file is not None:
            self._file = open(self.path, "a", encoding="utf-8")

    def _summary_writer(self):
        # Opened on first use so that a resume() right after construction costs no extra event file.
        if self._tb is None:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(
                str(self.run_dir / "tensorboard"),
                purge_step=self._purge_step,
                filename_suffix=f".{os.getpid()}.{next(_TB_FILES)}",
            )
        return self._tb

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one record ``{"step", "time", **metrics}`` and flush it."""
        if not self.enabled:
            return
        if self._file is None:
            raise ValueError(f"MetricsWriter for {self.path} is closed")
        values = {}
        for key, value in metrics.items():
            if key in ("step", "time"):
                raise ValueError(f"metric key {key!r} is reserved")
            values[key] = _to_number(key, value)
        step = int(step)
        self._file.write(_dumps({"step": step, "time": time.time(), **values}))
        self._file.flush()
        if self.tensorboard:
            from tensorboardX import summary
            from tensorboardX.proto.summary_pb2 import Summary

            # one event per step through tensorboardX's file writer (which writes the purge step
            # when it is made), since add_scalar sends each value as its own event through a
            # multiprocessing queue
            tb = self._summary_writer()
            merged = Summary(value=[v for key, x in values.items() for v in summary.scalar(key, x).value])
            tb._get_file_writer().add_summary(merged, step)
            tb.flush()

    def resume(self, step: int) -> None:
        """Drop records after ``step`` (a run resumed from the checkpoint at ``step``).

        TensorBoard events after ``step`` are hidden through tensorboardX's
        ``purge_step`` on the next event file.
        """
        if not self.enabled:
            return
        step = int(step)
        self._rewrite([r for r in read_metrics(self.run_dir) if r["step"] <= step])
        self._purge_step = step + 1
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Progress:
    """tqdm progress bar with ETA and a short postfix of key numbers; silent off process 0.

    ``file`` is passed to tqdm (default stderr).
    """

    def __init__(
        self, total: int, *, initial: int = 0, desc: str = "train", enabled: bool | None = None, file=None
    ):
        self.enabled = _is_main_process() if enabled is None else bool(enabled)
        self._bar = None
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, file=file, dynamic_ncols=True)

    def update(self, n: int = 1, **numbers: Any) -> None:
        """Advance by ``n`` and show ``numbers`` (e.g. ``reward=0.41, kl=0.002``) with 3 significant digits."""
        if self._bar is None:
            return
        if numbers:
            postfix = " ".join(f"{k}={float(np.asarray(v)):.3g}" for k, v in numbers.items())
            self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
