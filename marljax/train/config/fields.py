"""The pieces the run configuration's models share: the frozen strict base model, and checks whose
problems keep their own key for the loader's messages (`raise_problems`)."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

from pydantic import ConfigDict
from pydantic_core import PydanticCustomError

from marljax.settings import StrictModel

# Policy and agent names become directory names, so keep them path-safe.
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
TEMPLATE_FIELDS = ("role", "problem", "feedback", "history")


def raise_problems(found: list[tuple[tuple, str, Any]]) -> None:
    """Raise the cross-field problems `(sub-key, message, value)` of one model together.

    The sub-keys travel in the error context so that `config_from_dict` can
    name the exact field instead of the enclosing model.
    """
    if found:
        summary = "; ".join(f"{'.'.join(map(str, k)) or '<model>'}: {m}" for k, m, _ in found)
        raise PydanticCustomError("config", "{summary}", {"summary": summary, "problems": found})


def name_problem(name: str) -> str | None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", ".."):
        return "name must match [A-Za-z0-9_.-]+ and not be '.' or '..' (it becomes a directory name)"
    return None


def format_problem(template: str, allowed: Sequence[str]) -> str | None:
    """Why `template` is not a `str.format` string over the names `allowed` (None if it is)."""
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        return f"malformed format string: {e}"
    bad = sorted(n for n in names if n not in allowed)
    if bad:
        return (
            f"unknown placeholder {', '.join('{' + n + '}' for n in bad)}; "
            f"allowed: {', '.join('{' + n + '}' for n in allowed)}"
        )
    try:  # catches what parse() lets through, e.g. placeholders nested in a format spec
        template.format(**{n: "" for n in allowed})
    except (ValueError, KeyError, IndexError) as e:
        return f"malformed format string: {e}"
    return None


class FrozenModel(StrictModel):
    """A strict model whose fields cannot be reassigned after validation; hashable when its fields are."""

    model_config = ConfigDict(frozen=True)
