"""The demo's held-out evaluations with scripted agents: the per-task pass@1 behind the standard
errors, and the progress each evaluation reports (to its total, on a terminal and in a log)."""

import fcntl
import os
import select
import struct
import termios

import pytest

from marljax.demo.pipeline import pass_at_1, team_search
from marljax.rewards import SandboxPool, SandboxVerifier
from marljax.tasks import parse_row, synthetic_rows
from marljax.train.metrics import task_progress
from marljax.workflows.base import Agent, ScriptedGenerator
from marljax.workflows.mars2 import search_eval

WRONG = "```python\ndef f(x):\n    return -12345\n```"


@pytest.fixture(scope="module")
def verifier():
    with SandboxPool(max_workers=2) as pool:
        yield SandboxVerifier(pool)


def make_problems(n):
    return [
        parse_row(r, "stdio", f"<test>:{k + 1}")
        for k, r in enumerate(synthetic_rows(n, seed=0, difficulty=1))
    ]


def script_by_task(problems, answer):
    """A script answering task i's k-th sample with `answer(i, k, problem)`."""

    def script(agent, prompt, k, seed):
        i = next(i for i, p in enumerate(problems) if p.prompt in prompt)
        return answer(i, k, problems[i])

    return script


def reference(p):
    return f"```python\n{p.fields['solution']}```"


def test_pass_at_1_per_task_and_its_progress(verifier, capsys):
    problems = make_problems(4)
    right = [2, 0, 1, 2]  # task i's first right[i] samples are its reference, the rest wrong
    gen = ScriptedGenerator(script_by_task(problems, lambda i, k, p: reference(p) if k < right[i] else WRONG))
    agents = [Agent("alice", "qwen"), Agent("bob", "llama"), Agent("carol", "qwen")]
    known = {"llama": [0.25, 0.25, 0.25, 0.25]}
    got = pass_at_1(problems, agents, gen, verifier, 2, 0, known, label="before RL: pass@1")
    assert got == {"llama": known["llama"], "qwen": [1.0, 0.0, 0.5, 1.0]}
    assert gen.calls == [("qwen", 4)]  # the known policy is not sampled again, the other in one call
    # not a terminal (pytest captures stderr): a line as each measured policy starts and ends, at its total
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "before RL: pass@1 qwen: 4 tasks ..."
    assert lines[1].startswith("before RL: pass@1 qwen: 4/4 tasks done in ") and len(lines) == 2


def test_team_search_reports_each_tree_as_it_finishes(verifier, capsys):
    """Task 0 is solved in the first round; tasks 1 and 2 never are, so their trees end when their 6
    nodes are spent, 2 per round: after rounds 1, 2, 3 the finished trees grow by 1, 0, 2."""
    problems = make_problems(3)
    gen = ScriptedGenerator(script_by_task(problems, lambda i, k, p: reference(p) if i == 0 else WRONG))
    out = team_search(problems, [Agent("solo", "p")], gen, verifier, 6, 0, label="x")
    assert out["eval/search/pass_at_1"] == pytest.approx(1 / 3)
    assert out["eval/search/nodes"] == pytest.approx((1 * 2 + 2 * 6) / 3)  # a solved tree stops
    err = capsys.readouterr().err
    assert err.startswith("x: 3 tasks ...\nx: 3/3 tasks done in ")  # the rounds' counts add up to 3
    seen = []
    search_eval(
        problems,
        [Agent("solo", "p")],
        gen,
        verifier,
        max_nodes=6,
        expansions_per_round=2,
        progress=seen.append,
    )
    assert seen == [1, 0, 2]


def test_progress_on_a_terminal_is_a_bar_that_reaches_its_total():
    leader, follower = os.openpty()
    # a window 100 columns wide, as a terminal has (a new pty has 0, where tqdm draws nothing)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with open(follower, "w") as tty:
        assert tty.isatty()
        with task_progress("after RL: team search", 5, file=tty) as advance:
            for n in (2, 0, 3):
                advance(n)
    shown = read_until_closed(leader)
    os.close(leader)
    assert "after RL: team search" in shown and "5/5" in shown and "\r" in shown  # redrawn in place
    assert "tasks done in" not in shown  # the log's lines are not written on a terminal


def read_until_closed(leader: int) -> str:
    """All a pty's follower wrote: Linux hands a pty's writes to the leader asynchronously, so one read
    may see only the first; read until the closed follower's EIO (or 10 s of silence)."""
    chunks = []
    while select.select([leader], [], [], 10)[0]:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the follower is closed and everything it wrote has been read
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()
