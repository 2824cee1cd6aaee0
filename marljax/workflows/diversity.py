"""Diversity of sampled programs: are a group's answers really different, or one program in disguise?

Three views of a list of programs (usually the G answers of one problem):

* distinct programs: the fraction of distinct programs after normalisation
  (``ast.unparse(ast.parse(code))`` drops comments and layout; text that does
  not parse is compared with its whitespace collapsed);
* algorithmic variety: the number of distinct AST shapes divided by the number
  of programs, where a shape is the sequence of node types of ``ast.walk``
  (identifiers and constants erased, so renaming a variable or changing a
  literal keeps the shape; a different algorithm changes it);
* surface variety: ``1 - mean_{i<j} J(i, j)``, J the Jaccard overlap of the
  token 3-gram sets of two normalised programs (renaming changes the surface).

A single program has distinct = algorithmic = 1 and surface variety 0 (no
pair to differ); no program gives zeros.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence

import numpy as np

from marljax.rewards import extract_code

_TOKEN = re.compile(r"\w+|[^\w\s]")


def _parse(code: str) -> ast.AST | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def normalize_program(code: str) -> str:
    """The program without comments and layout differences (collapsed whitespace if it does not parse)."""
    tree = _parse(code)
    if tree is None:
        return " ".join(code.split())
    return ast.unparse(tree)


def ast_shape(code: str) -> str:
    """A hash of the program's node-type sequence (identifiers and constants erased); unparseable
    text gets a bucket of its own normalised text."""
    tree = _parse(code)
    key = (
        "ast:" + " ".join(type(n).__name__ for n in ast.walk(tree))
        if tree is not None
        else "text:" + normalize_program(code)
    )
    return hashlib.sha1(key.encode()).hexdigest()


def ngrams(code: str, n: int = 3) -> set[tuple[str, ...]]:
    """Token n-grams of the normalised program (the whole token list when shorter than n)."""
    tokens = _TOKEN.findall(normalize_program(code))
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b|; two empty sets are identical (1)."""
    return 1.0 if not (a or b) else len(a & b) / len(a | b)


def diversity_metrics(codes: Sequence[str], prefix: str, n: int = 3) -> dict[str, float]:
    """`{prefix}/distinct_programs`, `{prefix}/algorithmic_variety`, `{prefix}/surface_variety` (module doc)."""
    keys = [f"{prefix}/{k}" for k in ("distinct_programs", "algorithmic_variety", "surface_variety")]
    if not codes:
        return dict.fromkeys(keys, 0.0)
    count = len(codes)
    distinct = len({normalize_program(c) for c in codes}) / count
    shapes = len({ast_shape(c) for c in codes}) / count
    grams = [ngrams(c, n) for c in codes]
    pairs = [jaccard(a, b) for a, b in itertools.combinations(grams, 2)]
    surface = 1.0 - float(np.mean(pairs)) if pairs else 0.0
    return dict(zip(keys, (distinct, shapes, surface)))


def grouped_diversity(groups: Sequence[Sequence[str]], prefix: str) -> dict[str, float]:
    """`diversity_metrics` of each non-empty group (e.g. the G programs of one problem), averaged."""
    per_group = [diversity_metrics(g, prefix) for g in groups if len(g)]
    if not per_group:
        return diversity_metrics([], prefix)
    return {k: float(np.mean([m[k] for m in per_group])) for k in per_group[0]}


def per_agent_diversity(
    samples_texts_by_agent: Mapping[str, Sequence[str] | Sequence[Sequence[str]]],
) -> dict[str, float]:
    """Diversity of each agent's completions, keys `agent/<name>/<metric>`.

    Each value is either a list of completion texts (one group) or a list of
    groups (e.g. one per problem; metrics averaged over groups). Code is taken
    from the texts with `extract_code` (the whole text when it holds no fence).
    """
    out: dict[str, float] = {}
    for name, texts in samples_texts_by_agent.items():
        groups = [texts] if not texts or isinstance(texts[0], str) else texts
        codes = [[extract_code(t).code or t for t in g] for g in groups]
        out.update(grouped_diversity(codes, f"agent/{name}"))
    return out
