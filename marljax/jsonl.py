"""JSON Lines files: the one reader every data file goes through (problems, QA rows, corpora).

    for where, row in read_jsonl("data/train.jsonl.gz"):   # where = "data/train.jsonl.gz:7"
        ...

A ``.gz`` path is decompressed; blank lines are skipped. Every failure is a :class:`DataError`
whose message starts with the file (and line), so a bad row is reported where it is.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["DataError", "line_number", "read_jsonl", "write_jsonl"]


class DataError(ValueError):
    """A bad data file or row; the message starts with ``"path:line: "`` (or ``"path: "``)."""


def _open_text(path: str, mode: str):
    if path.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each non-blank line, ``where`` being ``"path:line"`` for messages."""
    path = os.fspath(path)
    try:
        with _open_text(path, "r") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: invalid JSON: {e}") from None
                yield where, row
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:  # a truncated or non-gzip .gz, bad bytes
        raise DataError(f"{path}: cannot read: {e}") from None


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write one JSON object per line (gzip-compressed when ``path`` ends in ``.gz``)."""
    path = Path(path)
    with _open_text(str(path), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def line_number(where: str) -> int:
    """The line of a ``"path:line"`` place from `read_jsonl`."""
    return int(where.rpartition(":")[2])
