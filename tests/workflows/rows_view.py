"""Each completion of a rollout as one record, for tests that assert on completions one by one."""

from __future__ import annotations

import dataclasses
import types

from marljax.workflows.types import Rollout, Rows


def each_row(rows: Rollout | Rows) -> list[types.SimpleNamespace]:
    """Row i of `rows` (a rollout's `rows`) as a namespace of its columns' i-th entries."""
    rows = rows.rows if isinstance(rows, Rollout) else rows
    columns = [f.name for f in dataclasses.fields(Rows)]
    return [types.SimpleNamespace(**{c: getattr(rows, c)[i] for c in columns}) for i in range(len(rows))]
