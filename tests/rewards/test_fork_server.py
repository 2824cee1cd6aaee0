"""The warm sandbox: a forked child per program, and nothing of one program reaches the next.

The verdict-level behaviour (every status, every attack) is covered by running test_sandbox.py and
test_attacks.py through a fork server too (the ``run`` fixture); these are the server's own promises.
"""

from __future__ import annotations

import os
import signal

import pytest

from marljax.rewards import (
    CallTest,
    Limits,
    Program,
    SandboxConfig,
    SandboxPool,
    Status,
    StdioTest,
    run_program,
)
from marljax.rewards.fork_server import ForkServer
from marljax.rewards.isolation import forks_programs

LIM = Limits(test_timeout_s=2.0, program_timeout_s=10.0, memory_mb=256)


@pytest.fixture
def server(forking_isolation, no_leaks):
    with ForkServer(SandboxConfig(isolation=forking_isolation.level), forking_isolation) as srv:
        yield srv


def call(code, expected=None, args=()):
    return Program(code, (CallTest(tuple(args), expected),), fn_name="f")


def test_one_sandbox_serves_many_programs_with_fresh_sandbox_verdicts(server):
    programs = [
        call("def f(x):\n    return x + 1\n", 2, [1]),
        call("def f(x):\n    return x\n", 2, [1]),
        call("def f():\n    return 1 // 0\n"),
        call("import os\nos._exit(0)\n", 1),
        call("def f():\n    while True:\n        pass\n"),
        Program("print(int(input()) * 2)\n", (StdioTest("3\n", "6\n"), StdioTest("4\n", "9\n"))),
    ]
    forked = [run_program(p, LIM, server=server) for p in programs]
    fresh = [run_program(p, LIM) for p in programs]
    assert (
        [r.status for r in forked]
        == [r.status for r in fresh]
        == [
            Status.PASSED,
            Status.WRONG_ANSWER,
            Status.RUNTIME_ERROR,
            Status.RUNTIME_ERROR,
            Status.TIMEOUT,
            Status.WRONG_ANSWER,
        ]
    )
    assert [[t.status for t in r.tests] for r in forked] == [[t.status for t in r.tests] for r in fresh]
    assert all(r.extra.get("fork_server") for r in forked) and not any(
        r.extra.get("fork_server") for r in fresh
    )
    assert server.starts == 1


def test_no_process_of_a_program_survives_into_the_next(server):
    daemon = (
        "import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n        os._exit(0)\n    return 1\n"
    )
    assert run_program(call(daemon, 1), LIM, server=server).passed
    # Everything in the pid namespace but pid 1 (bwrap's reaper, or the zygote under unshare), the zygote
    # (our parent) and us.
    census = (
        "import os\ndef f():\n    mine = {1, os.getppid(), os.getpid()}\n"
        "    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine)\n"
    )
    res = run_program(call(census, []), LIM, server=server)
    assert res.passed, res.tests[0].actual
    assert server.starts == 1


def test_working_directory_is_emptied_between_programs(server):
    litter = (
        "import os\ndef f():\n    open('a.txt', 'w').write('x')\n"
        "    open(os.environ['TMPDIR'] + '/b.txt', 'w').write('x')\n"
        "    os.makedirs('d/e')\n    open('d/e/c.txt', 'w').write('x')\n    os.chmod('d', 0)\n"
        "    return sorted(os.listdir('.'))\n"
    )
    assert run_program(call(litter, ["a.txt", "b.txt", "d"]), LIM, server=server).passed
    look = (
        "import os\ndef f():\n    return sorted(os.listdir('.')) + sorted(os.listdir(os.environ['TMPDIR']))\n"
    )
    res = run_program(call(look, []), LIM, server=server)
    assert res.passed, res.tests[0].actual


def test_ipc_leftovers_get_a_fresh_sandbox(server):
    shm = (
        "import ctypes\ndef f():\n    libc = ctypes.CDLL(None)\n"
        "    return libc.shmget(0, 4096, 0o1600) >= 0\n"
    )  # IPC_PRIVATE, IPC_CREAT | 0600
    assert run_program(call(shm, True), LIM, server=server).passed
    look = "def f():\n    return len(open('/proc/sysvipc/shm').read().splitlines())\n"
    assert run_program(call(look, 1), LIM, server=server).passed  # the header line only
    assert server.starts == 2


def test_a_dead_sandbox_is_replaced(server):
    ok = call("def f():\n    return 1\n", 1)
    assert run_program(ok, LIM, server=server).passed
    os.killpg(server._proc.pid, signal.SIGKILL)
    server._proc.wait()
    assert run_program(ok, LIM, server=server).passed
    assert server.starts == 2


def test_sandbox_is_recycled_after_max_jobs(forking_isolation, no_leaks):
    with ForkServer(
        SandboxConfig(isolation=forking_isolation.level), forking_isolation, max_jobs=2
    ) as server:
        for _ in range(5):
            assert run_program(call("def f():\n    return 1\n", 1), LIM, server=server).passed
        assert server.starts == 3


def test_each_program_gets_its_own_uid_and_random_state(server, isolation):
    prog = call("import os, random\ndef f():\n    return [os.getuid(), random.random()]\n")
    a, b = (run_program(prog, LIM, server=server).tests[0].actual for _ in range(2))
    uid_a, rand_a = eval(a)  # noqa: S307 - our own program's JSON list
    uid_b, rand_b = eval(b)  # noqa: S307
    assert rand_a != rand_b
    if isolation.privileges_dropped:
        assert uid_a != uid_b and min(uid_a, uid_b) >= SandboxConfig().uid_base


def test_pool_workers_fork_from_warm_sandboxes_unless_told_not_to(isolation, no_leaks):
    programs = [call(f"def f():\n    return {k}\n", k) for k in range(6)]
    with SandboxPool(max_workers=2, limits=LIM) as pool:
        warm = pool.map(programs)
    with SandboxPool(max_workers=2, limits=LIM, config=SandboxConfig(fork_server=False)) as pool:
        cold = pool.map(programs)
    assert all(r.passed for r in warm + cold)
    assert [bool(r.extra.get("fork_server")) for r in warm] == [forks_programs(isolation)] * 6
    assert not any(r.extra.get("fork_server") for r in cold)


def test_a_sandbox_that_cannot_start_is_an_error_not_a_failing_program(forking_isolation, tmp_path, no_leaks):
    missing = str(tmp_path / "no-such-python")
    with (
        ForkServer(
            SandboxConfig(isolation=forking_isolation.level, python=missing), forking_isolation
        ) as server,
        pytest.raises(RuntimeError, match="did not start") as err,
    ):
        run_program(call("def f():\n    return 1\n", 1), LIM, server=server)
    assert "no-such-python" in str(err.value)


def test_the_warm_interpreter_leaves_no_trace_in_a_program(server):
    # The zygote starts with LD_BIND_NOW and runs a dummy program in warm_up(): neither reaches a job.
    look = (
        "import os, sys, linecache\ndef f():\n"
        "    return ['LD_BIND_NOW' in os.environ, sorted(k for k in linecache.cache if k.startswith('<')),\n"
        "            type(sys.stdin).__name__, os.getuid() == 0]\n"
    )
    res = run_program(call(look, [False, [], "StringIO", False]), LIM, server=server)
    assert res.passed, res.tests[0].actual


def test_a_leftover_child_in_its_own_session_is_killed_and_reaped(server):
    # A job's process that left the job's session survives the session kill: the zygote must kill it
    # and reap it (it is the child subreaper) before the next job, which then sees no process but its own.
    leave = (
        "import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)\n"
        "        os._exit(0)\n    return 1\n"
    )
    census = (
        "import os\ndef f():\n    mine = {1, os.getppid(), os.getpid()}\n"
        "    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in mine)\n"
    )
    for _ in range(3):
        assert run_program(call(leave, 1), LIM, server=server).passed
        res = run_program(call(census, []), LIM, server=server)
        assert res.passed, res.tests[0].actual
    assert server.starts == 1


def test_unshare_without_a_uid_drop_gets_no_fork_server():
    # Programs would share the zygote's user namespace and its capabilities there: refused, not weakened.
    from marljax.rewards.results import Isolation

    shared_uid = Isolation("unshare", True, True, False, True, "unshare as a non-root user")
    with pytest.raises(ValueError, match="cannot keep the promises"):
        ForkServer(SandboxConfig(isolation="unshare"), shared_uid)
    assert not forks_programs(shared_uid) and not forks_programs(
        Isolation("none", False, False, True, False, "")
    )
