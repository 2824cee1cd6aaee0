"""Training metrics: a JSONL log, TensorBoard scalars, Weights & Biases and progress bars.

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
repaired when a writer reopens the file. The trainer fsyncs the file
(`MetricsWriter.sync`) before each checkpoint, so no checkpoint is ever ahead
of the metrics it follows.

Restarts. A run resumed from the checkpoint at step S keeps the records of
steps <= S, each once (`MetricsWriter.resume`); a run that starts from its
initial weights moves the old files and TensorBoard folder to
``RUN_DIR/set_aside/`` (`MetricsWriter.start_afresh`). The writer keeps every
record twice, in ``metrics.jsonl`` and in ``metrics.mirror.jsonl``, so that
damage to one file loses nothing: a corrupt line is skipped with a warning
naming ``file:line``, its record is taken from the other file, and a writer
that meets one keeps a copy of the damaged file in ``RUN_DIR/set_aside/`` and
rewrites both.

Sinks. Besides the two files, a writer sends each record to the sinks in ``log_to``
(`train.log_to`): ``tensorboard`` (event files in ``RUN_DIR/tensorboard/``) and ``wandb`` (a
Weights & Biases run, files in ``RUN_DIR/wandb/``). The wandb run's id is kept in
``RUN_DIR/wandb/run_id``, so a resumed run continues the same wandb run. wandb takes only
increasing steps of its own, so each record is logged with its step as a metric (``step``, the
x axis of every chart): SFT's negative steps are kept, and where a resume redoes steps the wandb
run holds both tries (the files and TensorBoard hold the redone ones; with fixed seeds they are
equal). A run that starts afresh moves ``wandb/`` aside with the rest and starts a new wandb run.

Only process 0 writes on multi-host runs: on other processes the writer and
the progress bar are no-ops.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from marljax.train.files import report, set_aside_path, write_atomically

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
MIRROR_FILE = "metrics.mirror.jsonl"  # the same records: what survives damage to one of the two
SINKS = ("tensorboard", "wandb")
WANDB_ID_FILE = "wandb/run_id"
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


def _parse(path: Path) -> tuple[list[dict], bool, list[str]]:
    """(records, torn, corrupt) of a metrics file: torn when it does not end with a newline,
    corrupt the ``"file:line (reason)"`` of each other line that is not a record.

    Each line is written with its newline last, so only an unterminated final
    line can have been cut by a kill: it is dropped silently if it does not parse.
    """
    # bytes that are not UTF-8 are damage like any other: they fail the line's parse
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    torn = lines[-1] != ""
    records, corrupt = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not an object with an integer step")
        except ValueError as e:
            if not (torn and i == len(lines) - 1):
                corrupt.append(f"{path}:{i + 1} ({e})")
            continue
        records.append(_decode(record))
    return records, torn, corrupt


def _corrupt_message(corrupt: list[str]) -> str:
    shown = "; ".join(corrupt[:5]) + (f"; and {len(corrupt) - 5} more" if len(corrupt) > 5 else "")
    return f"skipped {len(corrupt)} corrupt metrics line(s): {shown}"


def _read_both(run_dir: Path) -> tuple[list[dict], bool, dict[Path, list[str]]]:
    """(records, damaged, corrupt lines by file) of a run's metrics file and its mirror.
    Undamaged: the main file's records in file order. Damaged (a torn or corrupt line, or the two
    files differ): one record per step, by step, each from the main file where it is whole there,
    else from the mirror."""
    parsed = []
    for name in (METRICS_FILE, MIRROR_FILE):
        path = run_dir / name
        parsed.append((path, *_parse(path)) if path.is_file() else (path, [], False, []))
    corrupt = {path: bad for path, _, _, bad in parsed if bad}
    (_, main, main_torn, _), (mirror_path, mirror, mirror_torn, _) = parsed
    damaged = bool(corrupt) or main_torn or mirror_torn or main != mirror
    if not damaged or not mirror_path.is_file():  # no mirror (a run older than it): the main file's
        return main, damaged, corrupt
    by_step = {r["step"]: r for r in mirror} | {r["step"]: r for r in main}
    return sorted(by_step.values(), key=lambda r: r["step"]), damaged, corrupt


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """Records of ``RUN_DIR/metrics.jsonl`` in file order, completed from its mirror where a line
    is damaged (then one per step, by step).

    A torn last line is skipped; a corrupt line elsewhere is skipped with a
    RuntimeWarning naming ``file:line``. Raises FileNotFoundError when the file
    is missing.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    records, _, corrupt = _read_both(Path(run_dir))
    if corrupt:
        report(logger, _corrupt_message([line for lines in corrupt.values() for line in lines]))
    return records


class MetricsWriter:
    """Appends metric records to ``RUN_DIR/metrics.jsonl`` and the sinks in ``log_to``.

    ``wandb``: keyword arguments for ``wandb.init`` (project, entity, mode, name, config); the
    writer sets its directory, id and resumption. ``enabled`` defaults to
    ``jax.process_index() == 0``; a disabled writer creates no files and all its methods do
    nothing.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        log_to: Sequence[str] = ("tensorboard",),
        wandb: Mapping[str, Any] | None = None,
        enabled: bool | None = None,
    ):
        unknown = [s for s in log_to if s not in SINKS]
        if unknown:
            raise ValueError(f"unknown metrics sink(s) {unknown}; known: {', '.join(SINKS)}")
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.paths = (self.path, self.run_dir / MIRROR_FILE)
        self.enabled = _is_main_process() if enabled is None else bool(enabled)
        self.log_to = tuple(log_to)
        self._wandb_settings = dict(wandb or {})
        self._files: list = []
        self._tb = None
        self._wandb = None
        self._purge_step: int | None = None
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if any(p.is_file() for p in self.paths):
            records, damaged, corrupt = _read_both(self.run_dir)
            for path, lines in corrupt.items():  # a copy of the damage for a person to look at
                kept = set_aside_path(self.run_dir, path.name)
                shutil.copyfile(path, kept)
                report(logger, f"{_corrupt_message(lines)}; the file as it was is kept at {kept}")
            if damaged:  # appending after a torn line would glue two records into one corrupt line
                self._rewrite(records)
        self._open()

    def _open(self) -> None:
        self._files = [open(path, "a", encoding="utf-8") for path in self.paths]

    def _close_files(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def _rewrite(self, records: list[dict]) -> None:
        """Replace both files with `records`, each atomically (a crash leaves the old or the new
        file, and the other one whole)."""
        reopen = bool(self._files)
        self._close_files()
        for path in self.paths:
            write_atomically(path, "".join(_dumps(r) for r in records))
        if reopen:
            self._open()

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

    def _wandb_run(self):
        # Opened on first use, as TensorBoard's writer: a run that starts afresh has moved the old
        # id aside by then and gets a new one.
        if self._wandb is None:
            import wandb

            id_file = self.run_dir / WANDB_ID_FILE
            if id_file.is_file():
                run_id = id_file.read_text().strip()
            else:
                run_id = secrets.token_hex(6)  # wandb's ids are short letters and digits
                id_file.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(id_file, run_id + "\n")
            settings = dict(self._wandb_settings)
            settings["project"] = settings.get("project") or os.environ.get("WANDB_PROJECT", "marljax")
            self._wandb = wandb.init(dir=str(self.run_dir), id=run_id, resume="allow", **settings)
            # wandb drops a record whose own step is not above the last one's: SFT's steps are
            # negative and a resume redoes steps, so every record carries its step as the x axis
            self._wandb.define_metric("step")
            self._wandb.define_metric("*", step_metric="step")
        return self._wandb

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one record ``{"step", "time", **metrics}`` and flush it."""
        if not self.enabled:
            return
        if not self._files:
            raise ValueError(f"MetricsWriter for {self.path} is closed")
        values = {}
        for key, value in metrics.items():
            if key in ("step", "time"):
                raise ValueError(f"metric key {key!r} is reserved")
            values[key] = _to_number(key, value)
        step = int(step)
        line = _dumps({"step": step, "time": time.time(), **values})
        for f in self._files:
            f.write(line)
            f.flush()  # a killed process loses no record; a power cut needs sync()
        if "wandb" in self.log_to:
            self._wandb_run().log({"step": step, **values})
        if "tensorboard" in self.log_to:
            from tensorboardX import summary
            from tensorboardX.proto.summary_pb2 import Summary

            # one event per step through tensorboardX's file writer (which writes the purge step
            # when it is made), since add_scalar sends each value as its own event through a
            # multiprocessing queue
            tb = self._summary_writer()
            merged = Summary(value=[v for key, x in values.items() for v in summary.scalar(key, x).value])
            tb._get_file_writer().add_summary(merged, step)
            tb.flush()

    def sync(self) -> None:
        """Make every record written so far durable (before a checkpoint that follows them)."""
        for f in self._files:
            f.flush()
            os.fsync(f.fileno())

    def resume(self, step: int) -> None:
        """Keep the records of steps <= ``step``, one per step (a run resumed from the checkpoint
        at ``step``: the later steps are redone).

        Of several records of one step (a file older versions appended a rerun to) the last is
        kept. TensorBoard events after ``step`` are hidden through tensorboardX's ``purge_step``
        on the next event file; the wandb run goes on under its id (see the module's docstring).
        """
        if not self.enabled:
            return
        step = int(step)
        kept = {r["step"]: r for r in read_metrics(self.run_dir) if r["step"] <= step}
        self._rewrite(sorted(kept.values(), key=lambda r: r["step"]))
        self._purge_step = step + 1
        self._close_sinks()

    def start_afresh(self) -> None:
        """A run that starts from its initial weights: move an old metrics file, TensorBoard
        folder and wandb folder (with the wandb run's id) to ``RUN_DIR/set_aside/`` (they describe
        a run that is not continued) and go on with empty ones."""
        if not self.enabled:
            return
        self._close_sinks()
        moved = []
        for path in (*self.paths, self.run_dir / "tensorboard", self.run_dir / "wandb"):
            if path.exists() and (path.is_dir() or path.stat().st_size > 0):
                moved.append(set_aside_path(self.run_dir, path.name))
                os.replace(path, moved[-1])
        if moved:
            if self._files:  # they now write to the moved files
                self._close_files()
                self._open()
            where = " and ".join(map(str, moved))
            report(
                logger,
                f"no checkpoint to resume from: the run starts afresh; its earlier metrics are kept at {where}",
            )

    def _close_sinks(self, exit_code: int = 0) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish(exit_code=exit_code)
            self._wandb = None

    def close(self, exit_code: int = 0) -> None:
        """Close the files and sinks; a nonzero ``exit_code`` marks the wandb run failed."""
        self._close_files()
        self._close_sinks(exit_code)

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(exit_code=0 if exc_type is None else 1)


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

    def note(self, text: str) -> None:
        """Show `text` in place of the numbers until the next update: what a long pause is spent on."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def task_progress(label: str, total: int, file: TextIO | None = None) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`: `n` more of an evaluation's `total` tasks are done. On a terminal, a
    progress bar (`Progress`, on stderr like the training bars); elsewhere (a CI log, a
    file) one line as the evaluation starts and one as it ends, since a bar redraws itself
    with carriage returns that a log keeps as one garbled line."""
    file = file or sys.stderr
    if file.isatty():
        with Progress(total, desc=label, file=file) as bar:
            yield bar.update
        return
    done, start = 0, time.perf_counter()
    print(f"{label}: {total} tasks ...", file=file, flush=True)

    def advance(n: int) -> None:
        nonlocal done
        done += n

    yield advance
    print(f"{label}: {done}/{total} tasks done in {time.perf_counter() - start:.0f} s", file=file, flush=True)
