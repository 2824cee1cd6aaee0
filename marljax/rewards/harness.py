"""Child-side driver for the code sandbox.  Runs as ``python -I -S harness.py``.

This file is executed *inside* the sandboxed process, never imported by the
parent (the parent only needs its path).  It must stay standard-library only
and must not import marljax.

Protocol (see ``sandbox.py`` for the parent side):

1. The parent writes a JSON payload to ``./.payload.json`` in the fresh working
   directory and passes the write end of a pipe (the *record channel*) as an
   inherited fd.  The payload names that fd and a random nonce.  (A fork
   server, ``zygote.py``, instead hands the payload and fds to a forked copy
   of itself, which calls ``run_and_exit``.)
2. The harness reads and unlinks the payload, optionally builds the filesystem
   jail (``unshare`` level), applies rlimits, drops privileges, and only then
   compiles and runs the untrusted program.
3. For the load phase and for every test the harness writes one
   ``<nonce> <json>\n`` record *after* the step actually ran.  The parent
   trusts nothing else: a program that exits early (``sys.exit``,
   ``os._exit``, a signal) leaves records missing, and missing records count
   as failures.

For stdin/stdout and call-based tests the harness only reports the *actual*
output; expected outputs never enter the child and the parent compares.
For assert-style tests (HumanEval ``check``, MBPP asserts) the expected values
are part of the test code: the harness forks the program into a process of its
own and judges the asserts here, where the program cannot reach (``judge.py``).
The tests arrive on their own fd, read only after that fork.
"""

import builtins
import contextlib
import io
import json
import os
import resource
import signal
import sys
import time

# ast, linecache and traceback are imported only on error paths: importing them is
# most of the harness's own start-up cost per program.
_SOURCES = {}

_SOLUTION = "<solution>"
_SETUP = "<setup>"
_TEST = "<test>"


class _TestTimeout(BaseException):
    """Raised by the per-test alarm; BaseException so ``except Exception`` misses it."""


class OutputLimitExceeded(Exception):
    pass


class _Capture(io.TextIOBase):
    """A text stream with a byte cap; ``.buffer`` shares the same store."""

    def __init__(self, cap):
        self._data = bytearray()
        self._cap = cap
        self.overflow = False
        self.buffer = _CaptureBytes(self)

    def _add(self, b):
        if len(self._data) + len(b) > self._cap:
            room = max(0, self._cap - len(self._data))
            self._data += b[:room]
            self.overflow = True
            raise OutputLimitExceeded(f"output exceeded {self._cap} bytes")
        self._data += b

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._add(s.encode("utf-8", "backslashreplace"))
        return len(s)

    def writable(self):
        return True

    def flush(self):
        pass

    def isatty(self):
        return False

    def getvalue(self):
        return self._data.decode("utf-8", "replace")


class _CaptureBytes(io.RawIOBase):
    def __init__(self, owner):
        self._owner = owner

    def write(self, b):
        self._owner._add(bytes(b))
        return len(b)

    def writable(self):
        return True


def _write_all(fd, data):
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        data = data[n:]


def _limit(text, n):
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= n else text[: n // 2] + "\n...[truncated]...\n" + text[-n // 2 :]


def _safe_repr(value, n):
    try:
        return _limit(repr(value), n)
    except BaseException as exc:  # noqa: BLE001 - a hostile __repr__
        return f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"


def _format_tb(exc, n_chars):
    """Traceback restricted to frames of the untrusted code and the tests."""
    import linecache
    import traceback

    for name, src in _SOURCES.items():
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in (_SOLUTION, _SETUP, _TEST)]
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames[-8:])
    lines += traceback.format_exception_only(type(exc), exc)
    return _limit("".join(lines), n_chars)


# ------------------------------------------------- privileges, limits, sibling modules
_LIBC = []  # (ctypes, libc) once loaded: a fork server's children reuse its handle


def _libc():
    if not _LIBC:
        import ctypes

        _LIBC.append((ctypes, ctypes.CDLL(None, use_errno=True)))
    return _LIBC[0]


_SIBLINGS = {}


def _sibling(name):
    """``judge.py`` or ``jail.py``, loaded once from beside this file (bubblewrap binds them beside
    it as ``.marljax_judge.py`` and ``.marljax_jail.py``)."""
    if name not in _SIBLINGS:
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, name)
        if not os.path.exists(path):
            path = os.path.join(here, ".marljax_" + name)
        spec = importlib.util.spec_from_file_location("marljax_" + name[:-3], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SIBLINGS[name] = module
    return _SIBLINGS[name]


def _drop_privileges(uid, gid):
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _prctl_guard(pdeathsig):
    try:
        ctypes, libc = _libc()
    except Exception:  # noqa: BLE001 - ctypes missing: best effort
        return
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    if pdeathsig:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _apply_limits(lim):
    def setl(res, value):
        if value is None:
            return
        soft, hard = resource.getrlimit(res)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(res, (value, value if res != resource.RLIMIT_CPU else value + 1))
        except (ValueError, OSError):
            resource.setrlimit(res, (value, hard))

    setl(resource.RLIMIT_CPU, lim.get("cpu_s"))
    setl(resource.RLIMIT_AS, lim.get("as_bytes"))
    setl(resource.RLIMIT_FSIZE, lim.get("fsize_bytes"))
    setl(resource.RLIMIT_NOFILE, lim.get("nofile"))
    setl(resource.RLIMIT_NPROC, lim.get("nproc"))
    setl(resource.RLIMIT_CORE, 0)


# ------------------------------------------------------------- explanations
def _explain_assert(exc, test_src, n_chars):
    """For ``assert lhs == rhs`` failing in test code: (input, expected, actual)."""
    import ast

    tb = exc.__traceback__
    frame = lineno = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _TEST:
            frame, lineno = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    if frame is None:
        return None
    try:
        tree = ast.parse(test_src)
    except SyntaxError:
        return None
    node = None
    for n in ast.walk(tree):
        if isinstance(n, ast.Assert) and n.lineno <= lineno <= (n.end_lineno or n.lineno):
            node = n
    if node is None:
        return None
    src = ast.get_source_segment(test_src, node.test) or ""
    info = {"input": _limit(src, n_chars), "expected": None, "actual": None}
    t = node.test
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.Is)):
        left, right = t.left, t.comparators[0]
        # Report the side that calls something as "actual"; the literal as expected.
        if isinstance(left, ast.Constant) and not isinstance(right, ast.Constant):
            left, right = right, left
        info["input"] = _limit(ast.get_source_segment(test_src, left) or src, n_chars)
        try:
            g = frame.f_globals
            # At the tests' top level their locals are their globals: keep that namespace itself, whose
            # missing names are the program's (judge.py); eval's plain-dict lookups would not find them.
            loc = frame.f_locals if frame.f_locals is g else dict(frame.f_locals)
            actual = eval(compile(ast.Expression(left), _TEST, "eval"), g, loc)
            expected = eval(compile(ast.Expression(right), _TEST, "eval"), g, loc)
            info["actual"] = _safe_repr(actual, n_chars)
            info["expected"] = _safe_repr(expected, n_chars)
        except BaseException:  # noqa: BLE001 - re-evaluation is best effort
            pass
    return info


# --------------------------------------------------------------------- main
def read_payload(path):
    with open(path, "rb") as f:
        cfg = json.loads(f.read())
    with contextlib.suppress(OSError):  # where the payload is a plain file (not a read-only bind), remove it
        os.unlink(path)
    return cfg


_WARM_PROGRAM = "def f(x):\n    print(x)\n    if x < 0:\n        raise ValueError(x)\n    return [x + 1]\n"


def warm_up():
    """Prepare a fork server's interpreter: fewer first-time writes, so fewer copy-on-write faults per child.

    Imports what the error paths and ``_prctl_guard`` import lazily, then runs ``main`` on a trusted dummy
    program (unconfined: this is the zygote) more than 8 times, so that the children find its bytecode
    quickened and specialised (3.11 quickens a function on its 8th call) and caches and allocator pools warm.
    """
    import ast  # noqa: F401
    import linecache  # noqa: F401
    import traceback  # noqa: F401

    _libc()
    _sibling("judge.py")
    _sibling("jail.py")
    r, w = os.pipe()
    saved = signal.getsignal(signal.SIGALRM), sys.stdin
    try:
        for _ in range(10):
            main(
                {
                    "nonce": "0" * 32,
                    "result_fd": w,
                    "mode": "call",
                    "program": _WARM_PROGRAM,
                    "setup": "",
                    "fn_name": "f",
                    "tests": [{"args": [1]}, {"args": [-1]}, {"args": [2]}],
                    "limits": {},
                    "test_timeout_s": 10.0,
                    "max_output_bytes": 1000,
                    "max_message_chars": 200,
                },
                confine=False,
            )
            os.read(r, 1 << 16)  # ~1.5 kB of records
    finally:
        signal.signal(signal.SIGALRM, saved[0])
        sys.stdin = saved[1]
        os.close(r)
        os.close(w)
        _SOURCES.clear()
        for name in (_SOLUTION, _SETUP, _TEST):
            sys.modules["linecache"].cache.pop(name, None)


def _confine(cfg, workdir):
    # stdin of the process itself: nothing to read.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    if cfg.get("cgroup"):  # the memory cgroup of this program's processes together (cgroup.py)
        with open(cfg["cgroup"], "w") as f:
            f.write("0")  # this process
    if cfg.get("jail") is not None:
        _sibling("jail.py").build(cfg["jail"])
    if cfg.get("jail") is not None or cfg.get("in_jail"):
        drop = cfg.get("drop")
        owner = (drop["uid"], drop["gid"]) if drop else None
        _sibling("jail.py").size_workdir(*cfg["disk"], owner)
    _apply_limits(cfg["limits"])
    if cfg.get("drop"):
        _drop_privileges(cfg["drop"]["uid"], cfg["drop"]["gid"])
    _prctl_guard(cfg.get("pdeathsig", False))
    _sibling("jail.py").deny_syscalls()


def _recorder(rfd, nonce):
    """``record(*recs)``: the records, tagged with the nonce and the writing pid, in one write on the
    record channel (fewer syscalls and parent wake-ups)."""
    tag = (nonce + " ").encode()
    my_pid = os.getpid()

    def record(*recs):
        # The pid lets the parent drop records written by forked copies of the harness.
        pid = my_pid if os.getpid() == my_pid else os.getpid()
        lines = []
        for rec in recs:
            rec["pid"] = pid
            lines.append(tag + json.dumps(rec).encode() + b"\n")
        _write_all(rfd, b"".join(lines))

    return record


def _on_alarm(signum, frame):
    raise _TestTimeout()


def _timer(seconds):
    """``run_timed(fn, *args)``: ``fn(*args)`` under the per-test alarm of ``seconds``."""

    def run_timed(fn, *args, **kwargs):
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    return run_timed


def _error_record(exc, n_chars, status=None):
    """What a step that raised ``exc`` reports: its status (from the exception unless given), type,
    message and traceback."""
    if status is None:
        if isinstance(exc, _TestTimeout):
            status = "timeout"
        elif isinstance(exc, MemoryError):
            status = "memory_exceeded"
        else:
            status = "runtime_error"
    return {
        "status": status,
        "exc_type": type(exc).__name__ if not isinstance(exc, _TestTimeout) else "Timeout",
        "message": _limit(_safe_msg(exc), n_chars),
        "traceback": _safe_tb(exc, n_chars),
    }


def _syntax_error_record(exc, n_chars):
    import traceback

    return {
        "e": "load",
        "status": "syntax_error",
        "exc_type": type(exc).__name__,
        "message": _limit(_safe_msg(exc), n_chars),
        "traceback": _limit("".join(traceback.format_exception_only(type(exc), exc)), n_chars),
    }


def _load_here(code, setup_code, ns, cap, run_timed, error_record, record):
    """Call mode: run the program (and the setup) in this process; the load record."""
    real_stdout, real_stderr = sys.stdout, sys.stderr
    cap_out = _Capture(cap)
    sys.stdout = sys.stderr = cap_out
    sys.stdin = io.StringIO("")
    try:
        t0 = time.perf_counter()
        record({"e": "load_start"})
        run_timed(exec, code, ns)
        if setup_code is not None:
            run_timed(exec, setup_code, ns)
        rec = {"e": "load", "status": "ok", "time_s": time.perf_counter() - t0}
    except BaseException as exc:  # noqa: BLE001 - untrusted code may raise anything
        rec = {"e": "load"}
        rec.update(error_record(exc))
        if isinstance(exc, OutputLimitExceeded) or cap_out.overflow:
            rec["exc_type"] = "OutputLimitExceeded"
    sys.stdout, sys.stderr = real_stdout, real_stderr
    return rec


def _load_for_asserts(code, setup_code, ns, cap, test_timeout, run_timed, error_record, record, tests, fds):
    """Assert mode: the program runs in a forked process of its own (judge.py), which closes ``fds``
    (the record channel, the tests' fd); then the tests are read, unless given (the program's process
    never holds them), and the trusted setup (MBPP's test imports) runs here too, defining names for
    the tests. The namespace the tests run in, the load record and the tests."""
    t0 = time.perf_counter()
    record({"e": "load_start"})
    judge = _sibling("judge.py")
    ns, rec = judge.start_candidate(_PARTS, code, setup_code, ns, cap, test_timeout, error_record, fds)
    if tests is None:
        tests = _read_tests(fds[1])
    if rec["status"] == "ok" and setup_code is not None:
        try:
            run_timed(exec, setup_code, ns)
        except BaseException as exc:  # noqa: BLE001
            rec = {"e": "load", **error_record(exc)}
    rec["time_s"] = time.perf_counter() - t0
    return ns, rec, tests


def _call_target(ns, fn_name):
    """Call mode: the function to call, a top-level one or a method of a ``Solution`` (LeetCode's form)."""
    target = ns.get(fn_name)
    if target is None and "Solution" in ns:
        try:
            target = getattr(ns["Solution"](), fn_name)
        except BaseException:  # noqa: BLE001
            target = None
    return target


def _run_test(cfg, test, code, ns, target, out, run_timed):
    """One test of ``cfg["mode"]`` with stdout and stderr in ``out``: the fields of its end record."""
    mode = cfg["mode"]
    if mode == "stdin":
        data = test["input"].encode()
        mfd = os.memfd_create("stdin")
        _write_all(mfd, data)
        os.lseek(mfd, 0, os.SEEK_SET)
        if mfd != 0:  # fd 0 may be free: a previous test's open(0) closed it
            os.dup2(mfd, 0)
            os.close(mfd)
        sys.stdin = io.TextIOWrapper(
            io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="replace"
        )
        tns = {"__name__": "__main__", "__builtins__": builtins}
        try:
            run_timed(exec, code, tns)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        return {"status": "ok", "actual": out.getvalue()}
    sys.stdin = io.StringIO("")
    if mode == "call":
        if target is None:
            raise NameError("function {!r} is not defined".format(cfg["fn_name"]))
        value = run_timed(target, *test["args"])
        try:
            return {"status": "ok", "actual": json.dumps(value), "json": True}
        except (TypeError, ValueError):
            return {"status": "ok", "actual": _safe_repr(value, cfg["max_message_chars"]), "json": False}
    src = test["code"]  # assert
    _SOURCES[_TEST] = src
    tcode = compile(src, _TEST, "exec", dont_inherit=True)
    run_timed(exec, tcode, ns)
    return {"status": "passed"}


def _test_record(cfg, i, test, code, ns, target, run_timed, error_record):
    """Test ``i``'s end record: how it ended (a wrong answer explained where an assert of the tests
    failed), what it printed or returned (non-assert modes: the parent compares), its time."""
    mode, n_chars, cap = cfg["mode"], cfg["max_message_chars"], cfg["max_output_bytes"]
    real_stdout, real_stderr = sys.stdout, sys.stderr
    out = _Capture(cap)
    rec = {"e": "end", "i": i}
    t0 = time.perf_counter()
    try:
        sys.stdout = sys.stderr = out
        rec.update(_run_test(cfg, test, code, ns, target, out, run_timed))
        if out.overflow:
            raise OutputLimitExceeded(f"output exceeded {cap} bytes")
    except AssertionError as exc:
        tb = exc.__traceback__
        last = None
        while tb is not None:
            last = tb.tb_frame.f_code.co_filename
            tb = tb.tb_next
        if mode == "assert" and last == _TEST:
            rec.update(
                status="wrong_answer", exc_type="AssertionError", message=_limit(_safe_msg(exc), n_chars)
            )
            try:
                info = run_timed(_explain_assert, exc, test["code"], n_chars)
            except BaseException:  # noqa: BLE001
                info = None
            if info:
                rec.update(info)
        else:
            rec.update(error_record(exc))
    except BaseException as exc:  # noqa: BLE001
        rec.update(error_record(exc))
        if isinstance(exc, OutputLimitExceeded) or out.overflow:
            rec["exc_type"] = "OutputLimitExceeded"
    finally:
        sys.stdout, sys.stderr = real_stdout, real_stderr
    rec["time_s"] = time.perf_counter() - t0
    if "actual" in rec and rec["actual"] is not None and mode != "assert":
        rec["actual"] = rec["actual"][:cap]
    return rec


def main(cfg, confine=True):
    """Run one payload; ``confine=False`` only for ``warm_up``'s trusted dummy runs in a fork server."""
    t_start = time.perf_counter()
    rfd = cfg["result_fd"]
    os.set_inheritable(rfd, False)
    record = _recorder(rfd, cfg["nonce"])
    if confine:
        _confine(cfg, os.getcwd())
    env_info = {"uid": os.getuid(), "pid": os.getpid()}

    n_chars, cap, test_timeout, mode = (
        cfg["max_message_chars"],
        cfg["max_output_bytes"],
        cfg["test_timeout_s"],
        cfg["mode"],
    )
    signal.signal(signal.SIGALRM, _on_alarm)
    # Asserts are judged in this process, the program runs in a forked one (judge.py); its own
    # per-call limit fires first, this process's a little later.
    slack = _sibling("judge.py").SLACK_S if mode == "assert" else 0.0
    run_timed = _timer(test_timeout + slack)

    def error_record(exc, status=None):
        return _error_record(exc, n_chars, status)

    program = cfg.pop("program")
    setup = cfg.pop("setup") or ""
    tests = cfg.pop("tests", None)  # given inline by warm_up only; else on their own fd
    tests_fd = cfg.pop("tests_fd", None)
    if tests is None and mode != "assert":
        tests = _read_tests(tests_fd)
    _SOURCES[_SOLUTION], _SOURCES[_SETUP] = program, setup

    # ---- load phase: compile (and for non-stdin modes, execute) the program.
    try:
        code = compile(program, _SOLUTION, "exec", dont_inherit=True)
        setup_code = compile(setup, _SETUP, "exec", dont_inherit=True) if setup else None
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        record(_syntax_error_record(exc, n_chars))
        return
    ns = {"__name__": "__main__" if mode == "stdin" else "solution", "__builtins__": builtins}
    if mode == "assert":
        ns, rec, tests = _load_for_asserts(
            code, setup_code, ns, cap, test_timeout, run_timed, error_record, record, tests, [rfd, tests_fd]
        )
    elif mode != "stdin":
        rec = _load_here(code, setup_code, ns, cap, run_timed, error_record, record)
    else:
        rec = {"e": "load", "status": "ok", "time_s": 0.0}
    if rec["status"] != "ok":
        record(rec)
        return
    record(rec, {"e": "ready", "startup_s": time.perf_counter() - t_start, **env_info})

    target = _call_target(ns, cfg["fn_name"]) if mode == "call" else None

    def record_after_test(*recs):
        try:
            record(*recs)
        except BaseException:  # noqa: BLE001 - e.g. a late alarm; retry once
            record(*recs)

    # A test's "end" record goes out with the next test's "start" (or with "done"): one write, still
    # after the test ran and before the next one starts.
    ended = []
    for i, test in enumerate(tests):
        record_after_test(*ended, {"e": "start", "i": i})
        ended = [_test_record(cfg, i, test, code, ns, target, run_timed, error_record)]
    record_after_test(*ended, {"e": "done"})


def _safe_tb(exc, n_chars):
    remote = getattr(exc, "remote_traceback", None)  # an exception of the program's process (judge.py)
    if isinstance(remote, str):
        return _limit(remote, n_chars)
    try:
        return _format_tb(exc, n_chars)
    except BaseException:  # noqa: BLE001 - e.g. MemoryError while importing traceback
        return None


def _safe_msg(exc):
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001
        return f"<unprintable {type(exc).__name__}>"


def _read_tests(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks))


class _PARTS:
    """What ``judge.start_candidate`` uses of this file (which is not importable by name)."""

    _libc = staticmethod(_libc)
    _Capture = _Capture
    OutputLimitExceeded = OutputLimitExceeded
    _TestTimeout = _TestTimeout


def run_and_exit(load):
    """Run the payload ``load()`` returns, then end the process: 0, or 70 when the harness itself failed."""
    status = 0
    try:
        main(load())
    except BaseException:  # noqa: BLE001 - a harness failure: say why on fd 2
        status = 70
        try:
            import traceback

            os.write(2, traceback.format_exc().encode()[-4000:])
        except BaseException:  # noqa: BLE001
            pass
    os._exit(status)


if __name__ == "__main__":
    run_and_exit(lambda: read_payload(sys.argv[1]))
