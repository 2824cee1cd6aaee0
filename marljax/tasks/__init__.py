"""Where problems come from: registered sources (``data.source.kind`` in a run config), the row
schemas of dataset files, and the generated task sets.

    source = cfg.data.source              # a validated Source: JsonlSource, SyntheticSource, ...
    train, held_out = source.split("train"), source.split("eval")

Every module of this package is imported here, so each registers its source; a source defined
elsewhere registers with `@register_source` once its module is imported (`sources.py`).
"""

import importlib
import pkgutil

from marljax.jsonl import DataError, read_jsonl, write_jsonl
from marljax.tasks.code import (
    SyntheticSource,
    SyntheticTask,
    make_step_task,
    make_task,
    make_tasks,
    synthetic_rows,
)
from marljax.tasks.files import JsonlSource, load_problems
from marljax.tasks.grid import GridSource, make_grid_problems
from marljax.tasks.qa import QaSource, load_qa_jsonl
from marljax.tasks.rows import SCHEMAS, detect_schema, parse_row
from marljax.tasks.sources import EVAL_SEED_OFFSET, SOURCES, GeneratedSource, Source, register_source
from marljax.tasks.tools import ToolTasks, make_arithmetic, make_multihop

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "EVAL_SEED_OFFSET",
    "SCHEMAS",
    "SOURCES",
    "DataError",
    "GeneratedSource",
    "GridSource",
    "JsonlSource",
    "QaSource",
    "Source",
    "SyntheticSource",
    "SyntheticTask",
    "ToolTasks",
    "detect_schema",
    "load_problems",
    "load_qa_jsonl",
    "make_arithmetic",
    "make_grid_problems",
    "make_multihop",
    "make_step_task",
    "make_task",
    "make_tasks",
    "parse_row",
    "read_jsonl",
    "register_source",
    "synthetic_rows",
    "write_jsonl",
]
