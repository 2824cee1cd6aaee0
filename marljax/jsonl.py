"""Data files: the one reader every data file goes through (problems, QA rows, corpora).

    for where, row in read_rows("data/train.jsonl.gz"):   # where = "data/train.jsonl.gz:7"
        ...

JSON Lines (a ``.gz`` path is decompressed; blank lines are skipped), and tables as most datasets
are held: a ``.parquet`` file, or a Hugging Face ``datasets`` split saved with ``save_to_disk``
(a directory of Arrow files with its ``state.json``); a table's ``where`` counts rows from 1.
Tables need ``pyarrow`` (``pip install 'marljax[data]'``). Every failure is a
:class:`DataError` whose message starts with the file (and line), so a bad row is reported where
it is.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["DataError", "line_number", "read_jsonl", "read_rows", "write_jsonl"]


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


def read_rows(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each row of a JSONL file, a parquet file or a saved ``datasets`` split."""
    path = os.fspath(path)
    if path.endswith(".parquet"):
        return _table_rows(path, _parquet)
    if os.path.isdir(path):
        return _table_rows(path, _saved_dataset)
    return read_jsonl(path)


def _table_rows(path: str, read) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow as pa
    except ImportError:
        raise DataError(f"{path}: reading tables needs pyarrow: pip install 'marljax[data]'") from None
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    try:
        rows = read(pa, path).to_pylist()
    except (OSError, KeyError, ValueError, pa.ArrowException) as e:
        raise DataError(f"{path}: cannot read: {e!r}") from None
    return ((f"{path}:{i}", row) for i, row in enumerate(rows, 1))


def _parquet(pa, path: str):
    import pyarrow.parquet as pq

    return pq.read_table(path)


def _saved_dataset(pa, path: str):
    """The table of one split written by ``datasets.Dataset.save_to_disk``: its Arrow files (IPC
    streams), in the order its ``state.json`` lists them."""
    if os.path.exists(os.path.join(path, "dataset_dict.json")):
        splits = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        example = f"{path}/{splits[0]}" if splits else f"{path}/train"
        raise DataError(f"{path}: a DatasetDict; name one of its splits, e.g. {example}")
    state = os.path.join(path, "state.json")
    if not os.path.exists(state):
        raise DataError(
            f"{path}: a directory without state.json (not a split saved by datasets' save_to_disk)"
        )
    with open(state, encoding="utf-8") as f:
        files = [entry["filename"] for entry in json.load(f)["_data_files"]]
    tables = []
    for name in files:
        with pa.memory_map(os.path.join(path, name)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables)


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
