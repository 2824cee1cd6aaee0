"""Shared fixtures for the rewards tests: the isolation in force, a leak check, and the two ways
a program reaches its sandbox (a fresh one, or a fork of a warm one)."""

from __future__ import annotations

import atexit
import ctypes
import glob
import os
import shutil
import tempfile
import time

import pytest

from marljax.rewards import SandboxConfig, detect_isolation, run_program
from marljax.rewards.fork_server import ZYGOTE_PATH, ForkServer
from marljax.rewards.sandbox import HARNESS_PATH


def _own_temp_dir() -> None:
    """Give this test process its own temp dir, so that its leak check never sees the sandbox
    working directories of other xdist workers (or of anything else on the machine)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = tempfile.mkdtemp(prefix=f"marljax-tests-{worker}-")
    os.chmod(path, 0o711)  # level 'none' with a dropped uid reaches its working directory through it
    tempfile.tempdir = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)


def _become_subreaper() -> None:
    """Orphans of our sandboxes (a level-'none' program that daemonised itself) are re-parented to
    this process instead of init, so ``sandbox_processes`` still finds them among our descendants."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


_own_temp_dir()
_become_subreaper()


def _live_parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z":  # zombies are dead already
            parents[int(entry)] = int(fields[1])
    return parents


def sandbox_processes() -> set[int]:
    """Live descendants of this process that belong to a sandbox: running the harness or the zygote,
    or owned by a throw-away uid.  (Other xdist workers' sandboxes are not ours to judge.)"""
    parents, me = _live_parents(), os.getpid()

    def descends(pid: int) -> bool:
        for _ in range(64):
            pid = parents.get(pid, 0)
            if pid == me:
                return True
            if pid <= 1:
                return False
        return False

    found = set()
    for pid in parents:
        if not descends(pid):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid >= SandboxConfig().uid_base:
                found.add(pid)
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if any(s in cmd for s in (b"marljax_harness", b"marljax_zygote", HARNESS_PATH.encode(), ZYGOTE_PATH.encode())):
            found.add(pid)
    return found


def sandbox_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "marljax-sbx-*")))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="session")
def isolation():
    return detect_isolation(SandboxConfig())


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a sandbox process, a working directory or an fd behind."""
    procs0, dirs0, fds0 = sandbox_processes(), sandbox_dirs(), open_fds()
    yield
    deadline = time.monotonic() + 5.0  # pid-namespace teardown is asynchronous
    while True:
        procs = sandbox_processes() - procs0
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not procs, f"leaked sandbox processes: {sorted(procs)}"
    assert not (sandbox_dirs() - dirs0), f"leaked working directories: {sorted(sandbox_dirs() - dirs0)}"
    assert open_fds() <= fds0, f"leaked file descriptors: {fds0} -> {open_fds()}"


def _require_bwrap(isolation) -> None:
    if isolation.level != "bwrap":
        pytest.skip(f"the fork server needs bwrap; isolation here is {isolation.level!r}")


@pytest.fixture
def bwrap_isolation(isolation):
    """The isolation in force where the fork server can run; skips (saying why) elsewhere."""
    _require_bwrap(isolation)
    return isolation


@pytest.fixture(params=["fresh", "fork_server"])
def run(request, isolation, no_leaks):
    """``run_program``: in a fresh sandbox per program, or forked from one warm sandbox (bwrap only).

    Requests ``no_leaks`` itself so the leak check runs after the server has been closed.
    """
    if request.param == "fresh":
        yield run_program
        return
    _require_bwrap(isolation)
    with ForkServer(SandboxConfig(), isolation) as server:
        yield lambda program, limits=None: run_program(program, limits, server=server)
