"""Row schemas: one validated `Problem` per row of a dataset.

Schemas: ``humaneval`` (OpenAI HumanEval rows), ``mbpp`` (MBPP and sanitized
MBPP), ``stdio`` (LiveCodeBench / CodeContests / APPS input-output cases, on
stdin or call-based with ``fn_name``) and ``math`` (a problem and its reference
answer).  Rows are checked when they are read, so a bad row fails at load time
with its ``path:line`` instead of mid-training.  A
:class:`~marljax.rewards.problems.Problem` keeps its raw row in ``fields``
(JSON-able), so ``parse_row(p.fields, p.schema, p.source)`` rebuilds it.
"""

from __future__ import annotations

import json
from typing import Any

from marljax.jsonl import DataError
from marljax.rewards.problems import Problem

SCHEMAS = ("humaneval", "mbpp", "stdio", "math")
__all__ = ["SCHEMAS", "DataError", "Problem", "detect_schema", "parse_row"]


# ----------------------------------------------------------------- checking
def _type_name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


def _is(value, types) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)  # True is not an id or an answer


def _get(row: dict, keys: tuple[str, ...], types, schema: str, source: str, optional: bool = False):
    """The value of the first of ``keys`` present (None counts as absent), type-checked."""
    for key in keys:
        if row.get(key) is not None:
            if not _is(row[key], types):
                raise DataError(
                    f"{source}: key {key!r} must be {_type_name(types)}, "
                    f"got {type(row[key]).__name__} (schema {schema})"
                )
            return row[key]
    if optional:
        return None
    raise DataError(f"{source}: missing key {' or '.join(map(repr, keys))} (schema {schema})")


def _get_strs(row: dict, key: str, schema: str, source: str, optional: bool = False) -> list | None:
    value = _get(row, (key,), list, schema, source, optional)
    for i, item in enumerate(value or ()):
        if not isinstance(item, str):
            raise DataError(f"{source}: {key}[{i}] must be str, got {type(item).__name__} (schema {schema})")
    return value


def _humaneval(row: dict, source: str) -> tuple[Any, str]:
    for key in ("task_id", "prompt", "test", "entry_point"):
        _get(row, (key,), str, "humaneval", source)
    return row["task_id"], row["prompt"]


def _mbpp(row: dict, source: str) -> tuple[Any, str]:
    task_id = _get(row, ("task_id",), (str, int), "mbpp", source)
    prompt = _get(row, ("text", "prompt"), str, "mbpp", source)
    if not _get_strs(row, "test_list", "mbpp", source):
        raise DataError(f"{source}: key 'test_list' is empty (schema mbpp)")  # any code would pass
    _get_strs(row, "challenge_test_list", "mbpp", source, optional=True)
    _get_strs(row, "test_imports", "mbpp", source, optional=True)
    _get(row, ("test_setup_code",), str, "mbpp", source, optional=True)
    return task_id, prompt


def _check_case_input(value, i: int, fn_name: str | None, source: str) -> None:
    """Stdin cases are text; call cases are an argument list or one JSON value per line."""
    where = f"{source}: inputs[{i}]"
    if fn_name is None and not isinstance(value, str):
        raise DataError(f"{where} must be str (stdin text), got {type(value).__name__} (schema stdio)")
    if fn_name is not None and not isinstance(value, (str, list)):
        raise DataError(
            f"{where} must be a list of arguments or JSON lines, got {type(value).__name__} (schema stdio)"
        )
    if fn_name is not None and isinstance(value, str):
        for line in filter(str.strip, value.splitlines()):
            try:
                json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: line {line!r} is not JSON ({e}) (schema stdio)") from None


def _stdio(row: dict, source: str) -> tuple[Any, str]:
    task_id = _get(row, ("task_id", "id"), (str, int), "stdio", source)
    prompt = _get(row, ("question", "prompt"), str, "stdio", source)
    inputs = _get(row, ("inputs",), list, "stdio", source)
    outputs = _get(row, ("outputs",), list, "stdio", source)
    if not inputs:
        raise DataError(f"{source}: key 'inputs' is empty (schema stdio)")
    if len(outputs) != len(inputs):
        raise DataError(
            f"{source}: key 'outputs' has {len(outputs)} cases but 'inputs' has {len(inputs)} (schema stdio)"
        )
    fn_name = _get(row, ("fn_name",), str, "stdio", source, optional=True)
    if fn_name == "":
        raise DataError(f"{source}: key 'fn_name' is empty (schema stdio)")
    for i, value in enumerate(inputs):
        _check_case_input(value, i, fn_name, source)
    for i, value in enumerate(outputs if fn_name is None else ()):
        if not isinstance(value, str):
            raise DataError(
                f"{source}: outputs[{i}] must be str (stdout text), got {type(value).__name__} (schema stdio)"
            )
    public = _get(row, ("public",), int, "stdio", source, optional=True)
    if public is not None and not 0 <= public <= len(inputs):
        raise DataError(f"{source}: key 'public' must be in 0..{len(inputs)}, got {public} (schema stdio)")
    return task_id, prompt


def _math(row: dict, source: str) -> tuple[Any, str]:
    prompt = _get(row, ("problem", "question"), str, "math", source)
    _get(row, ("answer",), (str, int, float), "math", source)
    task_id = _get(row, ("id",), (str, int), "math", source, optional=True)
    return (source if task_id is None else task_id), prompt


_PARSERS = {"humaneval": _humaneval, "mbpp": _mbpp, "stdio": _stdio, "math": _math}


def detect_schema(row: dict, source: str) -> str:
    """The schema a row's keys announce (first match: entry_point, test_list, inputs+outputs, answer)."""
    if "entry_point" in row:
        return "humaneval"
    if "test_list" in row:
        return "mbpp"
    if "inputs" in row and "outputs" in row:
        return "stdio"
    if "answer" in row:
        return "math"
    raise DataError(
        f"{source}: cannot infer the schema from keys {sorted(row)}: expected 'entry_point' "
        "(humaneval), 'test_list' (mbpp), 'inputs' and 'outputs' (stdio) or 'answer' (math); "
        "pass schema= explicitly"
    )


def parse_row(row: dict, schema: str, source: str) -> Problem:
    """Validate one row against ``schema`` (or ``"auto"``) and wrap it in a :class:`Problem`."""
    if not isinstance(row, dict):
        raise DataError(f"{source}: expected a JSON object, got {type(row).__name__}")
    if schema == "auto":
        schema = detect_schema(row, source)
    if schema not in _PARSERS:
        raise DataError(f"{source}: unknown schema {schema!r}; expected one of {SCHEMAS} or 'auto'")
    task_id, prompt = _PARSERS[schema](row, source)
    return Problem(id=str(task_id), prompt=prompt, schema=schema, source=source, fields=dict(row))
