"""Assert-style tests judged in a process the candidate cannot reach.  Standard library only; runs
inside the sandbox, loaded by ``harness.py`` from beside itself; never imported by marljax.

For HumanEval and MBPP the expected values are part of the test code, so whoever runs the asserts
decides the verdict.  The harness therefore forks (after the jail, rlimits and uid drop are in
place, before any untrusted code runs):

* the *candidate* process runs the program and serves requests for its names, calls and
  attributes (``serve``); it closes the record channel and the tests' fd first, so it holds
  neither, and it never saw the tests (they arrive on their own fd, read by the judge only);
* the *judge* process (the harness itself, non-dumpable: a process of the same uid can neither
  ptrace it nor open its ``/proc`` files) runs the tests in a namespace whose missing names are
  looked up in the candidate (``JudgeNamespace``), and writes the records.

What crosses from the candidate is plain data only (``encode``/``decode``: None, bool, int,
float, complex, str, bytes, list, tuple, dict, set, frozenset, range; an iterator as the list of
what it yields); any other object stays in the candidate and the judge holds a ``Remote`` handle to
it, which it can call, read attributes of, or pass back, and which equals only itself.  So no
change to the candidate's interpreter (patched ``json``, builtins, a forged recorder, an object
whose ``__eq__`` always says yes) reaches the verdict.  Not covered: a test that relies on a
helper function of the candidate's own file (HumanEval/32's ``poly``) trusts that helper.
"""

import builtins
import contextlib
import io
import json
import os
import signal
import struct
import sys

_MAX_FRAME = 64 << 20  # a reply larger than this ends the candidate: it is not an answer
SLACK_S = 0.25  # the judge's time limit per test exceeds the program's own by this much
_LOAD_STATUSES = ("ok", "runtime_error", "timeout", "memory_exceeded", "syntax_error")


# ------------------------------------------------------------------ plain data over a pipe
def encode(value, keep):
    """``value`` as JSON-able plain data; ``keep(obj)`` gives the handle id of anything else."""
    if value is None or type(value) in (bool, str, float):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a subclass's methods stay behind
    if isinstance(value, int):
        value = int(value)
        return value if -(1 << 53) < value < (1 << 53) else ["int", format(value, "x")]
    if isinstance(value, float):
        return float(value)
    if isinstance(value, complex):
        return ["complex", value.real, value.imag]
    if isinstance(value, (bytes, bytearray)):
        return ["bytearray" if isinstance(value, bytearray) else "bytes", bytes(value).hex()]
    if isinstance(value, range):
        return ["range", value.start, value.stop, value.step]
    if isinstance(value, dict):
        return ["dict", [[encode(k, keep), encode(v, keep)] for k, v in value.items()]]
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            return [kind.__name__, [encode(v, keep) for v in value]]
    if hasattr(type(value), "__next__"):  # a generator, map, zip ...: what it yields
        return ["iter", [encode(v, keep) for v in value]]
    return ["ref", keep(value), type(value).__name__[:100]]


_CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def decode(data, remote):
    """The plain value ``encode`` described; ``remote(id, type name)`` makes a handle's object."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError("not an encoded value")
    kind, rest = data[0], data[1:]
    if kind in _CONTAINERS:
        return _CONTAINERS[kind](decode(v, remote) for v in _list(rest[0]))
    if kind == "iter":
        return iter([decode(v, remote) for v in _list(rest[0])])
    if kind == "dict":
        return {decode(k, remote): decode(v, remote) for k, v in _list(rest[0])}
    if kind == "int":
        return int(_str(rest[0]), 16)
    if kind == "complex":
        return complex(_float(rest[0]), _float(rest[1]))
    if kind in ("bytes", "bytearray"):
        raw = bytes.fromhex(_str(rest[0]))
        return raw if kind == "bytes" else bytearray(raw)
    if kind == "range":
        return range(*(_int(v) for v in rest[:3]))
    if kind == "ref":
        return remote(_int(rest[0]), _str(rest[1]) if len(rest) > 1 else "object")
    raise ValueError(f"unknown kind {kind[:40]!r}")


def _list(v):
    if type(v) is not list:
        raise ValueError("expected a list")
    return v


def _str(v):
    if type(v) is not str:
        raise ValueError("expected a string")
    return v


def _float(v):
    if type(v) not in (int, float):
        raise ValueError("expected a number")
    return float(v)


def _int(v):
    if type(v) is not int:
        raise ValueError("expected an integer")
    return v


class Channel:
    """One end of a pair of pipes (pipes, not a socket: importing ``socket`` costs milliseconds)."""

    def __init__(self, rfd, wfd):
        self.rfd, self.wfd = rfd, wfd

    def send(self, message):
        data = (lambda body: struct.pack("!I", len(body)) + body)(json.dumps(message).encode())
        while data:
            data = data[os.write(self.wfd, data) :]

    def receive(self):
        """One message; EOFError when the other side is gone or broke the framing."""
        (n,) = struct.unpack("!I", self._exact(4))
        if n > _MAX_FRAME:
            raise EOFError("frame too large")
        return json.loads(self._exact(n))

    def _exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(self.rfd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("the other process closed the connection")
            buf += chunk
        return bytes(buf)


# ------------------------------------------------------------------ the candidate's side
def serve(chan, ns, call_timed, describe_error, load):
    """Send the ``load`` record (with handles to the program's functions and classes, when it loaded),
    then answer the judge's requests until it goes: ``["get", name]``, ``["call", id, args, kwargs]``,
    ``["attr", id, name]``.  ``call_timed(fn, *args)`` runs untrusted code under the test limits;
    ``describe_error(exc)`` gives ``[type name, message, traceback]``."""
    handles = {}

    def keep(obj):
        handles[id(obj)] = obj
        return id(obj)

    def resolve(i, _name):
        return handles[i]

    if load.get("status") == "ok":  # saves the judge a request per name its tests use
        load["names"] = {
            k: [keep(v), type(v).__name__] for k, v in ns.items() if callable(v) and not k.startswith("__")
        }
    chan.send(load)

    while True:
        try:
            request = chan.receive()
        except (EOFError, OSError, ValueError):
            os._exit(0)
        try:
            op = request[0]
            if op == "get":
                name = request[1]
                if name not in ns:
                    raise NameError(f"name {name!r} is not defined")
                value = ns[name]
            elif op == "call":
                fn = handles[request[1]]
                args = decode(request[2], resolve)
                kwargs = decode(request[3], resolve)
                value = call_timed(fn, *args, **kwargs)
            else:
                value = call_timed(getattr, handles[request[1]], request[2])
            reply = ["ok", call_timed(encode, value, keep)]
        except BaseException as exc:  # noqa: BLE001 - the candidate's failure is the judge's to report
            reply = ["err", *describe_error(exc)]
        try:
            chan.send(reply)
        except (TypeError, ValueError, OverflowError, RecursionError):
            chan.send(["err", "TypeError", "the value cannot be sent to the judge", None])


# ------------------------------------------------------------------ the judge's side
class RemoteError(Exception):
    """An exception of the candidate's that is not a builtin one; ``remote_traceback``: its frames."""


_DEAD = "CandidateGone"


class Link:
    """The judge's end: ``request`` sends one request and returns the decoded value, or raises the
    candidate's exception.  After a time-out or a broken reply the candidate is killed; every later
    request raises."""

    def __init__(self, chan, pid, timeout_error):
        self.chan, self.pid, self.timeout_error = chan, pid, timeout_error
        self.gone = None

    def request(self, message):
        if self.gone is not None:
            raise RemoteError(self.gone)
        try:
            self.chan.send(message)
            reply = self.chan.receive()
            if type(reply) is not list or not reply or reply[0] not in ("ok", "err"):
                raise ValueError("malformed reply")
            if reply[0] == "ok":
                return decode(reply[1], self.remote)
        except self.timeout_error:
            self.kill("the program was stopped after a test's time limit")
            raise
        except (EOFError, OSError, ValueError, TypeError, IndexError, RecursionError, MemoryError) as exc:
            self.kill(f"the program's process ended or broke the protocol ({type(exc).__name__})")
            raise RemoteError(self.gone) from None
        if reply[1:2] == ["Timeout"]:
            raise self.timeout_error()
        raise _rebuild(reply[1:])

    def remote(self, handle, type_name):
        return Remote(self, handle, type_name)

    def kill(self, why):
        self.gone = why
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)


def _text(v, n=4000):
    return v[:n] if type(v) is str else None


def _rebuild(fields):
    """The candidate's exception as one the test code can catch: a builtin type where it names one
    (``ValueError``, ``AssertionError`` ...), else a ``RemoteError`` carrying the name."""
    name = _text(fields[0] if fields else None, 100) or "Exception"
    message = _text(fields[1] if len(fields) > 1 else None) or ""
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)) or cls in (
        SystemExit,
        KeyboardInterrupt,
    ):
        cls = type(name if name.isidentifier() else "RemoteError", (RemoteError,), {})
    try:
        exc = cls(message)
    except BaseException:  # noqa: BLE001 - e.g. UnicodeDecodeError wants five arguments
        exc = type(name if name.isidentifier() else "RemoteError", (RemoteError,), {})(message)
    exc.remote_traceback = _text(fields[2] if len(fields) > 2 else None)
    return exc


class Remote:
    """An object that stayed in the candidate: call it, read its attributes, pass it back; it equals
    only itself (no ``__eq__`` of the candidate's ever runs in the judge)."""

    __slots__ = ("_link", "_handle", "_type")

    def __init__(self, link, handle, type_name):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *args, **kwargs):
        keep = _handle_of
        return self._link.request(["call", self._handle, encode(args, keep), encode(kwargs, keep)])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.request(["attr", self._handle, name])

    def __eq__(self, other):
        return isinstance(other, Remote) and other._handle == self._handle

    def __hash__(self):
        return hash(self._handle)

    def __repr__(self):
        return f"<{self._type} of the program>"


def _handle_of(obj):
    if isinstance(obj, Remote):
        return obj._handle
    raise TypeError(f"a {type(obj).__name__} cannot be passed to the program (plain data only)")


class JudgeNamespace(dict):
    """The tests' globals: a name they do not define (and no builtin has) is the candidate's.
    ``names``: the program's functions and classes as it loaded (``serve``'s load record)."""

    def __init__(self, link, names, **given):
        super().__init__(**given)
        self.link = link
        if isinstance(names, dict):
            for name, ref in names.items():
                if type(name) is str and type(ref) is list and len(ref) == 2 and type(ref[0]) is int:
                    self[name] = Remote(link, ref[0], str(ref[1])[:100])

    def __missing__(self, name):
        if name.startswith("__") or hasattr(builtins, name):
            raise KeyError(name)
        try:
            return self.link.request(["get", name])
        except NameError:
            raise KeyError(name) from None


def start(candidate_main, close_in_candidate):
    """Fork the candidate: it closes ``close_in_candidate`` (fds) and runs ``candidate_main(channel)``;
    the judge (this process) gets ``(channel, pid)``."""
    to_candidate, to_judge = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in [to_candidate[1], to_judge[0], *close_in_candidate]:
                os.close(fd)
        except BaseException:  # noqa: BLE001
            os._exit(71)
        candidate_main(Channel(to_candidate[0], to_judge[1]))
        os._exit(0)
    os.close(to_candidate[0])
    os.close(to_judge[1])
    return Channel(to_judge[0], to_candidate[1]), pid


def start_candidate(h, code, setup_code, ns, cap, test_timeout, error_record, close):
    """Fork the process that runs the program (``h``: the harness's parts); this one becomes the judge.
    Returns the judge's namespace for the tests and the load record built from what the program
    reported."""
    h._libc()[1].prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the program's process cannot ptrace or read us

    def call_timed(fn, *args, **kwargs):
        out = h._Capture(cap)
        sys.stdout = sys.stderr = out
        signal.setitimer(signal.ITIMER_REAL, test_timeout)
        try:
            value = fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        if out.overflow:
            raise h.OutputLimitExceeded(f"output exceeded {cap} bytes")
        return value

    def describe(exc):
        rec = error_record(exc)
        return [rec["exc_type"], rec["message"], rec["traceback"]]

    def candidate_main(chan):
        h._libc()[1].prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: dies with the judge
        sys.stdin = io.StringIO("")
        try:
            call_timed(exec, code, ns)
            if setup_code is not None:
                call_timed(exec, setup_code, ns)
            rec = {"status": "ok"}
        except BaseException as exc:  # noqa: BLE001 - untrusted code may raise anything
            rec = error_record(exc)
            if isinstance(exc, h.OutputLimitExceeded):
                rec["exc_type"] = "OutputLimitExceeded"
        serve(chan, ns, call_timed, describe, rec)

    chan, pid = start(candidate_main, [fd for fd in close if fd is not None and fd >= 0])
    link = Link(chan, pid, h._TestTimeout)
    signal.setitimer(signal.ITIMER_REAL, test_timeout + SLACK_S)
    try:
        got = chan.receive()
    except h._TestTimeout:
        link.kill("the program was stopped at its time limit")
        got = {"status": "timeout", "exc_type": "Timeout", "message": ""}
    except (EOFError, OSError, ValueError, RecursionError, MemoryError):
        link.kill("the program's process ended")
        got = {"status": "runtime_error", "exc_type": "EarlyExit", "message": "the program's process ended"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    got = got if isinstance(got, dict) else {}
    status = got.get("status") if got.get("status") in _LOAD_STATUSES else "runtime_error"
    rec = {"e": "load", "status": status}
    for key in ("exc_type", "message", "traceback"):
        if isinstance(got.get(key), str):
            rec[key] = got[key][: 4 * cap]
    names = got.get("names") if status == "ok" else None
    return JudgeNamespace(link, names, __name__="solution", __builtins__=builtins), rec
