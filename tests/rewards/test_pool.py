"""The pool: many programs in parallel, exact results, no leaks, back-pressure."""

from __future__ import annotations

import queue
import threading

import pytest

from marljax.rewards import CallTest, Limits, Program, SandboxPool, Status, StdioTest, run_many


def _job(k: int):
    """Program k and the status it must get (independent of scheduling)."""
    kind = k % 5
    if kind == 0:
        return (
            Program(
                f"def f(x):\n    return x + {k}\n",
                (CallTest((1,), 1 + k), CallTest((2,), 2 + k)),
                fn_name="f",
            ),
            Status.PASSED,
            1.0,
        )
    if kind == 1:
        return (
            Program(
                f"def f(x):\n    return x + {k}\n",
                (CallTest((1,), 1 + k), CallTest((2,), 3 + k)),
                fn_name="f",
            ),
            Status.WRONG_ANSWER,
            0.5,
        )
    if kind == 2:
        return (
            Program("def f(x):\n    return 1 // (x - 1)\n", (CallTest((1,), 0),), fn_name="f"),
            Status.RUNTIME_ERROR,
            0.0,
        )
    if kind == 3:
        return Program(f"print(int(input()) * {k})\n", (StdioTest("3\n", f"{3 * k}\n"),)), Status.PASSED, 1.0
    return Program("import sys\nsys.exit(0)\n", (CallTest((), 0),), fn_name="f"), Status.RUNTIME_ERROR, 0.0


@pytest.mark.slow
def test_500_programs_exact_and_no_leaks(no_leaks):
    jobs = [_job(k) for k in range(500)]
    with SandboxPool(limits=Limits(test_timeout_s=5.0, program_timeout_s=20.0)) as pool:
        results = pool.map([j[0] for j in jobs])
        n_threads = threading.active_count()
    assert len(results) == 500
    for k, ((_, status, frac), res) in enumerate(zip(jobs, results)):
        assert res.status is status, (k, res)
        assert res.pass_fraction() == frac, (k, res)
    assert threading.active_count() < n_threads  # workers joined on close


def test_results_come_back_in_order(no_leaks):
    progs = [Program(f"def f():\n    return {k}\n", (CallTest((), k),), fn_name="f") for k in range(12)]
    res = run_many(progs, max_workers=3)
    assert all(r.passed for r in res)


def test_back_pressure_blocks_then_raises_when_full(no_leaks):
    slow = Program(
        "import time\ndef f():\n    time.sleep(0.5)\n    return 1\n", (CallTest((), 1),), fn_name="f"
    )
    with SandboxPool(max_workers=1, max_queue=1) as pool:
        futs = [pool.submit(slow)]  # taken by the worker (soon)
        futs.append(pool.submit(slow))  # may wait in the queue
        with pytest.raises(queue.Full):
            for _ in range(3):  # the queue holds one: a third submission cannot be accepted at once
                futs.append(pool.submit(slow, block=False))
        assert all(f.result().passed for f in futs)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(slow)


def test_worker_exception_reaches_the_caller(no_leaks):
    with SandboxPool(max_workers=1) as pool:
        fut = pool.submit("not a program")  # type: ignore[arg-type]
        with pytest.raises(AttributeError):
            fut.result()
