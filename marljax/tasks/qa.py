"""Real question sets from JSONL files: the ``qa`` source (for the tool workflows)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from marljax.envs.search import Passage
from marljax.jsonl import DataError, line_number, read_rows
from marljax.rewards import Problem

from .files import FileSource
from .sources import register_source

__all__ = ["QaSource", "load_qa_jsonl"]


def load_qa_jsonl(path: str | os.PathLike) -> tuple[list[Problem], list[Passage]]:
    """Questions (schema ``qa``) and the passages of their contexts from a JSONL file of rows in
    one of these forms (keys checked per row; a bad row is a ValueError naming file and line):

    * HotpotQA: ``{"_id", "question", "answer", "context": [[title, [sentence, ...]], ...]}``;
    * MuSiQue: ``{"id", "question", "answer", "answer_aliases", "paragraphs": [{"title",
      "paragraph_text"}, ...]}``;
    * plain: ``{"id"?, "question", "answer" or "answers": [...]}`` (bring a corpus with
      `marljax.envs.search.load_corpus`).
    Each problem keeps its own passages (``fields["passages"]``, the distractor setting); the
    corpus returned holds them all, deduplicated by (title, text)."""
    problems, passages, seen = [], [], set()
    for where, row in read_rows(path):
        if not isinstance(row, dict) or not isinstance(row.get("question"), str):
            raise DataError(f"{where}: a row needs a 'question' string")
        answers = _row_answers(row, where)
        own = _row_passages(row, where)
        for title, text in own:
            if (title, text) not in seen:
                seen.add((title, text))
                passages.append(Passage(f"{len(passages)}", title, text))
        qid = str(row.get("_id", row.get("id", line_number(where) - 1)))
        fields = {"question": row["question"], "answers": answers, "passages": [list(p) for p in own]}
        problems.append(Problem(qid, row["question"], "qa", where, fields))
    return problems, passages


def _row_answers(row: Mapping[str, Any], where: str) -> list[str]:
    if "answers" in row:
        answers = row["answers"]
        if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
            raise DataError(f"{where}: 'answers' must be a non-empty list of strings")
        return list(answers)
    if not isinstance(row.get("answer"), str):
        raise DataError(f"{where}: a row needs an 'answer' string or an 'answers' list")
    aliases = row.get("answer_aliases", [])
    if not (isinstance(aliases, list) and all(isinstance(a, str) for a in aliases)):
        raise DataError(f"{where}: 'answer_aliases' must be a list of strings")
    return [row["answer"], *aliases]


def _row_passages(row: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    out = []
    if "context" in row:  # HotpotQA
        try:
            for title, sentences in row["context"]:
                out.append((str(title), "".join(sentences).strip()))
        except (TypeError, ValueError):
            raise DataError(f"{where}: 'context' must be a list of [title, [sentence, ...]]") from None
    for p in row.get("paragraphs", []):  # MuSiQue
        if not isinstance(p, dict) or not isinstance(p.get("paragraph_text"), str):
            raise DataError(f"{where}: each of 'paragraphs' needs a 'paragraph_text' string")
        out.append((str(p.get("title", "")), p["paragraph_text"].strip()))
    return out


@register_source("qa")
class QaSource(FileSource):
    """HotpotQA / MuSiQue / ``{question, answer}`` rows (`load_qa_jsonl`), each problem with the
    passages of its own context."""

    kind: Literal["qa"] = "qa"

    def load(self, path: str) -> list[Problem]:
        return load_qa_jsonl(path)[0]
