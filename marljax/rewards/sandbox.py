"""Run one untrusted Python program against its tests in a separate process.

How the process is wrapped (bwrap / unshare / none) lives in ``isolation.py``;
``detect_isolation`` below picks the strongest level that works here.  A
``ForkServer`` (``fork_server.py``, used by ``SandboxPool``) runs the same
protocol in a process forked from a warm sandbox instead of a fresh one.

On every level the child harness (``harness.py``) applies rlimits (CPU time,
address space, file size, open files, processes, no core dumps), and when the
parent runs as root it drops to a throw-away uid (random, >= 200000) so that
RLIMIT_NPROC really caps the fork count (root is exempt from it) and files of
the parent's user are out of reach.  Processes are always started in a new
session and the whole group is SIGKILLed when the run ends; with a pid
namespace everything the program started dies with it; on level ``none`` with
a dropped uid the parent also sweeps any process left with that uid.

Result channel and trust boundary: the harness writes one record per step to
an inherited pipe, each prefixed with a random nonce, *after* the step ran;
the parent trusts only those records (stdout is just text) and treats missing
records as failures, so ``sys.exit``/``os._exit``/signals before or during the
tests can never pass; a malformed record is a failure too (``verdicts.py``).
For stdin/stdout and call tests the expected outputs never enter the child, so
no forgery can make a wrong program pass them.  Assert-style tests (HumanEval,
MBPP) carry their expected values, so they are judged in a second process: the
program runs in a forked child that holds neither the record channel nor the
tests (they come on their own fd, ``tests_file``), and only plain data crosses
back to the judge (``judge.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, replace

from .cgroup import MemoryCgroup
from .formats import AssertTest, CallTest, Program, StdioTest
from .isolation import (
    HARNESS_PATH,
    ISOLATING_LEVELS,
    LEVELS,
    SandboxConfig,
    bwrap_harness_argv,
    child_env,
    is_root,
    jail_spec,
    kill_uid,
    level_isolation,
    python_argv,
    unshare_argv,
)
from .results import ExecutionResult, Isolation, Status
from .verdicts import classify, not_run
from .workdir import hand_to_throwaway_uid, make_workdir, rmtree

__all__ = ["HARNESS_PATH", "LEVELS", "Limits", "SandboxConfig", "detect_isolation", "run_program"]

_GRACE_S = 0.5  # parent-side slack on top of the child's own per-test alarm
_decode = (
    json.JSONDecoder().decode
)  # json.loads of bytes also guesses their encoding: ~30 records per program
_MAX_CODE_CHARS = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per-program resource limits (all enforced on every isolation level)."""

    test_timeout_s: float = 4.0
    program_timeout_s: float = 30.0
    cpu_time_s: float | None = None  # default: program_timeout_s + 1
    memory_mb: int = 1024  # RLIMIT_AS of the child interpreter
    max_processes: int = 32  # RLIMIT_NPROC (enforced with a dropped uid or a user namespace)
    max_output_bytes: int = 1 << 20  # per test captured stdout, and raw fd 1/2 of the process
    max_file_bytes: int = 16 << 20  # RLIMIT_FSIZE
    max_open_files: int = 128
    max_message_chars: int = 2000  # tracebacks, reprs in records
    max_disk_mb: int = 64  # all files together (unshare: the working directory is a tmpfs of this size)
    max_files: int = 4096  # files and directories together (unshare)

    def __post_init__(self) -> None:
        for name in (
            "test_timeout_s",
            "program_timeout_s",
            "memory_mb",
            "max_processes",
            "max_output_bytes",
            "max_file_bytes",
            "max_open_files",
            "max_message_chars",
            "max_disk_mb",
            "max_files",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if self.cpu_time_s is not None and self.cpu_time_s <= 0:
            raise ValueError(f"Limits.cpu_time_s must be positive, got {self.cpu_time_s!r}")


_detect_lock = threading.Lock()
_detected: dict[tuple, Isolation] = {}


def detect_isolation(config: SandboxConfig | None = None) -> Isolation:
    """Strongest isolation that actually works here (probed once per config, cached).

    ``auto`` picks among the levels that isolate (bwrap, unshare) and never falls to ``none``:
    running untrusted programs unisolated must be asked for by name.  A probe that fails is
    tried once more (a loaded machine can fail one start), then it is an error that says why.
    """
    config = config or SandboxConfig()
    key = (config.isolation, config.python, config.site_packages, config.drop_privileges)
    with _detect_lock:
        if key in _detected:
            return _detected[key]
    levels = ISOLATING_LEVELS if config.isolation == "auto" else (config.isolation,)
    reasons = []
    for level in levels:
        if level != "none" and shutil.which(level) is None:
            reasons.append(f"{level}: not installed")
            continue
        iso = level_isolation(level, config)
        why = _probe(level, config, iso)
        if why is not None:
            why = _probe(level, config, iso)
        if why is None:
            if reasons:
                iso = replace(iso, note=iso.note + " (" + "; ".join(reasons) + ")")
            with _detect_lock:
                _detected[key] = iso
            return iso
        reasons.append(why)
    hint = (
        " (isolation 'none' runs programs unisolated, and only when named)"
        if config.isolation == "auto"
        else ""
    )
    raise RuntimeError("no working sandbox isolation level: " + "; ".join(reasons) + hint)


def _probe(level: str, config: SandboxConfig, iso: Isolation) -> str | None:
    """None when a trivial program passes at ``level``, else why it did not."""
    probe = Program("def f(x):\n    return x + 1\n", (CallTest((1,), 2),), fn_name="f")
    try:
        res = _run(probe, Limits(test_timeout_s=10, program_timeout_s=20), config, iso)
    except OSError as exc:
        return f"{level}: {exc}"
    if res.passed:
        return None
    return f"{level}: probe failed ({res.status}: {res.error_message or res.output_tail[-300:]})"


# ------------------------------------------------------------------- runner
def _check_syntax(code: str) -> tuple[str, str] | None:
    try:
        compile(code, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        return type(exc).__name__, str(exc)
    return None


def run_program(
    program: Program, limits: Limits | None = None, config: SandboxConfig | None = None, server=None
) -> ExecutionResult:
    """Run ``program`` once in a fresh sandboxed process and classify every test.

    ``server``: a ``ForkServer`` to fork the process from (pools pass their worker's);
    None starts a new sandbox and interpreter for this program alone.
    """
    limits = limits or Limits()
    config = config or SandboxConfig()
    if not program.code or not program.code.strip():
        return ExecutionResult(Status.NO_CODE, not_run(program), error_message="no code to run")
    if len(program.code) > _MAX_CODE_CHARS:
        return ExecutionResult(
            Status.SYNTAX_ERROR,
            not_run(program),
            error_type="CodeTooLong",
            error_message=f"program longer than {_MAX_CODE_CHARS} characters",
        )
    bad = _check_syntax(program.code)
    if bad is not None:
        return ExecutionResult(Status.SYNTAX_ERROR, not_run(program), error_type=bad[0], error_message=bad[1])
    if server is not None:
        return server.run(program, limits)
    return _run(program, limits, config, detect_isolation(config))


def tests_file(program: Program) -> int:
    """An anonymous file holding the tests as the harness reads them, at offset 0 (its fd).  The tests
    travel apart from the payload so that the process running the program never holds them
    (``judge.py``: only the judge reads this fd)."""
    tests = []
    for t in program.tests:
        if isinstance(t, AssertTest):
            tests.append({"code": t.code})
        elif isinstance(t, StdioTest):
            tests.append({"input": t.input})
        else:
            tests.append({"args": list(t.args)})
    fd = os.memfd_create("marljax-tests", 0)
    try:
        data = json.dumps(tests).encode()
        while data:
            data = data[os.write(fd, data) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def build_payload(
    program: Program, limits: Limits, nonce: str, rfd: int, tfd: int, drop_ids, jail, pdeathsig
) -> dict:
    cpu = limits.cpu_time_s or (limits.program_timeout_s + 1)
    return {
        "nonce": nonce,
        "result_fd": rfd,
        "mode": program.mode,
        "program": program.code,
        "setup": program.setup,
        "fn_name": program.fn_name,
        "tests_fd": tfd,
        "limits": {
            "cpu_s": math.ceil(cpu),
            "as_bytes": int(limits.memory_mb) << 20,
            "fsize_bytes": int(limits.max_file_bytes),
            "nofile": int(limits.max_open_files),
            "nproc": int(limits.max_processes) if drop_ids or not is_root() else None,
        },
        "drop": drop_ids,
        "jail": jail,
        "pdeathsig": pdeathsig,
        "test_timeout_s": float(limits.test_timeout_s),
        "max_output_bytes": int(limits.max_output_bytes),
        "max_message_chars": int(limits.max_message_chars),
        "disk": [int(limits.max_disk_mb), int(limits.max_files)],
    }


def _run(program: Program, limits: Limits, config: SandboxConfig, iso: Isolation) -> ExecutionResult:
    t_begin = time.perf_counter()
    drop = iso.privileges_dropped
    base, workdir = make_workdir(config)
    proc = drop_ids = group = None
    rfd = wfd = tfd = -1
    try:
        drop_ids = hand_to_throwaway_uid(config, workdir, drop)
        nonce = secrets.token_hex(16)
        rfd, wfd = os.pipe()
        tfd = tests_file(program)
        jail = jail_spec(config) if iso.level == "unshare" else None
        payload = build_payload(
            program, limits, nonce, wfd, tfd, drop_ids, jail, pdeathsig=iso.level != "bwrap"
        )
        if iso.level != "bwrap":  # the harness joins it itself, before the jail hides /sys
            group = MemoryCgroup.create()
            if group is not None:
                group.limit(limits.memory_mb)
                payload["cgroup"] = group.join_path
        ppath = os.path.join(base, "payload.json")
        fd = os.open(ppath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        if iso.level == "bwrap":
            argv = bwrap_harness_argv(config, workdir, ppath, drop)
        elif iso.level == "unshare":
            argv = unshare_argv(config, [HARNESS_PATH, ppath])
        else:
            argv = python_argv(config, [HARNESS_PATH, ppath])
        env = child_env(iso.level, workdir)
        t_spawn = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            pass_fds=(wfd, tfd),
            start_new_session=True,
            close_fds=True,
        )
        os.close(wfd)
        os.close(tfd)
        wfd = tfd = -1
        outcome = collect(proc.stdout.fileno(), rfd, nonce, program, limits)
        outcome["spawn_s"] = time.perf_counter() - t_spawn
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if drop_ids and iso.level == "none":
            kill_uid(drop_ids["uid"])
        if group is not None:
            group.close()
        for fd_ in (rfd, wfd, tfd):
            if fd_ >= 0:
                os.close(fd_)
        rmtree(base)
    return classify(program, outcome, iso, proc.returncode, time.perf_counter() - t_begin)


def collect(out_fd: int, rfd: int, nonce: str, program: Program, limits: Limits) -> dict:
    """Drain the record channel and the output pipe until the child ends or a limit hits.

    ``killed`` in the result says why the caller must kill the child now (None: it finished).
    """
    tag = nonce.encode() + b" "
    records: list[dict] = []
    rbuf = bytearray()
    out = bytearray()
    out_total = 0
    rec_total = 0
    rec_cap = 4 * limits.max_output_bytes * max(1, len(program.tests)) + (1 << 20)
    poller = select.poll()
    poller.register(rfd, select.POLLIN)
    poller.register(out_fd, select.POLLIN)
    open_fds = {rfd, out_fd}
    t0 = time.monotonic()
    program_deadline = t0 + limits.program_timeout_s
    step_deadline = None  # load phase or current test
    killed = None  # why the parent killed the child
    harness_pid = None
    while open_fds:
        now = time.monotonic()
        deadlines = [program_deadline] + ([step_deadline] if step_deadline else [])
        wait = min(deadlines) - now
        if wait <= 0:
            killed = "timeout"
            break
        events = poller.poll(max(1, int(wait * 1000)))
        for fd, _ in events:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            if fd == out_fd:
                out_total += len(chunk)
                if out_total > limits.max_output_bytes:
                    killed = "output"
                else:
                    out += chunk
                continue
            rec_total += len(chunk)
            if rec_total > rec_cap:
                killed = "records"
                continue
            rbuf += chunk
            while True:
                nl = rbuf.find(b"\n")
                if nl < 0:
                    break
                line = bytes(rbuf[:nl])
                del rbuf[: nl + 1]
                if not line.startswith(tag):
                    continue
                try:
                    rec = _decode(line[len(tag) :].decode())
                except ValueError:  # UnicodeDecodeError included
                    continue
                if not isinstance(rec, dict):
                    continue
                # The first record is written before any untrusted code runs: it pins the
                # harness pid; records from forked copies of the harness are ignored.
                if harness_pid is None:
                    harness_pid = rec.get("pid")
                elif rec.get("pid") != harness_pid:
                    continue
                records.append(rec)
                e = rec.get("e")
                if e in ("load_start", "start"):
                    step_deadline = time.monotonic() + limits.test_timeout_s + _GRACE_S
                elif e in ("load", "end", "ready"):
                    step_deadline = None
                if e == "done" or (e == "load" and rec.get("status") != "ok"):
                    open_fds.clear()  # everything we need has arrived
        if killed:
            break
    return {
        "records": records,
        "killed": killed,
        "output": bytes(out).decode("utf-8", "replace"),
        "collect_s": time.monotonic() - t0,
    }
