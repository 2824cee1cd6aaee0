"""Shared fixtures for the rewards tests: the isolation levels this machine offers, a leak check,
and the ways a program reaches its sandbox: a fresh one at each level, or a fork of a warm one at
each level that can fork programs (``isolation.forks_programs``)."""

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
from marljax.rewards.isolation import forks_programs
from marljax.rewards.sandbox import HARNESS_PATH, LEVELS


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
        if any(
            s in cmd
            for s in (b"marljax_harness", b"marljax_zygote", HARNESS_PATH.encode(), ZYGOTE_PATH.encode())
        ):
            found.add(pid)
    return found


def sandbox_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "marljax-sbx-*")))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _offered_levels() -> tuple[dict, dict, dict]:
    """{level: Isolation} for every level that works here; {level: why} for the levels this machine
    offers (their tool is installed) that do not work, whose tests then fail rather than skip; and
    {level: why not} for the others (``$MARLJAX_TEST_LEVELS_ABSENT``, a comma list, declares levels
    a machine knowingly lacks although their tool is installed)."""
    absent = set(filter(None, os.environ.get("MARLJAX_TEST_LEVELS_ABSENT", "").split(",")))
    offered, broken, missing = {}, {}, {}
    for level in LEVELS:
        if level in absent or (level != "none" and shutil.which(level) is None):
            missing[level] = "not installed" if level not in absent else "$MARLJAX_TEST_LEVELS_ABSENT"
            continue
        try:
            offered[level] = detect_isolation(SandboxConfig(isolation=level))
        except RuntimeError as exc:
            broken[level] = str(exc)
    return offered, broken, missing


OFFERED, BROKEN, MISSING = _offered_levels()
# (level, how): every level fresh, and forked from a warm sandbox where the level can keep its promises so;
# a level offered here that does not work runs (and fails) both ways.
RUNS = [
    (level, how)
    for level, iso in OFFERED.items()
    for how in ("fresh", "fork_server")
    if how == "fresh" or forks_programs(iso)
] + [(level, how) for level in BROKEN for how in ("fresh", "fork_server")]
FORKING = [level for level, iso in OFFERED.items() if forks_programs(iso)] + list(BROKEN)


def _fail_if_broken(level: str) -> None:
    if level in BROKEN:
        pytest.fail(
            f"isolation level {level!r} is offered here (its tool is installed) but does not work: {BROKEN[level]}"
        )


def pytest_report_header(config):
    return [
        f"sandbox: levels offered here {list(OFFERED)}, fork server at {FORKING}",
        *(f"sandbox: level {level!r} not offered: {why}" for level, why in MISSING.items()),
        *(f"sandbox: level {level!r} offered but BROKEN: {why}" for level, why in BROKEN.items()),
    ]


@pytest.fixture(params=list(OFFERED) + list(BROKEN))
def level_config(request):
    """A ``SandboxConfig`` naming each level offered here."""
    _fail_if_broken(request.param)
    return SandboxConfig(isolation=request.param)


@pytest.fixture
def isolation(request):
    """The isolation in force: that of the ``run`` or ``forking_isolation`` parameter where the test
    has one, else the strongest level here (what ``SandboxConfig()`` picks)."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    if "run" in params:
        _fail_if_broken(params["run"][0])
        return OFFERED[params["run"][0]]
    if "forking_isolation" in params:
        _fail_if_broken(params["forking_isolation"])
        return OFFERED[params["forking_isolation"]]
    return detect_isolation(SandboxConfig())


@pytest.fixture
def live_sandboxes():
    """``sandbox_processes`` for a test (a test file cannot import it: every test directory's
    conftest is a module named ``conftest``, and xdist may have loaded another one under that name)."""
    return sandbox_processes


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


_NO_FORKING = (
    "no isolation level here can fork programs from a warm sandbox (bwrap, or unshare as root): "
    f"offered {list(OFFERED)}; not installed: {MISSING}"
)


@pytest.fixture(params=FORKING or [pytest.param(None, marks=pytest.mark.skip(reason=_NO_FORKING))])
def forking_isolation(request):
    """Each isolation in force here under which a fork server runs."""
    _fail_if_broken(request.param)
    return OFFERED[request.param]


@pytest.fixture(params=RUNS, ids=[f"{level}-{how}" for level, how in RUNS])
def run(request, no_leaks):
    """``run_program`` at one isolation level: in a fresh sandbox per program, or forked from one
    warm sandbox.

    Requests ``no_leaks`` itself so the leak check runs after the server has been closed.
    """
    level, how = request.param
    _fail_if_broken(level)
    config = SandboxConfig(isolation=level)
    if how == "fresh":
        yield lambda program, limits=None: run_program(program, limits, config)
        return
    with ForkServer(config, OFFERED[level]) as server:
        yield lambda program, limits=None: run_program(program, limits, server=server)
