"""Problems from JSONL files of dataset rows (``.gz`` is decompressed): the ``jsonl`` source.

    problems = load_problems("data/train.jsonl.gz")   # schema inferred per row

Row schemas live in :mod:`marljax.tasks.rows`.
"""

from __future__ import annotations

import abc
import os
import warnings
from typing import Literal

from pydantic import Field

from marljax.jsonl import DataError, read_rows
from marljax.rewards import Problem

from .rows import parse_row
from .sources import SPLITS, Source, register_source

__all__ = ["JsonlSource", "load_problems"]


def load_problems(path, schema: str = "auto") -> list[Problem]:
    """Problems of a data file (`marljax.jsonl.read_rows`: JSONL, parquet, a saved datasets split).

    Raises :class:`DataError` naming ``path:line`` for invalid JSON, a row that
    does not fit its schema, or an id seen before (naming both lines), and naming the file when
    it holds no rows.
    """
    problems = _read_problems(path, schema)
    if not problems:
        raise DataError(no_problems(path))
    return problems


def no_problems(path, key: str | None = None) -> str:
    """What is wrong with a data file without rows; `key`: the config key that names it."""
    return f"{os.fspath(path)}: no problems{f' in {key}' if key else ''} (the file is empty or holds only blank lines)"


def _read_problems(path, schema: str) -> list[Problem]:
    problems, first_seen = [], {}
    for where, row in read_rows(path):
        problem = parse_row(row, schema, where)
        if problem.id in first_seen:
            raise DataError(f"{where}: duplicate id {problem.id!r} (first at {first_seen[problem.id]})")
        first_seen[problem.id] = where
        problems.append(problem)
    return problems


class FileSource(Source):
    """A source reading each split from a file (no eval file: no eval problems)."""

    train: str = Field(description="training problems: JSONL, parquet, or a saved datasets split")
    eval: str | None = Field(None, description="evaluation problems (as train)")

    def split(self, split: Literal["train", "eval"]) -> list[Problem]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        path = self.train if split == "train" else self.eval
        if path is None:
            return []
        problems = self.load(path)
        if not problems:  # the key too: an empty file is often the wrong one named
            raise DataError(no_problems(path, f"data.source.{split}"))
        return problems

    @abc.abstractmethod
    def load(self, path: str) -> list[Problem]:
        """The problems of one file (none for a file without rows)."""


# `schema` shadows a deprecated BaseModel method; the key name is part of the YAML format, so keep it.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*shadows an attribute in parent.*")

    @register_source("jsonl")
    class JsonlSource(FileSource):
        """Dataset rows of the schemas of :mod:`marljax.tasks.rows`."""

        kind: Literal["jsonl"] = "jsonl"
        schema: Literal["auto", "humaneval", "mbpp", "stdio", "math"] = Field(
            "auto", description="the rows' schema; auto: inferred per row from its keys"
        )

        def load(self, path: str) -> list[Problem]:
            return _read_problems(path, self.schema)
