"""HumanEval: every canonical solution passes; mutants fail with the right class."""

from __future__ import annotations

from pathlib import Path

import pytest

from marljax.rewards import Limits, SandboxPool, humaneval_program, load_humaneval

# ../shared/data beside the repository root (never copied into the repo).
HUMANEVAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "HumanEval.jsonl.gz"

LIMITS = Limits(test_timeout_s=10.0, program_timeout_s=30.0)


@pytest.fixture(scope="module")
def problems():
    if not HUMANEVAL.exists():
        pytest.skip(f"HumanEval data not found at {HUMANEVAL} (expected ../shared/data beside the repo)")
    probs = load_humaneval(HUMANEVAL)
    assert len(probs) == 164
    return probs


@pytest.mark.slow
def test_all_canonical_solutions_pass(problems, no_leaks):
    with SandboxPool(limits=LIMITS) as pool:
        results = pool.map([humaneval_program(p, p["canonical_solution"]) for p in problems])
    failed = {
        p["task_id"]: (r.status.value, r.error_message, r.tests[0].message)
        for p, r in zip(problems, results)
        if not r.passed
    }
    assert not failed
    assert all(r.pass_fraction() == 1.0 for r in results)


# The wrong-value mutant keeps the canonical solution and perturbs what it returns,
# keeping the type, so the check's asserts (not the candidate) fail.
PERTURB = """
_marljax_orig = {entry}
def _marljax_perturb(r):
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1
    if isinstance(r, str):
        return r + "#"
    if isinstance(r, (list, tuple)):
        return type(r)(list(r) + [None])
    if r is None:
        return 0
    return object()
def {entry}(*args, **kwargs):
    return _marljax_perturb(_marljax_orig(*args, **kwargs))
"""


def _mutants(p):
    entry, canon = p["entry_point"], p["canonical_solution"]
    return {
        "wrong_answer": humaneval_program(p, canon + PERTURB.format(entry=entry)),
        "runtime_error": humaneval_program(p, "    raise ValueError('mutant')\n"),
        "timeout": humaneval_program(p, "    while True:\n        pass\n"),
        "syntax_error": humaneval_program(p, canon + "\n    return (\n"),
    }


@pytest.mark.slow
def test_mutants_fail_with_the_right_class(problems, no_leaks):
    chosen = problems[::4]  # 41 problems x 3 executed mutants; infinite loops on every 4th of those
    jobs, expect = [], []
    for k, p in enumerate(chosen):
        for cls, prog in _mutants(p).items():
            if cls == "timeout" and k % 4:
                continue
            jobs.append(prog)
            expect.append((p["task_id"], cls))
    with SandboxPool(limits=Limits(test_timeout_s=1.0, program_timeout_s=10.0)) as pool:
        results = pool.map(jobs)
    wrong = [
        (tid, cls, r.status.value, r.error_message or r.tests[0].message)
        for (tid, cls), r in zip(expect, results)
        if r.status.value != cls
    ]
    assert not wrong
    for (_tid, cls), r in zip(expect, results):
        assert r.pass_fraction() == 0.0
        if cls == "runtime_error":
            assert r.tests[0].exc_type == "ValueError" and "mutant" in r.tests[0].message
        if cls == "wrong_answer":
            assert r.tests[0].input  # the failing assert's call is reported
