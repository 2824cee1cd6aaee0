"""Run one untrusted Python program against its tests in a separate process.

Layers, strongest first (``detect_isolation`` probes them once per process):

``bwrap``    bubblewrap: new net/pid/ipc/uts namespaces, a read-only view of
             only /usr, /lib*, /bin and the interpreter's prefix, the working
             directory bind-mounted on /sandbox and /tmp, nothing else
             writable; the sandbox dies with its parent.
``unshare``  util-linux unshare (needs root or unprivileged user namespaces):
             new net/pid/mount/ipc/uts namespaces; the child harness mounts a
             fresh /proc, binds the working directory on /tmp and /var/tmp,
             puts small tmpfs on /dev/shm and /run/lock, and re-exposes an
             interpreter that lives under a private directory (e.g. /root).
``none``     rlimits, scrubbed environment, process-group kill only.

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
tests can never pass.  For stdin/stdout and call tests the expected outputs
never enter the child, so no forgery can make a wrong program pass them.  For
assert-style tests (HumanEval, MBPP) the verdict is computed in the same
interpreter as the untrusted code: a program written *deliberately* to find
the nonce and the pipe (e.g. by walking ``gc.get_objects()`` or the harness's
frames) could forge a pass.  Closing that hole needs the tests to run in a
second process; we accept it because reward hacking by RL policies finds the
cheap exits (early exit, printing "passed", patching builtins), all of which
are handled.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .formats import AssertTest, CallTest, Program, StdioTest, compare_stdout, compare_value
from .results import ExecutionResult, Isolation, Status, TestResult

HARNESS_PATH = str(Path(__file__).with_name("harness.py").resolve())
LEVELS = ("bwrap", "unshare", "none")
_GRACE_S = 0.5  # parent-side slack on top of the child's own per-test alarm
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

    def __post_init__(self) -> None:
        for name in ("test_timeout_s", "program_timeout_s", "memory_mb", "max_processes",
                     "max_output_bytes", "max_file_bytes", "max_open_files", "max_message_chars"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if self.cpu_time_s is not None and self.cpu_time_s <= 0:
            raise ValueError(f"Limits.cpu_time_s must be positive, got {self.cpu_time_s!r}")


@dataclass(frozen=True)
class SandboxConfig:
    """How programs are started.

    isolation: ``"auto"`` (strongest that works here) or one of ``LEVELS``;
      a named level that does not work here is an error, never a silent downgrade.
      Default: ``$MARLJAX_SANDBOX_ISOLATION`` or ``"auto"``.
    python: interpreter for the child (default: this one).
    site_packages: let programs import installed third-party packages (slower
      start-up: ``site`` is imported); default stdlib only (``python -I -S``).
    drop_privileges: when running as root, run programs as a throw-away uid.
    tmp_root: where working directories are created (default: the system temp dir).
    """

    isolation: str = field(default_factory=lambda: os.environ.get("MARLJAX_SANDBOX_ISOLATION", "auto"))
    python: str = sys.executable
    site_packages: bool = False
    drop_privileges: bool = True
    tmp_root: str | None = None
    uid_base: int = 200_000
    uid_span: int = 1 << 20

    def __post_init__(self) -> None:
        if self.isolation not in ("auto",) + LEVELS:
            raise ValueError(f"SandboxConfig.isolation must be 'auto' or one of {LEVELS}, got {self.isolation!r}")


# ---------------------------------------------------------------- isolation
def _is_root() -> bool:
    return os.geteuid() == 0


def _prefixes(config: SandboxConfig) -> list[str]:
    """Directories the child interpreter needs to read (deduplicated, outermost)."""
    exe = os.path.realpath(config.python)
    paths = {os.path.dirname(exe), os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
             os.path.realpath(sys.exec_prefix)}
    paths.add(os.path.realpath(sysconfig.get_paths()["stdlib"]))
    if config.site_packages:
        for key in ("purelib", "platlib"):
            paths.add(os.path.realpath(sysconfig.get_paths()[key]))
    out = []
    for p in sorted(paths, key=len):
        if not os.path.isdir(p):
            continue
        if any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            continue
        out.append(p)
    return out


def _blocked_ancestor(path: str) -> str | None:
    """Outermost ancestor of ``path`` that 'other' users cannot traverse."""
    parts = Path(path).parts
    for k in range(2, len(parts) + 1):
        p = str(Path(*parts[:k]))
        try:
            mode = os.stat(p).st_mode
        except OSError:
            return None
        if not mode & stat.S_IXOTH:
            return p
    return None


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _bwrap_argv(config: SandboxConfig, workdir: str, payload: str, drop: bool) -> list[str]:
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if _is_root():
        if drop:
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    made: set[str] = {"/"}
    for p in _prefixes(config):
        if any(p == d or p.startswith(d + "/") for d in _SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)):
            continue
        parts = Path(p).parts
        for k in range(2, len(parts)):
            anc = str(Path(*parts[:k]))
            if anc not in made:
                argv += ["--perms", "0755", "--dir", anc]
                made.add(anc)
        argv += ["--ro-bind", p, p]
    argv += ["--dev", "/dev", "--proc", "/proc",
             "--bind", workdir, "/sandbox", "--bind", workdir, "/tmp", "--chdir", "/sandbox",
             "--ro-bind", HARNESS_PATH, "/.marljax_harness.py", "--ro-bind", payload, "/.payload.json",
             "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sandbox",
             "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8", "--"]
    # Without site-packages the real interpreter is all we need; a venv's own
    # path may sit under /tmp, which the working directory hides.
    python = config.python if config.site_packages else os.path.realpath(config.python)
    argv += [python, "-I", "-B"] + ([] if config.site_packages else ["-S"])
    argv += ["/.marljax_harness.py", "/.payload.json"]
    return argv


def _python_argv(config: SandboxConfig, payload: str) -> list[str]:
    return [config.python, "-I", "-B"] + ([] if config.site_packages else ["-S"]) + [HARNESS_PATH, payload]


def _unshare_argv(config: SandboxConfig, payload: str) -> list[str]:
    argv = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private",
            "--ipc", "--uts"]
    if not _is_root():
        argv += ["--user", "--map-root-user"]
    return argv + _python_argv(config, payload)


def _jail_spec(config: SandboxConfig, drop: bool) -> dict:
    """What the harness must re-expose after dropping privileges (unshare level)."""
    expose, cover = [], []
    if drop:
        for p in _prefixes(config) + [os.path.dirname(HARNESS_PATH)]:
            anc = _blocked_ancestor(p)
            if anc is not None:
                expose.append(p)
                if anc not in cover:
                    cover.append(anc)
    return {"expose": expose, "cover": cover}


def _others_can_read(config: SandboxConfig) -> bool:
    return all(_blocked_ancestor(p) is None for p in _prefixes(config))


_detect_lock = threading.Lock()
_detected: dict[tuple, Isolation] = {}


def _level_isolation(level: str, config: SandboxConfig) -> Isolation:
    drop = _will_drop(level, config)
    if level == "bwrap":
        return Isolation("bwrap", True, True, drop, True, "bubblewrap namespaces; read-only system view")
    if level == "unshare":
        return Isolation("unshare", True, True, drop, drop or not _is_root(),
                         "util-linux unshare: net/pid/mount namespaces; private /tmp")
    return Isolation("none", False, False, drop, False,
                     "rlimits + scrubbed env + process-group kill only; network NOT denied")


def _will_drop(level: str, config: SandboxConfig) -> bool:
    if not (_is_root() and config.drop_privileges):
        return False
    if level in ("bwrap", "unshare"):
        return True
    return _others_can_read(config)


def detect_isolation(config: SandboxConfig | None = None) -> Isolation:
    """Strongest isolation that actually works here (probed once per config, cached)."""
    config = config or SandboxConfig()
    key = (config.isolation, config.python, config.site_packages, config.drop_privileges)
    with _detect_lock:
        if key in _detected:
            return _detected[key]
    levels = LEVELS if config.isolation == "auto" else (config.isolation,)
    reasons = []
    for level in levels:
        if level == "bwrap" and shutil.which("bwrap") is None:
            reasons.append("bwrap: not installed")
            continue
        if level == "unshare" and shutil.which("unshare") is None:
            reasons.append("unshare: not installed")
            continue
        iso = _level_isolation(level, config)
        probe = Program("def f(x):\n    return x + 1\n", (CallTest((1,), 2),), fn_name="f")
        try:
            res = _run(probe, Limits(test_timeout_s=10, program_timeout_s=20), config, iso)
        except OSError as exc:
            reasons.append(f"{level}: {exc}")
            continue
        if res.passed:
            if reasons:
                iso = replace(iso, note=iso.note + " (" + "; ".join(reasons) + ")")
            with _detect_lock:
                _detected[key] = iso
            return iso
        reasons.append(f"{level}: probe failed ({res.status}: {res.error_message or res.output_tail[-300:]})")
    raise RuntimeError("no working sandbox isolation level: " + "; ".join(reasons))


# ------------------------------------------------------------------- runner
def _check_syntax(code: str) -> tuple[str, str] | None:
    try:
        compile(code, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        return type(exc).__name__, str(exc)
    return None


def run_program(program: Program, limits: Limits | None = None, config: SandboxConfig | None = None) -> ExecutionResult:
    """Run ``program`` once in a fresh sandboxed process and classify every test."""
    limits = limits or Limits()
    config = config or SandboxConfig()
    if not program.code or not program.code.strip():
        return ExecutionResult(Status.NO_CODE, _not_run(program), error_message="no code to run")
    if len(program.code) > _MAX_CODE_CHARS:
        return ExecutionResult(Status.SYNTAX_ERROR, _not_run(program), error_type="CodeTooLong",
                               error_message=f"program longer than {_MAX_CODE_CHARS} characters")
    bad = _check_syntax(program.code)
    if bad is not None:
        return ExecutionResult(Status.SYNTAX_ERROR, _not_run(program), error_type=bad[0], error_message=bad[1])
    return _run(program, limits, config, detect_isolation(config))


def _not_run(program: Program) -> tuple[TestResult, ...]:
    return tuple(TestResult(i, t.split, Status.NOT_RUN) for i, t in enumerate(program.tests))


def _payload(program: Program, limits: Limits, nonce: str, rfd: int, drop_ids, jail, pdeathsig) -> dict:
    cpu = limits.cpu_time_s or (limits.program_timeout_s + 1)
    tests = []
    for t in program.tests:
        if isinstance(t, AssertTest):
            tests.append({"code": t.code})
        elif isinstance(t, StdioTest):
            tests.append({"input": t.input})
        else:
            tests.append({"args": list(t.args)})
    return {
        "nonce": nonce, "result_fd": rfd, "mode": program.mode, "program": program.code,
        "setup": program.setup, "fn_name": program.fn_name, "tests": tests,
        "limits": {"cpu_s": math.ceil(cpu), "as_bytes": int(limits.memory_mb) << 20,
                   "fsize_bytes": int(limits.max_file_bytes), "nofile": int(limits.max_open_files),
                   "nproc": int(limits.max_processes) if drop_ids or not _is_root() else None},
        "drop": drop_ids, "jail": jail, "pdeathsig": pdeathsig,
        "test_timeout_s": float(limits.test_timeout_s), "max_output_bytes": int(limits.max_output_bytes),
        "max_message_chars": int(limits.max_message_chars),
    }


def _kill_uid(uid: int) -> None:
    """Kill every process whose real uid is ``uid`` (a throw-away sandbox uid)."""
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                os.kill(int(entry), signal.SIGKILL)
                found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.01)


def _rmtree(path: str) -> None:
    def onerror(func, p, exc_info):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


def _run(program: Program, limits: Limits, config: SandboxConfig, iso: Isolation) -> ExecutionResult:
    t_begin = time.perf_counter()
    drop = iso.privileges_dropped
    uid = config.uid_base + secrets.randbelow(config.uid_span) if drop else None
    base = tempfile.mkdtemp(prefix="marljax-sbx-", dir=config.tmp_root)
    proc = None
    rfd = wfd = -1
    try:
        os.chmod(base, 0o711)
        workdir = os.path.join(base, "work")
        os.mkdir(workdir, 0o700)
        if drop:
            os.chown(workdir, uid, uid)
        nonce = secrets.token_hex(16)
        rfd, wfd = os.pipe()
        jail = _jail_spec(config, drop) if iso.level == "unshare" else None
        payload = _payload(program, limits, nonce, wfd, {"uid": uid, "gid": uid} if drop else None,
                           jail, pdeathsig=iso.level != "bwrap")
        ppath = os.path.join(base, "payload.json")
        fd = os.open(ppath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        if iso.level == "bwrap":
            argv = _bwrap_argv(config, workdir, ppath, drop)
        elif iso.level == "unshare":
            argv = _unshare_argv(config, ppath)
        else:
            argv = _python_argv(config, ppath)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        t_spawn = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=workdir, env=env, pass_fds=(wfd,), start_new_session=True, close_fds=True)
        os.close(wfd)
        wfd = -1
        outcome = _collect(proc, rfd, nonce, program, limits)
        outcome["spawn_s"] = time.perf_counter() - t_spawn
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if drop and iso.level == "none":
            _kill_uid(uid)
        for fd_ in (rfd, wfd):
            if fd_ >= 0:
                os.close(fd_)
        _rmtree(base)
    return _classify(program, outcome, iso, proc.returncode, time.perf_counter() - t_begin)


def _collect(proc: subprocess.Popen, rfd: int, nonce: str, program: Program, limits: Limits) -> dict:
    """Drain the record channel and the output pipe until the child ends or a limit hits."""
    out_fd = proc.stdout.fileno()
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
                    rec = json.loads(line[len(tag):])
                except ValueError:
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
    if killed:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"records": records, "killed": killed, "output": bytes(out).decode("utf-8", "replace"),
            "collect_s": time.monotonic() - t0}


def _signal_of(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if returncode > 128:  # bwrap / shells report 128 + signal
        return returncode - 128
    return None


def _classify(program: Program, outcome: dict, iso: Isolation, returncode: int | None, wall: float) -> ExecutionResult:
    records = outcome["records"]
    killed = outcome["killed"]
    load = next((r for r in records if r.get("e") == "load"), None)
    ready = next((r for r in records if r.get("e") == "ready"), None)
    ends: dict[int, dict] = {}
    for r in records:
        if r.get("e") == "end" and isinstance(r.get("i"), int):
            ends.setdefault(r["i"], r)
    started = [r["i"] for r in records if r.get("e") == "start" and isinstance(r.get("i"), int)]
    done = any(r.get("e") == "done" for r in records)
    tail = outcome["output"][-2000:]
    sig = _signal_of(returncode) if not killed else None
    common = dict(isolation=iso, wall_s=wall, exit_code=returncode, output_tail=tail,
                  startup_s=float(ready.get("startup_s", 0.0)) if ready else 0.0,
                  extra={"spawn_s": outcome.get("spawn_s", 0.0), "collect_s": outcome.get("collect_s", 0.0)})

    # Why the process stopped, when it stopped early.
    def abnormal() -> tuple[Status, str, str]:
        if killed == "timeout":
            return Status.TIMEOUT, "Timeout", "time limit exceeded"
        if killed == "output":
            return Status.RUNTIME_ERROR, "OutputLimitExceeded", "process wrote more than the output limit"
        if killed == "records":
            return Status.RUNTIME_ERROR, "ProtocolError", "result channel flooded"
        if sig == signal.SIGXCPU:
            return Status.TIMEOUT, "Timeout", "CPU time limit exceeded"
        if sig == signal.SIGKILL:
            return Status.RUNTIME_ERROR, "Killed", "killed by SIGKILL (by itself, or the kernel's OOM killer)"
        if sig is not None:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            return Status.RUNTIME_ERROR, name, f"process died with {name}"
        return Status.RUNTIME_ERROR, "EarlyExit", f"process exited (code {returncode}) before the tests finished"

    if load is not None and load.get("status") != "ok":
        st = Status(load["status"])
        return ExecutionResult(st, _not_run(program), error_type=load.get("exc_type"),
                               error_message=load.get("message"), error_traceback=load.get("traceback"), **common)

    tests: list[TestResult] = []
    prog_err = None if done else abnormal()
    tests_s = 0.0
    for i, spec in enumerate(program.tests):
        rec = ends.get(i)
        if rec is not None:
            tests_s += float(rec.get("time_s", 0.0))
            tests.append(_test_result(i, spec, rec, program.mode))
        elif i in started:  # it was running when the process stopped
            st, et, msg = prog_err
            tests.append(TestResult(i, spec.split, st, input=_input_text(spec), exc_type=et, message=msg))
        else:
            tests.append(TestResult(i, spec.split, Status.NOT_RUN,
                                    message="not run: the process ended before this test"))
    failures = [t for t in tests if not t.passed]
    if failures and failures[0].status is not Status.NOT_RUN:
        status = failures[0].status
    elif prog_err is not None:
        status = prog_err[0]
    else:
        status = Status.PASSED
    err = prog_err or (None, None, None)
    return ExecutionResult(status, tuple(tests), error_type=err[1], error_message=err[2], tests_s=tests_s, **common)


def _input_text(spec) -> str:
    if isinstance(spec, StdioTest):
        return spec.input
    if isinstance(spec, CallTest):
        return ", ".join(json.dumps(a) for a in spec.args)
    return spec.code.strip()


def _test_result(i: int, spec, rec: dict, mode: str) -> TestResult:
    status = rec.get("status")
    t = float(rec.get("time_s", 0.0))
    if status == "ok":  # stdio / call: the parent judges
        actual = rec.get("actual", "")
        if isinstance(spec, StdioTest):
            ok = compare_stdout(actual, spec.output)
            expected = spec.output
        else:
            ok = bool(rec.get("json")) and compare_value(actual, spec.output)
            expected = json.dumps(spec.output)
        if ok:
            return TestResult(i, spec.split, Status.PASSED, time_s=t)
        return TestResult(i, spec.split, Status.WRONG_ANSWER, input=_input_text(spec), expected=expected,
                          actual=actual, time_s=t)
    try:
        st = Status(status)
    except ValueError:
        st = Status.RUNTIME_ERROR
    if st is Status.PASSED and not isinstance(spec, AssertTest):
        st = Status.RUNTIME_ERROR  # the child never judges stdio/call tests
    return TestResult(i, spec.split, st, input=rec.get("input") or (None if st is Status.PASSED else _input_text(spec)),
                      expected=rec.get("expected"), actual=rec.get("actual"), exc_type=rec.get("exc_type"),
                      message=rec.get("message"), traceback=rec.get("traceback"), time_s=t)
