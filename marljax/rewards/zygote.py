"""A warm interpreter inside the sandbox that forks one child per program.

Runs as ``python -I -S -B zygote.py <harness.py> <control fd> [<jail>]`` in a fresh pid
namespace: as its pid 2 inside bubblewrap (bwrap's reaper is pid 1), or as its pid 1
under ``unshare``, where it first builds the harness's filesystem jail (``<jail>``, JSON)
once for all its programs.  It refuses to run anywhere else, since it kills every other
process it can see.  The parent side is ``fork_server.py``.  Standard library only;
never imported by marljax.

Once warm it says ``ready\n``.  Per job, over the control socket (a stream):

1. parent -> zygote: 8-byte big-endian length + JSON payload (as for
   ``harness.py``), with three fds attached: the write ends of the output pipe
   and of the record channel, and the tests' file (which the zygote never reads).
2. The zygote forks.  The child starts a new session, makes the output pipe
   its stdout/stderr and runs the harness on the payload, exactly as a fresh
   interpreter would (rlimits, dropped uid, records).
3. parent -> zygote: ``end\\n`` once it has collected what it needs (or a limit hit).
4. The zygote SIGKILLs the child's session, reaps the child, SIGKILLs every
   process left in the namespace except pid 1 and itself, reaps them (it is the namespace's child
   subreaper: no zombie of one job is left for the next to see), empties the working directory
   (under ``unshare`` a tmpfs inside the jail), and answers one JSON line: ``{"exit": <returncode>,
   "dirty": <bool>}``.  ``dirty`` says the job left something outside the
   working directory (SysV IPC objects, files in /dev/shm, POSIX message queues) that only
   a fresh sandbox removes; the parent then replaces the server.

If the zygote cannot kill everything within a few seconds it exits, and the kernel
(pid 1 gone) or bwrap tears the whole namespace down with it.
"""

import contextlib
import gc
import importlib.util
import json
import os
import signal
import socket
import struct
import sys
import time

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _load_harness(path):
    spec = importlib.util.spec_from_file_location("marljax_harness", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _read_job(sock):
    """(payload, [out_fd, rec_fd, tests_fd]); (None, []) when the parent closed the socket."""
    head, fds, _, _ = socket.recv_fds(sock, 8, 3)
    if not head:
        return None, []
    head += _recv_exact(sock, 8 - len(head))
    (n,) = struct.unpack("!Q", head)
    return json.loads(_recv_exact(sock, n)), fds


def _read_end(sock):
    if _recv_exact(sock, 4) != b"end\n":
        raise EOFError


def _state(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0]


def _sweep(deadline_s=5.0):
    """SIGKILL every live process of the namespace but pid 1 and this one; True once none is left."""
    me = os.getpid()
    t_end = time.monotonic() + deadline_s
    while True:
        alive = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in (1, me):
                continue
            try:
                if _state(int(entry)) == b"Z":
                    continue
                os.kill(int(entry), signal.SIGKILL)
                alive = True
            except OSError:
                continue
        if not alive:
            return True
        if time.monotonic() > t_end:
            return False
        time.sleep(0.001)


def _only_me_left():
    """Reap this process's dead children; True when it has none left.

    The zygote is the namespace's child subreaper: every process a job starts descends from it, and
    orphans are re-parented to it (before their parent turns zombie), not to pid 1.  So no child
    left means nothing but pid 1 and the zygote is alive, and the /proc sweep can be skipped.
    """
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _dirty():
    # Raw reads, not text files: every object the zygote allocates per job costs a page fault after a fork.
    for name in (b"/proc/sysvipc/shm", b"/proc/sysvipc/sem", b"/proc/sysvipc/msg"):
        try:
            fd = os.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            if os.read(fd, 4096).count(b"\n") > 1:  # a header line, then one line per object
                return True
        finally:
            os.close(fd)
    for name in (b"/dev/shm", b"/dev/mqueue"):
        try:
            if os.listdir(name):
                return True
        except OSError:
            continue
    return False


def _child(harness, sock, job, out_fd, rec_fd, tests_fd):
    try:
        sock.close()
        os.setsid()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        harness._libc()[1].prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as a fresh process would be
        job["result_fd"], job["tests_fd"] = rec_fd, tests_fd
    except BaseException:  # noqa: BLE001
        os._exit(71)
    harness.run_and_exit(lambda: job)


def main():
    # The sweep kills every other process of the namespace: never outside one (pids 1 and 2 of the
    # host's namespace are init and kthreadd, so these two can only be a fresh namespace's).
    if os.getpid() not in (1, 2):
        sys.exit("zygote.py must run as pid 1 or 2 of its own pid namespace (under unshare or bwrap)")
    os.environ.pop("LD_BIND_NOW", None)  # set for this interpreter's start only (see fork_server.py)
    harness = _load_harness(sys.argv[1])
    sock = socket.socket(fileno=int(sys.argv[2]))
    jail = harness._sibling("jail.py") if len(sys.argv) > 3 else None
    if jail is not None:  # unshare: the jail every program of this sandbox runs in, built once
        jail.build(json.loads(sys.argv[3]))
    harness.warm_up()
    gc.freeze()  # children's garbage collections then leave the shared heap's pages alone (fewer copies)
    # Without a uid drop the programs share this uid: keep them from ptracing the zygote.
    harness._libc()[1].prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    if harness._libc()[1].prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # see _only_me_left
        sys.exit("zygote.py: prctl(PR_SET_CHILD_SUBREAPER) failed")
    sock.sendall(b"ready\n")
    while True:
        job, fds = _read_job(sock)
        if job is None:
            return
        job["in_jail"] = jail is not None  # the job sizes its working directory (jail.size_workdir)
        pid = os.fork()
        if pid == 0:
            _child(harness, sock, job, *fds)
        for fd in fds:
            os.close(fd)
        _read_end(sock)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not _only_me_left():  # something of the job outlived it: kill everything, then reap it
            if not _sweep():
                os._exit(3)
            _only_me_left()
        dirty = _dirty() or (jail is not None and not jail.empty_workdir())
        reply = b'{"exit": %d, "dirty": %s}\n' % (
            os.waitstatus_to_exitcode(status),
            b"true" if dirty else b"false",
        )
        sock.sendall(reply)


if __name__ == "__main__":
    with contextlib.suppress(EOFError):
        main()
    os._exit(0)
