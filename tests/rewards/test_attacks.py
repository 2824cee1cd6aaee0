"""Hostile programs: each is contained (the harness survives, the result is a failure of the
right class, nothing is left behind).  Where containment depends on the isolation level in
force, the test checks the outcome that level promises and says so when it must skip."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile

import pytest

from marljax.rewards import AssertTest, CallTest, Limits, Program, Status

LIM = Limits(test_timeout_s=2.0, program_timeout_s=10.0, memory_mb=256, max_processes=16)


def call(code, expected=None, args=()):
    return Program(code, (CallTest(tuple(args), expected),), fn_name="f")


def test_infinite_loop(run):
    res = run(call("def f():\n    while True:\n        pass\n"), LIM)
    assert res.status is Status.TIMEOUT


def test_infinite_loop_at_import_time(run):
    res = run(call("while True:\n    pass\n"), LIM)
    assert res.status is Status.TIMEOUT and res.tests[0].status is Status.NOT_RUN


def test_fork_bomb_is_contained_and_reaped(run, isolation):
    # Bounded on purpose: at most 2**7 = 128 sleeping processes even if no cap applied.
    # Which process meets the cap first is a race, so the outcome is a caught fork error
    # or the timeout kill; either way nothing passes and nothing is left (no_leaks).
    code = (
        "import os, time\ndef f():\n    for _ in range(7):\n        os.fork()\n"
        "    time.sleep(30)\n    return 1\n"
    )
    res = run(call(code, 0), LIM)
    assert not res.passed
    assert res.status in (Status.RUNTIME_ERROR, Status.TIMEOUT), res


def test_process_cap_is_enforced(run, isolation):
    # Only the original process forks (children just sleep), so with a working
    # RLIMIT_NPROC it deterministically meets EAGAIN before its 64th child.
    code = (
        "import os, time\ndef f():\n    for _ in range(64):\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n    return 1\n"
    )
    res = run(call(code, 0), LIM)
    assert not res.passed
    if isolation.privileges_dropped or os.geteuid() != 0:
        assert res.status is Status.RUNTIME_ERROR and res.tests[0].exc_type == "BlockingIOError", res
    else:
        # No cap as root: all 64 forks succeed, f returns 1 != 0, and the group kill reaps them.
        assert res.status is Status.WRONG_ANSWER, res


def test_memory_bomb(run):
    code = "def f():\n    hog = []\n    while True:\n        hog.append(bytearray(8 << 20))\n"
    res = run(call(code), LIM)
    assert res.status is Status.MEMORY_EXCEEDED


def test_unbounded_recursion(run):
    res = run(call("def f(n=0):\n    return f(n + 1)\n"), LIM)
    assert res.status is Status.RUNTIME_ERROR and res.tests[0].exc_type == "RecursionError"


def test_recursion_with_raised_limit_crashes_cleanly(run):
    code = "import sys\nsys.setrecursionlimit(10**7)\ndef f(n=0):\n    return f(n + 1)\n"
    res = run(call(code), LIM)
    # 3.11 keeps Python frames off the C stack: it ends in MemoryError, a time-out, or SIGSEGV.
    assert res.status in (Status.RUNTIME_ERROR, Status.MEMORY_EXCEEDED, Status.TIMEOUT)


@pytest.mark.parametrize(
    "how",
    [
        "print('x' * (50 << 20))",
        "import os\n    os.write(1, b'x' * (8 << 20))",
        "import sys\n    sys.stdout.buffer.write(b'y' * (8 << 20))",
    ],
)
def test_megabytes_of_output(run, how):
    res = run(call(f"def f():\n    {how}\n    return 1\n", 1), LIM)
    assert res.status is Status.RUNTIME_ERROR and res.pass_fraction() == 0.0
    assert "OutputLimitExceeded" in ((res.tests[0].exc_type or "") + (res.error_type or ""))
    assert len(res.output_tail) <= 2000


@pytest.mark.parametrize("code", ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"])
def test_exit_before_tests_run_is_not_a_pass(run, code):
    for prog in (call(code + "def f():\n    return 1\n", 1), Program(code, (AssertTest("assert True"),))):
        res = run(prog, LIM)
        assert res.status is Status.RUNTIME_ERROR and res.pass_fraction() == 0.0


def test_killing_the_parent(run, isolation):
    if isolation.level == "none" and not isolation.privileges_dropped:
        pytest.skip(
            "isolation 'none' without a dropped uid: the program runs as the parent's user and "
            "could really kill it; contained only with bwrap/unshare or a throw-away uid"
        )
    code = (
        "import os, signal\ndef f():\n    for target in (os.getppid(), 1, -1):\n        try:\n"
        "            os.kill(target, signal.SIGKILL)\n        except OSError:\n            pass\n    return 1\n"
    )
    res = run(call(code, 2), LIM)
    assert not res.passed  # kill(-1) may take the program itself down: runtime_error or wrong_answer
    assert res.status in (Status.WRONG_ANSWER, Status.RUNTIME_ERROR)
    # We are still alive; a second run works.
    assert run(call("def f():\n    return 2\n", 2), LIM).passed


def test_writing_outside_the_working_directory(run, isolation, tmp_path):
    if not isolation.fs_confined:
        pytest.skip(
            f"isolation {isolation.level!r} does not confine writes (runs as the parent's user "
            "without a mount namespace)"
        )
    token = secrets.token_hex(8)
    targets = [
        str(tmp_path / f"escape-{token}"),
        os.path.join(tempfile.gettempdir(), f"marljax-escape-{token}"),
        f"/dev/shm/marljax-escape-{token}",
        f"/var/tmp/marljax-escape-{token}",
        os.path.join(os.getcwd(), f"escape-{token}"),
        f"/escape-{token}",
    ]
    code = (
        "def f(paths):\n    ok = []\n    for p in paths:\n        try:\n"
        "            with open(p, 'w') as fh:\n                fh.write('x')\n            ok.append(p)\n"
        "        except OSError:\n            pass\n    with open('inside.txt', 'w') as fh:\n"
        "        fh.write('fine')\n    return len(ok)\n"
    )
    res = run(call(code, 0, [targets]), LIM)
    assert res.tests[0].status in (Status.PASSED, Status.WRONG_ANSWER)
    for p in targets:
        assert not os.path.exists(p), f"sandbox wrote {p} on the host"


def test_files_left_anywhere_writable_do_not_reach_the_next_program(run, isolation):
    if not isolation.fs_confined:
        pytest.skip(
            f"isolation {isolation.level!r} does not confine writes (runs as the parent's user "
            "without a mount namespace)"
        )
    # The first program drops a file into every directory it can write (three levels deep from /,
    # plus the usual world-writable places); the second looks for each of them.
    token = "marljax-left-" + secrets.token_hex(8)
    litter = (
        "import os\ndef f(token):\n    seen, left = set(), []\n"
        "    todo = [('/', 0)] + [(d, 9) for d in ('/tmp', '/var/tmp', '/dev/shm', '/run/lock', '/dev/mqueue',"
        " os.getcwd())]\n"
        "    while todo:\n        d, depth = todo.pop()\n        if d in seen or d.startswith(('/proc', '/sys')):\n"
        "            continue\n        seen.add(d)\n        try:\n"
        "            with open(os.path.join(d, token), 'w') as fh:\n                fh.write('x')\n"
        "            left.append(os.path.join(d, token))\n        except OSError:\n            pass\n"
        "        if depth < 3:\n            try:\n"
        "                todo += [(e.path, depth + 1) for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]\n"
        "            except OSError:\n                pass\n    return left\n"
    )
    first = run(call(litter, None, [token]), LIM)
    left = eval(first.tests[0].actual)  # noqa: S307 - the program's JSON list of paths
    assert os.path.join("/tmp", token) in left or any(p.startswith("/sandbox/") for p in left), left
    look = "import os\ndef f(paths):\n    return [p for p in paths if os.path.exists(p)]\n"
    res = run(call(look, [], [left]), LIM)
    assert res.passed, f"left by the previous program: {res.tests[0].actual}"


def test_reading_other_processes_environment(run, isolation):
    secret = "marljax-secret-" + secrets.token_hex(8)
    os.environ["MARLJAX_TEST_SECRET"] = secret  # in the parent's own environment ...
    holder = subprocess.Popen(["sleep", "30"], env={"MARLJAX_TEST_SECRET": secret})  # ... and in a process's
    try:
        code = (
            "import os\ndef f(secret):\n    found = [k for k, v in os.environ.items() if secret in v]\n"
            "    for pid in os.listdir('/proc'):\n        try:\n"
            "            with open(f'/proc/{pid}/environ', 'rb') as fh:\n"
            "                if secret.encode() in fh.read():\n                    found.append(pid)\n"
            "        except OSError:\n            pass\n    return found\n"
        )
        res = run(call(code, [], [secret]), LIM)
    finally:
        holder.kill()
        holder.wait()
        del os.environ["MARLJAX_TEST_SECRET"]
    if not (isolation.pid_namespace or isolation.privileges_dropped):
        # The environment is always scrubbed; /proc of same-user processes is readable at this level.
        pytest.skip("isolation 'none' as the parent's user: other processes' /proc/*/environ is readable")
    assert res.passed, f"secret leaked: {res.tests[0].actual}"


def test_opening_a_network_socket(run, isolation):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            conn, _ = server.accept()
            accepted.append(conn)
        except OSError:
            pass

    code = (
        "import socket\ndef f(port):\n    for host in ('127.0.0.1', '1.1.1.1'):\n        try:\n"
        "            socket.create_connection((host, port if host == '127.0.0.1' else 53), timeout=1).close()\n"
        "            return 'connected ' + host\n        except OSError as exc:\n"
        "            last = type(exc).__name__\n    return 'denied'\n"
    )
    res = run(call(code, "denied", [port]), LIM)
    accept()
    server.close()
    for c in accepted:
        c.close()
    if not isolation.network_denied:
        pytest.skip(
            f"isolation {isolation.level!r} cannot deny network (no network namespace at this level); "
            f"the program reported {res.tests[0].actual or res.status.value}"
        )
    assert res.passed, f"network reachable from the sandbox: {res.tests[0].actual}"
    assert not accepted


def test_harness_survives_threads_and_signals(run):
    code = (
        "import threading, os, signal\ndef f():\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "    threading.Thread(target=lambda: os._exit(0), daemon=True).start()\n    while True:\n        pass\n"
    )
    res = run(call(code, 1), LIM)
    assert not res.passed and res.status in (Status.RUNTIME_ERROR, Status.TIMEOUT)


def test_a_very_deep_directory_tree_is_removed(run):
    # Removing the working directory must not recurse once per level (RecursionError in the parent):
    # the result is a verdict, the tree is gone (no_leaks), and the next program runs.
    code = "import os\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\ndef f():\n    return 1\n"
    assert run(call(code, 2), LIM).status is Status.WRONG_ANSWER
    assert run(call("def f():\n    return 2\n", 2), LIM).passed


@pytest.mark.parametrize("how", ["fresh", "fork_server"])
def test_no_sandbox_outlives_a_killed_parent(level_config, how, live_sandboxes):
    # The process that runs programs dies by SIGKILL while a program that blocks SIGALRM sleeps:
    # nothing of its sandbox may live on (no one would ever reap or kill it).
    import time

    from marljax.rewards.isolation import forks_programs
    from marljax.rewards.sandbox import detect_isolation

    if how == "fork_server" and not forks_programs(detect_isolation(level_config)):
        pytest.skip(f"level {level_config.isolation!r} starts a fresh sandbox per program")
    before = live_sandboxes()
    code = (
        "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\n"
        "def f():\n    time.sleep(120)\n"
    )
    runner = (
        "import sys\nfrom marljax.rewards import *\nfrom marljax.rewards.fork_server import ForkServer\n"
        f"config = SandboxConfig(isolation={level_config.isolation!r})\n"
        f"server = ForkServer(config, detect_isolation(config)) if {how == 'fork_server'} else None\n"
        f"print('go', flush=True)\nrun_program(Program({code!r}, (CallTest((), 1),), fn_name='f'),"
        " Limits(test_timeout_s=100, program_timeout_s=100), config, server=server)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", runner],
        stdout=subprocess.PIPE,
        env={
            **os.environ,
            "PYTHONPATH": os.getcwd(),
            "TMPDIR": tempfile.gettempdir(),
        },  # its leftovers go with ours
    )
    try:
        assert parent.stdout.readline() == b"go\n"
        time.sleep(2.0)  # the program is asleep in its sandbox
        assert live_sandboxes() - before, "the program should be running"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    deadline = time.monotonic() + 5.0
    while live_sandboxes() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = live_sandboxes() - before
    for pid in left:  # do not leave them to the next test
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    assert not left, f"sandbox processes outlived their parent: {sorted(left)}"


# A wrong answer (returns 0) dressed with each way of reaching the verdict from inside its own process.
_FORGERIES = {
    "patched_json": (
        "import json\n_dumps = json.dumps\n"
        "def dumps(o, *a, **k):\n"
        "    if isinstance(o, dict) and o.get('status') == 'wrong_answer':\n"
        "        o = {key: v for key, v in o.items() if key not in ('exc_type', 'message')}\n"
        "        o['status'] = 'passed'\n"
        "    return _dumps(o, *a, **k)\n"
        "json.dumps = dumps\n"
    ),
    "walked_to_the_recorder": (
        "import sys\n"
        "def _forge():\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        rec = f.f_locals.get('record')\n"
        "        if callable(rec):\n"
        "            for i in range(3):\n"
        "                rec({'e': 'start', 'i': i}, {'e': 'end', 'i': i, 'status': 'passed', 'time_s': 0.0})\n"
        "            rec({'e': 'done'})\n"
        "            import os\n"
        "            os._exit(0)\n"
        "        f = f.f_back\n"
    ),
    "always_equal": (
        "class _Yes(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "class _Any:\n    def __eq__(self, other):\n        return True\n"
    ),
    "patched_builtins": "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})\n",
}


def _wrong_add(forgery: str) -> str:
    ret = "_Any()" if forgery == "always_equal" else "0"
    pre = "    _forge()\n" if forgery == "walked_to_the_recorder" else ""
    return _FORGERIES[forgery] + f"def add(a, b):\n{pre}    return {ret}\n"


@pytest.mark.parametrize("forgery", sorted(_FORGERIES))
def test_a_wrong_answer_cannot_forge_an_assert_verdict(run, forgery):
    # Asserts are judged in a process the program cannot reach: whatever it does to its own
    # interpreter, a wrong answer fails (MBPP asserts, and a HumanEval-style check(candidate)).
    from marljax.rewards import mbpp_program

    code = _wrong_add(forgery)
    mbpp = mbpp_program(code, ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"])
    check = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
    humaneval = Program(code, (AssertTest(check + "\ncheck(add)\n"),))
    for program in (mbpp, humaneval):
        res = run(program, LIM)
        assert not res.passed and res.pass_fraction() == 0.0, (forgery, res)


def test_the_program_never_holds_the_tests(run):
    # The expected values of asserts are in the test code: a program that finds that text anywhere in
    # its own process (objects, frames, freed memory) could answer every test.
    token = secrets.token_hex(8)
    code = (
        "import gc, re, sys\n"
        "def leak():\n"
        "    pat = re.compile(r'leak\\(\\) == .([0-9a-f]{16}).')\n"
        "    seen = [o for o in gc.get_objects() if isinstance(o, (str, bytes, dict, list, tuple))]\n"
        "    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        seen.append(f.f_locals)\n"
        "        f = f.f_back\n"
        "    for o in seen:\n"
        "        m = pat.search(o if isinstance(o, str) else repr(o))\n"
        "        if m:\n"
        "            return m.group(1)\n"
        "    try:\n"
        "        maps = open('/proc/self/maps').read().splitlines()\n"
        "        mem = open('/proc/self/mem', 'rb')\n"
        "    except OSError:\n"
        "        return None\n"
        "    for line in maps:\n"
        "        lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "        if 'rw' not in line.split()[1] or hi - lo > 1 << 28:\n"
        "            continue\n"
        "        try:\n"
        "            mem.seek(lo)\n"
        "            m = re.search(rb'leak\\(\\) == .([0-9a-f]{16}).', mem.read(hi - lo))\n"
        "        except OSError:\n"
        "            continue\n"
        "        if m:\n"
        "            return m.group(1).decode()\n"
    )
    res = run(Program(code, (AssertTest(f'assert leak() == "{token}"'),)), LIM)
    assert res.status is Status.WRONG_ANSWER, res


def _visible_host_dir():
    """A world-accessible host directory the sandbox could see before it had a minimal root (the
    working directory hides /tmp itself): /run as root, else the home directory."""
    for d in ("/run", os.path.expanduser("~")):
        if os.access(d, os.W_OK) and os.stat(d).st_mode & 0o005 == 0o005:
            return d
    pytest.skip("no writable world-accessible host directory outside /tmp")


def test_host_sockets_fifos_and_files_are_out_of_reach(run, isolation):
    # A unix socket and a FIFO of the host (a read-only mount does not stop connect() or writing to a
    # FIFO), and a world-readable file (hidden tests' expected outputs, the checkout, the run directory).
    if isolation.level == "none":
        pytest.skip("isolation 'none' has no mount namespace: the host's files are the program's")
    import stat as stat_

    from marljax.rewards.sandbox import HARNESS_PATH

    base = tempfile.mkdtemp(prefix="marljax-host-", dir=_visible_host_dir())
    os.chmod(base, 0o755)
    sock_path, fifo_path, file_path = (os.path.join(base, n) for n in ("sock", "fifo", "expected.txt"))
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock_path)
    os.chmod(sock_path, 0o777)
    server.listen(4)
    server.setblocking(False)
    os.mkfifo(fifo_path, 0o666)
    fifo = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)
    with open(file_path, "w") as fh:
        fh.write("hidden expected output")
    os.chmod(file_path, 0o644)
    checkout_file = os.path.join(os.path.dirname(HARNESS_PATH), "..", "..", "README.md")
    code = (
        "import os, socket\ndef f(sock, fifo, paths):\n    got = []\n"
        "    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.connect(sock)\n        s.send(b'x')\n"
        "        got.append('socket')\n    except OSError:\n        pass\n"
        "    try:\n        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)\n        os.write(fd, b'x')\n"
        "        got.append('fifo')\n    except OSError:\n        pass\n"
        "    for p in paths:\n        try:\n            open(p).read(1)\n            got.append(p)\n"
        "        except OSError:\n            pass\n    return got\n"
    )
    try:
        res = run(call(code, [], [sock_path, fifo_path, [file_path, checkout_file]]), LIM)
        with pytest.raises(BlockingIOError):
            server.accept()
        assert os.read(fifo, 10) == b""
        assert stat_.S_ISFIFO(os.stat(fifo_path).st_mode)
    finally:
        server.close()
        os.close(fifo)
        for p in (sock_path, fifo_path, file_path):
            os.unlink(p)
        os.rmdir(base)
    assert res.passed, f"reached from the sandbox: {res.tests[0].actual}"


def test_posix_message_queues_do_not_reach_the_next_program(run, isolation):
    if isolation.level == "none":
        pytest.skip("isolation 'none' has no IPC namespace: POSIX message queues are the host's")
    name = ("/marljax-" + secrets.token_hex(6)).encode()
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.mq_open.restype = ctypes.c_int\n"
        "def f(name, flags):\n    return libc.mq_open(name.encode(), flags, 0o666, None) >= 0\n"
    )
    created = run(call(code, True, [name.decode(), os.O_CREAT | os.O_RDWR]), LIM)
    assert created.passed, created  # the queue exists in this sandbox's IPC namespace
    found = run(call(code, False, [name.decode(), os.O_RDONLY]), LIM)
    assert found.passed, "a message queue of the previous program was still there"


def test_no_keyrings_and_no_user_namespaces(run):
    # Keys a program adds outlive it in the kernel (and reach the next program of its uid); a user
    # namespace would give it capabilities over its own mounts. Both are refused at every level.
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "NR = {'x86_64': (248, 56), 'aarch64': (217, 220)}[os.uname().machine]\n"
        "def f():\n    got = []\n"
        "    key = libc.syscall(NR[0], b'user', b'marljax-leak', b'secret', 6, -4)\n"  # @u: the user keyring
        "    if key >= 0:\n        got.append('add_key')\n"
        "    if libc.unshare(0x10000000) == 0:\n        got.append('unshare(CLONE_NEWUSER)')\n"
        "    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n"
        "    import threading\n    t = threading.Thread(target=lambda: None)\n    t.start()\n    t.join()\n"
        "    return got\n"
    )
    res = run(call(code, []), LIM)
    assert res.passed, f"allowed: {res.tests[0].actual} {res.tests[0].message}"


def test_memory_is_capped_for_all_processes_together(run, isolation, request):
    # Three children each touching 200 MiB under memory_mb=256: RLIMIT_AS lets each one through,
    # the program's memory cgroup (where this machine lets us make one) does not let all three.
    from marljax.rewards.cgroup import MemoryCgroup

    group = MemoryCgroup.create()
    if group is None:
        pytest.skip("no memory cgroup can be made here: the memory cap is per process")
    group.close()
    if request.node.callspec.params["run"] == ("bwrap", "fresh"):
        pytest.skip("a fresh bubblewrap sandbox cannot join a cgroup (/sys is not in it)")
    code = (
        "import os, time\ndef f():\n    pids = []\n    for _ in range(3):\n        pid = os.fork()\n"
        "        if pid == 0:\n            try:\n                hog = b'x' * (200 << 20)\n"
        "                time.sleep(1.0)\n                os._exit(0)\n            except MemoryError:\n"
        "                os._exit(1)\n        pids.append(pid)\n"
        "    return sum(os.waitpid(p, 0)[1] == 0 for p in pids)\n"
    )
    lim = Limits(test_timeout_s=8.0, program_timeout_s=15.0, memory_mb=256, max_processes=16)
    res = run(call(code, 3), lim)
    assert not res.passed, res  # some child was stopped


def test_disk_is_capped_for_all_files_together(run, isolation):
    # Sixteen files of 4 MiB each under a 4 MiB file cap: the working directory's quota stops them.
    if isolation.level != "unshare":
        pytest.skip(
            f"isolation {isolation.level!r} caps each file's size only (the working directory is on the host)"
        )
    code = (
        "import os\ndef f():\n    written = 0\n    for k in range(16):\n        try:\n"
        "            with open(f'f{k}', 'wb') as fh:\n                fh.write(b'x' * (4 << 20))\n"
        "            written += 4 << 20\n        except OSError:\n            pass\n"
        "    n = 0\n    try:\n        while n < 10000:\n            open(f'e{n}', 'w').close()\n            n += 1\n"
        "    except OSError:\n        pass\n    return [written >> 20, n]\n"
    )
    lim = Limits(
        test_timeout_s=8.0, program_timeout_s=15.0, max_file_bytes=4 << 20, max_disk_mb=8, max_files=100
    )
    res = run(call(code, None), lim)
    written_mb, files = eval(res.tests[0].actual)  # noqa: S307 - the program's JSON list
    assert written_mb <= 8 and files < 100, res.tests[0].actual
