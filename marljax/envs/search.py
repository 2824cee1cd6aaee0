"""BM25 search over a local corpus of passages (bm25s), and the `search` tool on top of it.

A corpus is a JSONL file, one passage per line: ``{"id": ..., "title": ..., "text": ...}``
(``contents`` is read as ``text``, the form of common retrieval corpora; ``id`` and ``title`` are
optional). Point the tool at your own file with `load_corpus`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

from marljax.envs.tools import Tool
from marljax.jsonl import DataError, line_number, read_jsonl


@dataclasses.dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


def load_corpus(path: str | os.PathLike) -> list[Passage]:
    """The passages of a JSONL corpus; a bad line is a `DataError` naming the file and line."""
    passages = []
    for where, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise DataError(f"{where}: a passage must be a JSON object")
        text = row.get("text", row.get("contents"))
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: a passage needs a non-empty 'text' (or 'contents') string")
        passages.append(Passage(str(row.get("id", line_number(where) - 1)), str(row.get("title", "")), text))
    if not passages:
        raise DataError(f"{os.fspath(path)}: the corpus has no passages")
    return passages


class BM25Index:
    """Top-k passages for a query by BM25 (the bm25s library; English stopwords, no stemming)."""

    def __init__(self, passages: Sequence[Passage]):
        import bm25s  # imported here: only runs with a search tool pay for it

        # bm25s sets its own logger to DEBUG: a line per index built would reach the console
        logging.getLogger("bm25s").setLevel(logging.WARNING)

        if not passages:
            raise ValueError("a BM25 index needs at least one passage")
        self.passages = list(passages)
        self._bm25s = bm25s
        tokens = bm25s.tokenize([f"{p.title} {p.text}" for p in self.passages], show_progress=False)
        # passages of stopwords and one-letter words only leave nothing to index (bm25s cannot)
        self._retriever = bm25s.BM25() if tokens.vocab else None
        if self._retriever is not None:
            self._retriever.index(tokens, show_progress=False)

    def search(self, query: str, k: int = 3) -> list[tuple[Passage, float]]:
        """Up to `k` passages with a positive score, best first (none for a query of stopwords only)."""
        tokens = self._bm25s.tokenize([query], show_progress=False)
        if self._retriever is None or not any(tokens.ids):  # nothing to match after stopwords, short tokens
            return []
        k = min(k, len(self.passages))
        docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        return [(self.passages[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]


def search_tool(index: BM25Index, k: int = 3, timeout_s: float = 5.0) -> Tool:
    """`search(query)`: the index's top `k` passages as numbered text."""

    def search(query: str) -> str:
        hits = index.search(query, k)
        if not hits:
            return "no results"
        return "\n".join(
            f"[{i}] {p.title + ': ' if p.title else ''}{p.text}" for i, (p, _) in enumerate(hits, 1)
        )

    return Tool("search", "Search the knowledge base for passages.", {"query": "string"}, search, timeout_s)
