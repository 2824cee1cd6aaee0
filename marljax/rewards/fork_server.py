"""Parent side of the warm sandbox: one sandbox, one interpreter, a fork per program.

Starting a sandbox and a Python interpreter per program costs far more CPU than a
typical RL-generated program spends in its tests.  A ``ForkServer`` starts the
sandbox (bubblewrap, or ``unshare`` with the harness's jail) once, with
``zygote.py`` inside it, and runs each program in a freshly forked child of that
warm interpreter (benchmarks/RESULTS.md, "Sandbox fork server").  What each program gets
is unchanged: its own process, session, rlimits and throw-away uid (as root), the
same record protocol and verdicts (``sandbox.collect`` / ``verdicts.classify``).

What is shared, and how it is reset between programs (one program at a time per
server): the working directory (emptied by the parent; under ``unshare`` a tmpfs the
zygote empties), the pid namespace (the zygote SIGKILLs every other process in it
before it answers), the IPC namespace, /dev/shm and /dev/mqueue (a job that leaves
anything there, SysV IPC objects included, gets a fresh sandbox), a memory cgroup, and
the interpreter's start-up state (hash seed; ``random`` reseeds itself after fork).
Everything else a program can see is read-only.  The server is also replaced every
``max_jobs`` programs, and whenever it dies.  Only levels with a pid namespace (and,
under ``unshare``, a throw-away uid per program) qualify: ``isolation.forks_programs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from .cgroup import MemoryCgroup
from .formats import Program
from .isolation import (
    HARNESS_PATH,
    JAIL_PATH,
    JUDGE_PATH,
    SandboxConfig,
    bwrap_argv,
    child_env,
    forks_programs,
    jail_spec,
    unshare_argv,
)
from .results import ExecutionResult, Isolation
from .sandbox import Limits, build_payload, collect, tests_file
from .verdicts import classify
from .workdir import hand_to_throwaway_uid, make_workdir, rmtree

ZYGOTE_PATH = str(Path(__file__).with_name("zygote.py").resolve())
_REPLY_TIMEOUT_S = 15.0  # the zygote gives up killing after 5 s and exits
_START_TIMEOUT_S = 60.0  # sandbox + interpreter + harness imports, on a loaded machine
# Resolve every symbol of libpython/libc once in the zygote, not lazily in each child (fewer pages
# copied per child); the zygote removes the variable from its environment.
_BIND_NOW = ("LD_BIND_NOW", "1")


class ForkServer:
    """``server.run(program, limits)``; not thread-safe: one per pool worker."""

    def __init__(self, config: SandboxConfig, isolation: Isolation, max_jobs: int = 1000) -> None:
        if not forks_programs(isolation):
            raise ValueError(
                f"ForkServer cannot keep the promises of isolation level {isolation.level!r} "
                f"(privileges dropped: {isolation.privileges_dropped}); see isolation.forks_programs"
            )
        self.config, self.isolation, self.max_jobs = config, isolation, max_jobs
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._base = self._workdir = ""
        self._group: MemoryCgroup | None = None
        self._group_mb = None
        self._jobs = 0
        self.starts = 0  # how many sandboxes this server has started (for tests and benchmarks)

    # ------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        self._base, self._workdir = make_workdir(self.config)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv, env = self._argv(theirs.fileno())
        try:
            # stderr stays unread unless start-up fails: only bwrap's and the zygote's own errors go there.
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                cwd=self._workdir,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            ours.close()
            rmtree(self._base)
            raise
        finally:
            theirs.close()
        self._sock = ours
        self._jobs = 0
        self.starts += 1
        if self._read_line(_START_TIMEOUT_S) != b"ready\n":  # never hand jobs to a sandbox that is not there
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGKILL)
            err = self._proc.stderr.read()
            self.close()
            raise RuntimeError(
                f"the sandbox's fork server did not start ({self.isolation.level} + zygote.py): "
                + err.decode("utf-8", "replace")[-2000:]
            )
        self._group, self._group_mb = MemoryCgroup.create(), None
        if self._group is not None:  # the idle zygote and the wrappers above it: every job forks inside
            for pid in _descendants(self._proc.pid):
                with contextlib.suppress(OSError):
                    self._group.add(pid)

    def _argv(self, fd: int) -> tuple[list[str], dict | None]:
        """The zygote's command line and environment at this server's isolation level."""
        drop = self.isolation.privileges_dropped
        if self.isolation.level == "bwrap":
            files = {
                "/.marljax_harness.py": HARNESS_PATH,
                "/.marljax_judge.py": JUDGE_PATH,
                "/.marljax_jail.py": JAIL_PATH,
                "/.marljax_zygote.py": ZYGOTE_PATH,
            }
            return bwrap_argv(
                self.config,
                self._workdir,
                drop,
                files,
                ["/.marljax_zygote.py", "/.marljax_harness.py", str(fd)],
                caps=("CAP_KILL",),
                env=(_BIND_NOW,),
            ), None
        args = [ZYGOTE_PATH, HARNESS_PATH, str(fd), json.dumps(jail_spec(self.config))]
        env = {**child_env(self.isolation.level, self._workdir), _BIND_NOW[0]: _BIND_NOW[1]}
        return unshare_argv(self.config, args), env

    def close(self) -> None:
        """Stop the sandbox and remove its working directory (idempotent)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            self._proc.stderr.close()
            self._proc = None
        if self._group is not None:
            self._group.close()
            self._group = None
        if self._base:
            rmtree(self._base)
            self._base = ""

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ jobs
    def run(self, program: Program, limits: Limits) -> ExecutionResult:
        """Run one (already syntax-checked) program in a child forked inside the sandbox."""
        t_begin = time.perf_counter()
        if self._proc is not None and (self._proc.poll() is not None or self._jobs >= self.max_jobs):
            self.close()
        if self._proc is None:
            self._start()
        if self._group is not None and self._group_mb != limits.memory_mb:
            self._group.limit(limits.memory_mb)
            self._group_mb = limits.memory_mb
        drop_ids = hand_to_throwaway_uid(self.config, self._workdir, self.isolation.privileges_dropped)
        nonce = secrets.token_hex(16)
        payload = build_payload(program, limits, nonce, -1, -1, drop_ids, None, pdeathsig=False)
        out_r, out_w = os.pipe()
        rec_r, rec_w = os.pipe()
        tfd = tests_file(program)
        self._jobs += 1
        returncode, dirty = None, True
        try:
            t_spawn = time.perf_counter()
            sent = self._send_job(payload, out_w, rec_w, tfd)
            for fd in (out_w, rec_w, tfd):
                os.close(fd)
            out_w = rec_w = tfd = -1
            if sent:
                outcome = collect(out_r, rec_r, nonce, program, limits)
                returncode, dirty = self._end_job()
            else:  # the sandbox died before the job reached it: fail like a killed process
                outcome = {"records": [], "killed": None, "output": "", "collect_s": 0.0}
                returncode = -signal.SIGKILL
            outcome["spawn_s"] = time.perf_counter() - t_spawn
        finally:
            for fd in (out_r, out_w, rec_r, rec_w, tfd):
                if fd >= 0:
                    os.close(fd)
            if not dirty:
                try:
                    self._empty_workdir()
                except Exception:  # noqa: BLE001 - whatever a program left: a fresh sandbox removes it
                    dirty = True
            if dirty:
                self.close()
        result = classify(program, outcome, self.isolation, returncode, time.perf_counter() - t_begin)
        result.extra["fork_server"] = True
        return result

    def _send_job(self, payload: dict, out_w: int, rec_w: int, tests_fd: int) -> bool:
        body = json.dumps(payload).encode()
        head = struct.pack("!Q", len(body))
        try:
            socket.send_fds(self._sock, [head], [out_w, rec_w, tests_fd])
            self._sock.sendall(body)
        except OSError:
            return False
        return True

    def _end_job(self) -> tuple[int, bool]:
        """Tell the zygote to kill the job; (its exit code, whether the sandbox must be replaced)."""
        try:
            self._sock.sendall(b"end\n")
            msg = json.loads(self._read_line(_REPLY_TIMEOUT_S))
            return int(msg["exit"]), bool(msg["dirty"])
        except (OSError, ValueError, KeyError, TypeError):
            # The zygote died or hung: bwrap's namespace went (or goes) down with everything in it.
            return -signal.SIGKILL, True

    def _read_line(self, timeout: float) -> bytes:
        """One line from the zygote; b"" when it closed the socket or said nothing in time."""
        self._sock.settimeout(timeout)
        line = b""
        try:
            while not line.endswith(b"\n"):
                chunk = self._sock.recv(4096)
                if not chunk:
                    return b""
                line += chunk
        except OSError:
            return b""
        finally:
            self._sock.settimeout(None)
        return line

    def _empty_workdir(self) -> None:
        os.chmod(self._workdir, 0o700)  # the job owned it and may have locked it
        for entry in os.scandir(self._workdir):
            if entry.is_dir(follow_symlinks=False):
                rmtree(entry.path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out
