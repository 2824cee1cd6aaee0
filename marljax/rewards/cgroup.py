"""A memory cgroup per sandbox: RLIMIT_AS caps each process, this caps all of a program's together.

Where this process may create memory cgroups (cgroup v2 with the memory controller enabled below
its own cgroup, or v1's memory hierarchy; in practice as root), ``MemoryCgroup.create()`` makes one
below this process's own; elsewhere it gives None and the cap stays per process (the result's
isolation note says so).  A fresh sandbox's harness joins the group itself before any untrusted code
runs (``join_path`` in the payload); a fork server's zygote is moved into it once it is ready, so
every program forked from it is inside.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time


def _own_memory_cgroup() -> tuple[str, str] | None:
    """(directory of this process's memory cgroup, "v1" | "v2"), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = "/sys/fs/cgroup/memory" + path.rstrip("/")
            if os.path.isfile(os.path.join(d, "memory.limit_in_bytes")):
                return d, "v1"
    for line in lines:
        if line.startswith("0::"):
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                d = root + line[3:].rstrip("/")
                try:
                    with open(os.path.join(d, "cgroup.subtree_control")) as f:
                        if "memory" in f.read().split():
                            return d, "v2"
                except OSError:
                    continue
    return None


def _remove_stale(parent: str, age_s: float = 600.0) -> None:
    """Remove empty groups left by a process that was killed (an old, empty group is no one's)."""
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith("marljax-")]
        now = time.time()
        for e in entries:
            if now - e.stat().st_mtime > age_s:
                with contextlib.suppress(OSError):
                    os.rmdir(e.path)  # fails while a process is in it
    except OSError:
        pass


class MemoryCgroup:
    """One memory cgroup; ``close`` kills what is left in it and removes it."""

    def __init__(self, path: str, version: str) -> None:
        self.path, self.version = path, version

    @classmethod
    def create(cls) -> MemoryCgroup | None:
        own = _own_memory_cgroup()
        if own is None:
            return None
        _remove_stale(own[0])
        path = os.path.join(own[0], "marljax-" + secrets.token_hex(6))
        try:
            os.mkdir(path)
        except OSError:
            return None
        group = cls(path, own[1])
        try:
            if group.version == "v2":
                group._write("memory.swap.max", "0")
            elif os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                group._swap_too = True
        except OSError:
            group.close()
            return None
        return group

    _swap_too = False

    @property
    def join_path(self) -> str:
        """The file a process writes its pid to, to enter the group."""
        return os.path.join(self.path, "cgroup.procs")

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def limit(self, megabytes: int) -> None:
        """Cap the group's memory (its processes together) at ``megabytes``."""
        value = str(int(megabytes) << 20)
        if self.version == "v2":
            self._write("memory.max", value)
            return
        # v1: memsw must stay >= the memory limit at every step, so the order depends on the direction
        names = ["memory.limit_in_bytes"] + (["memory.memsw.limit_in_bytes"] if self._swap_too else [])
        for name in names if self._lowering(int(value)) else reversed(names):
            with contextlib.suppress(OSError):
                self._write(name, value)

    def _lowering(self, value: int) -> bool:
        try:
            with open(os.path.join(self.path, "memory.limit_in_bytes")) as f:
                return value < int(f.read())
        except (OSError, ValueError):
            return True

    def add(self, pid: int) -> None:
        with open(self.join_path, "w") as f:
            f.write(str(pid))

    def close(self) -> None:
        """Kill every process left in the group, then remove it (idempotent)."""
        for _ in range(50):
            try:
                with open(self.join_path) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)  # processes still exiting
