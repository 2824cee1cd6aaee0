"""Code extraction from model text."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# An opening fence with an optional language tag, the body, a closing fence.
_FENCE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([\w+#.-]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S)
_PY_TAGS = {"python", "py", "python3", "py3", ""}


@dataclass(frozen=True)
class ExtractedCode:
    """``code`` ('' when nothing usable); ``syntax_ok``; ``error`` from the parser; ``source`` where it came from."""

    code: str
    syntax_ok: bool
    error: str | None
    source: str  # "fence" | "text" | "none"


def extract_code(text: str) -> ExtractedCode:
    """The last fenced python block (untagged fences count), else the whole text; syntax-checked.

    Blocks tagged with another language (```bash, ```json, ...) are ignored.
    An unterminated final fence (a truncated generation) is taken up to the end.
    """
    text = text or ""
    blocks = [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(text)]
    py = [body for tag, body in blocks if tag in _PY_TAGS]
    source = "fence"
    if py:
        code = py[-1]
    else:
        # A truncated answer: an opening python fence that never closes.
        opened = list(re.finditer(r"^[ \t]*```[ \t]*(python|py|python3)?[ \t]*\n", text, re.M))
        if opened and text.count("```") % 2 == 1:
            code = text[opened[-1].end() :]
        elif blocks:  # only non-python blocks
            return ExtractedCode("", False, "no python code block", "none")
        else:
            code, source = text, "text"
    code = code.strip("\n")
    if not code.strip():
        return ExtractedCode("", False, "empty code", "none")
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return ExtractedCode(code, False, f"{type(exc).__name__}: {exc}", source)
    return ExtractedCode(code, True, None, source)
