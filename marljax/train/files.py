"""Files a crash must never leave half written, and a place for what a rerun cannot use."""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path

# What a rerun cannot use (a checkpoint that does not restore, an unreadable config record, a
# damaged metrics file, the metrics of a run that starts afresh) is moved here instead of being
# deleted, for a person to inspect; marljax never reads it.
SET_ASIDE = "set_aside"


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`: a crash or power cut leaves the old file or the new one, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())  # else a power cut can leave the renamed file empty
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # else a power cut can bring the old file back
    finally:
        os.close(fd)


def set_aside_path(run_dir: str | os.PathLike, name: str) -> Path:
    """A path not yet taken for `name` under ``RUN_DIR/set_aside/`` (the folder is made)."""
    folder = Path(run_dir) / SET_ASIDE
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    path, n = folder / stem, 1
    while path.exists():
        n += 1
        path = folder / f"{stem}.{n}"
    return path


def report(logger: logging.Logger, message: str) -> None:
    """Say `message` in the log and as a RuntimeWarning (which tests and notebooks see)."""
    logger.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
