"""Shared fixtures for the rewards tests: the isolation in force and a leak check."""

from __future__ import annotations

import glob
import os
import tempfile
import time

import pytest

from marljax.rewards import SandboxConfig, detect_isolation
from marljax.rewards.sandbox import HARNESS_PATH

def sandbox_processes() -> set[int]:
    """Processes that belong to a sandbox: running the harness, or owned by a throw-away uid."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid >= SandboxConfig().uid_base:
                found.add(int(entry))
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"marljax_harness" in cmd or HARNESS_PATH.encode() in cmd:
            found.add(int(entry))
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
