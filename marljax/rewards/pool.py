"""Run many sandboxed programs in parallel, with back-pressure.

Each program still gets its own process (see ``sandbox.run_program``); the
pool decides how many run at once.  Worker *threads* are enough: they spend
their time blocked in ``poll``/``wait`` on the child.  Where the isolation level
allows it (``isolation.forks_programs``: bwrap, or unshare as root) each worker
forks its programs from its own warm sandbox (``fork_server.py``;
``SandboxConfig(fork_server=False)`` starts a fresh one per program).  The
submission queue is bounded: ``submit`` blocks (or raises ``queue.Full`` with
``block=False`` / after ``timeout``) when ``max_queue`` programs are waiting.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable
from concurrent.futures import Future

from .fork_server import ForkServer
from .formats import Program
from .isolation import forks_programs
from .results import ExecutionResult
from .sandbox import Limits, SandboxConfig, detect_isolation, run_program

_STOP = object()


def default_workers() -> int:
    """One more than the cores: a program's path passes between this process, the sandbox's
    interpreter and the program's process, so one worker per core leaves cores idle part of the
    time (benchmarks/RESULTS.md, "Cheaper sandboxed programs")."""
    return (os.cpu_count() or 1) + 1


class SandboxPool:
    """``with SandboxPool() as pool: results = pool.map(programs)``."""

    def __init__(
        self,
        max_workers: int | None = None,
        max_queue: int | None = None,
        limits: Limits | None = None,
        config: SandboxConfig | None = None,
    ) -> None:
        self.max_workers = int(max_workers or default_workers())
        if self.max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
        self.max_queue = int(max_queue or 2 * self.max_workers)
        self.limits = limits or Limits()
        self.config = config or SandboxConfig()
        self.isolation = detect_isolation(self.config)  # probe once, before any thread starts
        self._queue: queue.Queue = queue.Queue(maxsize=self.max_queue)
        self._closed = False
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._worker, name=f"marljax-sandbox-{k}", daemon=True)
            for k in range(self.max_workers)
        ]
        for t in self._threads:
            t.start()

    def _worker(self) -> None:
        # Started by this thread: bwrap's --die-with-parent follows the thread that spawned it.
        server = None
        if self.config.fork_server and forks_programs(self.isolation):
            server = ForkServer(self.config, self.isolation)
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                fut, program, limits = item
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    fut.set_result(run_program(program, limits, self.config, server=server))
                except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                    fut.set_exception(exc)
        finally:
            if server is not None:
                server.close()

    def submit(
        self, program: Program, limits: Limits | None = None, block: bool = True, timeout: float | None = None
    ) -> Future:
        """Queue one program; blocks while the queue is full (back-pressure)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("SandboxPool is closed")
        fut: Future = Future()
        self._queue.put((fut, program, limits or self.limits), block=block, timeout=timeout)
        return fut

    def map(self, programs: Iterable[Program], limits: Limits | None = None) -> list[ExecutionResult]:
        """Run all ``programs``; results in input order."""
        futures = [self.submit(p, limits) for p in programs]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Finish queued programs, then stop the workers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            t.join()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_many(
    programs: Iterable[Program],
    limits: Limits | None = None,
    config: SandboxConfig | None = None,
    max_workers: int | None = None,
) -> list[ExecutionResult]:
    """One-shot convenience: run ``programs`` through a temporary pool."""
    with SandboxPool(max_workers=max_workers, limits=limits, config=config) as pool:
        return pool.map(programs)
