"""Diversity metrics on hand-made programs: copies, renamings, different algorithms."""

from __future__ import annotations

import pytest

from marljax.workflows.diversity import (
    ast_shape,
    diversity_metrics,
    grouped_diversity,
    jaccard,
    ngrams,
    normalize_program,
    per_agent_diversity,
)

LOOP = "def total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n"
LOOP_NOISY = (
    "def total(xs):   # add them up\n    s = 0\n\n    for x in xs:  # each\n        s += x\n    return s"
)
LOOP_RENAMED = "def add_all(values):\n    acc = 0\n    for v in values:\n        acc += v\n    return acc\n"
BUILTIN = "def total(xs):\n    return sum(xs)\n"
RECURSIVE = "def total(xs):\n    return xs[0] + total(xs[1:]) if xs else 0\n"
KEYS = ("distinct_programs", "algorithmic_variety", "surface_variety")


def metrics(codes):
    m = diversity_metrics(codes, "x")
    return tuple(m[f"x/{k}"] for k in KEYS)


def test_normalisation_drops_comments_and_layout():
    assert normalize_program(LOOP_NOISY) == normalize_program(LOOP)
    assert (
        normalize_program("def f(:\n  pass   # broken") == "def f(: pass # broken"
    )  # unparseable: whitespace only


def test_identical_programs():
    assert metrics([LOOP, LOOP_NOISY, LOOP]) == (pytest.approx(1 / 3), pytest.approx(1 / 3), 0.0)


def test_renamed_variables_share_a_shape_but_not_a_surface():
    assert ast_shape(LOOP) == ast_shape(LOOP_RENAMED)
    assert ast_shape("x = 1") == ast_shape("y = 2")  # constants erased too
    distinct, algorithmic, surface = metrics([LOOP, LOOP_RENAMED])
    assert distinct == 1.0 and algorithmic == 0.5
    a, b = ngrams(LOOP), ngrams(LOOP_RENAMED)
    assert surface == pytest.approx(1 - len(a & b) / len(a | b)) and 0.5 < surface < 1


def test_different_algorithms_get_different_buckets():
    assert len({ast_shape(c) for c in (LOOP, BUILTIN, RECURSIVE)}) == 3
    distinct, algorithmic, surface = metrics([LOOP, BUILTIN, RECURSIVE, LOOP_RENAMED])
    assert (distinct, algorithmic) == (1.0, 0.75)
    grams = [ngrams(c) for c in (LOOP, BUILTIN, RECURSIVE, LOOP_RENAMED)]
    pairs = [jaccard(grams[i], grams[j]) for i in range(4) for j in range(i + 1, 4)]
    assert surface == pytest.approx(1 - sum(pairs) / 6)


def test_small_and_empty_inputs():
    assert metrics([]) == (0.0, 0.0, 0.0)
    assert metrics([LOOP]) == (1.0, 1.0, 0.0)
    assert ngrams("x") == {("x",)} and ngrams("") == set() and jaccard(set(), set()) == 1.0
    assert metrics(["", ""]) == (0.5, 0.5, 0.0)


def test_grouped_and_per_agent():
    m = grouped_diversity([[LOOP, LOOP], [LOOP, BUILTIN], []], "team")
    assert m["team/distinct_programs"] == pytest.approx(0.75) and m[
        "team/algorithmic_variety"
    ] == pytest.approx(0.75)
    fenced = [f"Here:\n```python\n{c}```" for c in (LOOP, LOOP_RENAMED)]
    out = per_agent_diversity({"coder": fenced, "tester": [[LOOP, LOOP], [BUILTIN]]})
    assert out["agent/coder/distinct_programs"] == 1.0 and out["agent/coder/algorithmic_variety"] == 0.5
    assert out["agent/tester/distinct_programs"] == pytest.approx((0.5 + 1.0) / 2)
    assert set(out) == {f"agent/{a}/{k}" for a in ("coder", "tester") for k in KEYS}
