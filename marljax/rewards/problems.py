"""A task to solve: its prompt, how an answer is checked, and the facts workflows ask about it.

Schemas: ``humaneval``, ``mbpp`` and ``stdio`` rows are code problems (an
answer's program runs against the row's tests), ``math`` rows have a reference
answer, and ``plan`` problems are the grid game of `marljax.envs.grid`. The raw
row stays in ``fields`` (JSON-able); the accessors below are the only readers
of row keys outside the loader (`marljax.tasks.rows`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from .formats import Program, humaneval_program, io_program, mbpp_program

# The function an MBPP test calls: `assert f(...)`, `assert not f(...)`, `assert (f(...))`.
_MBPP_CALL = re.compile(r"\s*assert\s+(?:not\s+)?\(?\s*([A-Za-z_]\w*)\s*\(")


@dataclasses.dataclass(frozen=True)
class Problem:
    id: str
    prompt: str  # the text shown to the model
    schema: str  # humaneval | mbpp | stdio | math | plan
    source: str  # "path:line"
    fields: Mapping[str, Any]  # the raw row

    def program(self, code: str) -> Program:
        """This problem's tests around the untrusted ``code`` (code schemas only)."""
        f = self.fields
        if self.schema == "humaneval":
            return humaneval_program(f, code)
        if self.schema == "mbpp":
            return mbpp_program(
                code,
                f["test_list"],
                setup=f.get("test_setup_code") or "",
                challenge_tests=f.get("challenge_test_list") or (),
                test_imports=f.get("test_imports") or (),
            )
        if self.schema == "stdio":
            return io_program(
                code, f["inputs"], f["outputs"], fn_name=f.get("fn_name"), public=f.get("public")
            )
        raise ValueError(
            f"{self.source}: {self.schema} problems have no program (problem {self.id!r}); "
            "score them with .answer"
        )

    @property
    def is_math(self) -> bool:
        """Answers are checked against a reference answer, not run."""
        return self.schema == "math"

    @property
    def answer(self) -> str | None:
        """The reference answer of a math problem (as text); None for other problems."""
        return str(self.fields["answer"]) if self.is_math else None

    @property
    def solution(self) -> str | None:
        """A reference program that passes every test, when the row has one."""
        return self.fields.get("solution")

    @property
    def entry_point(self) -> str | None:
        """The function the tests call; None for a stdin/stdout program or when it cannot be told."""
        f = self.fields
        if self.schema == "humaneval":
            return f["entry_point"]
        if self.schema == "stdio":
            return f.get("fn_name")
        if self.schema == "mbpp":
            m = _MBPP_CALL.match(f["test_list"][0])
            return m.group(1) if m else None
        return None
