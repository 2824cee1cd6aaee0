"""score_texts and run_deduplicated: every distinct (problem, program) runs once in the sandbox; repeats share
its verdict (also in AT-GRPO's tester scoring and coop_code's pairs)."""

import pytest

from marljax.demo.models import steps_problems
from marljax.envs import coop_code
from marljax.envs.code import CodeEnv, CodeState
from marljax.rewards import AssertTest, ExecutionResult, Program, SandboxPool, SandboxVerifier
from marljax.rewards.verifier import run_deduplicated, score_texts
from marljax.tasks import parse_row


class CountingPool(SandboxPool):
    """The real pool, counting the programs it is given."""

    submitted: list

    def submit(self, program, limits=None):
        self.submitted.append(program.code)
        return super().submit(program, limits)


def test_repeated_programs_run_once_and_share_their_verdict():
    a, b = steps_problems(2, seed=3, steps=1)
    good_a, good_b = (f"```python\n{p.fields['solution']}\n```" for p in (a, b))
    bad = "```python\ndef f(x):\n    return None\n```"
    problems = [a, a, a, a, b, b]
    texts = [good_a, bad, good_a, "Here it is:\n" + good_a, good_b, bad]  # the fourth has good_a's code
    with CountingPool(max_workers=2) as pool:
        pool.submitted = []
        scores = score_texts(problems, texts, pool)
        assert len(pool.submitted) == 4  # (a, good), (a, bad), (b, good), (b, bad)
        alone = [score_texts([p], [t], pool)[0] for p, t in zip(problems, texts)]
    assert [s.passed for s in scores] == [True, False, True, True, True, False]
    assert [(s.reward, s.passed) for s in scores] == [(s.reward, s.passed) for s in alone]


@pytest.fixture
def pool():
    with CountingPool(max_workers=2) as p:
        p.submitted = []
        yield p


def plain_map(pool, programs, keys=None):
    """The reference without deduplication: every program to the pool."""
    return pool.map(programs) if programs else []


def plain_run(verifier, programs, keys=None):
    """`SandboxVerifier.run` without deduplication."""
    return plain_map(verifier.pool, programs, keys)


def verdict(result):
    """What a run decided, without its timings."""
    if result is None:
        return None
    return result.status, result.error_type, tuple((t.status, t.actual) for t in result.tests)


class FakePool:
    def __init__(self):
        self.seen = []

    def map(self, programs):
        self.seen += programs
        return [ExecutionResult("passed" if "ok" in p.code else "failed") for p in programs]


def test_run_deduplicated_order_identity_and_keys():
    progs = [
        Program(code=c, tests=(AssertTest("assert True"),)) for c in ["ok 1", "bad", "ok 1", "ok 2", "bad"]
    ]
    fake = FakePool()
    out = run_deduplicated(fake, progs)
    assert [p.code for p in fake.seen] == ["ok 1", "bad", "ok 2"]  # first occurrences, in order
    assert [r.status for r in out] == ["passed", "failed", "passed", "passed", "failed"]
    assert out[0] is out[2] and out[1] is out[4] and out[0] is not out[3]
    fake = FakePool()
    out = run_deduplicated(fake, progs, keys=[0, 0, 1, 1, 2])  # keys, not the programs, decide what repeats
    assert [p.code for p in fake.seen] == ["ok 1", "ok 1", "bad"] and out[1] is out[0]
    assert run_deduplicated(None, []) == []  # nothing to run: no pool needed
    with pytest.raises(ValueError, match="keys"):
        run_deduplicated(FakePool(), progs, keys=[1])


INC = {
    "task_id": "inc",
    "question": "Write f(x) returning x + 1.",
    "fn_name": "f",
    "inputs": [[1], [2], [3], [4]],
    "outputs": [2, 3, 4, 5],
    "public": 3,
    "solution": "def f(x):\n    return x + 1\n",
}
DBL = {
    **INC,
    "task_id": "dbl",
    "question": "Write f(x) returning 2 * x.",
    "outputs": [2, 4, 6, 8],
    "solution": "def f(x):\n    return 2 * x\n",
}


def fence(code):
    return f"```python\n{code}\n```"


def test_at_grpo_tester_runs_each_program_once(pool, monkeypatch):
    problems = [parse_row(r, "stdio", f"<t>:{k}") for k, r in enumerate([INC, DBL])]
    coder = [fence("def f(x):\n    return x"), fence("def f(x):\n    return x + 1 if x < 3 else 0")] * 2
    tests = ["assert f(1) == 2\nassert f(2) == 3", "assert f(3) == 4\nassert f(1) == 5"]
    tester = [fence(tests[0]), fence(tests[1]), "see above:\n" + fence(tests[0]), "no asserts"]
    texts = [{"coder": coder, "tester": tester}] * 2
    env = CodeEnv("coder", "tester", 0.5, 8)

    def run():
        pool.submitted = []
        return env.step(problems, [CodeState()] * 2, texts, SandboxVerifier(pool)), len(pool.submitted)

    turns, n = run()
    monkeypatch.setattr(SandboxVerifier, "run", plain_run)
    before, n_before = run()
    # coder: 2 distinct programs per problem.  Tester: 3 texts with asserts, 2 distinct, each run on
    # the problem's reference and on its best code, which is the same code for both problems here
    assert (n, n_before) == (2 * 2 + 2 * 2 + 2, 2 * 2 + 2 * 6)
    for t, b in zip(turns, before):
        assert (t.rewards, t.passed, t.best, t.solved) == (b.rewards, b.passed, b.best, b.solved)
        assert (t.state.code, t.state.tests) == (b.state.code, b.state.tests)
        assert verdict(t.state.result) == verdict(b.state.result)
        assert verdict(t.state.test_result) == verdict(b.state.test_result)
    assert turns[0].rewards["tester"][0] == turns[0].rewards["tester"][2] > 0
    assert turns[0].rewards["tester"] != turns[1].rewards["tester"]  # the same asserts on another problem


def test_coop_pairs_run_each_program_once(pool, monkeypatch):
    p, q = (parse_row(r, "stdio", f"<t>:{k}") for k, r in enumerate([INC, DBL]))
    aux = fence("def aux(x):\n    return x + 1")
    good, bad = fence("def f(x):\n    return aux(x)"), fence("def f(x):\n    return x")
    problems = [p, p, p, p, p, q, q]
    helpers = [aux, aux, aux, "", aux, aux, aux]
    mains = [good, bad, good, fence("def f(x):\n    return ("), "again:\n" + good, good, good]

    def run():
        pool.submitted = []
        return coop_code.score_pairs(problems, helpers, mains, SandboxVerifier(pool)), len(pool.submitted)

    scores, n = run()
    monkeypatch.setattr(SandboxVerifier, "run", plain_run)
    before, n_before = run()
    assert (n, n_before) == (3, 6)  # (p, good), (p, bad), (q, good); one pair does not compile
    for s, b in zip(scores, before):
        assert (s.reward, s.passed, s.levels, s.feedback) == (b.reward, b.passed, b.levels, b.feedback)
        assert verdict(s.result) == verdict(b.result)
    assert scores[0].result is scores[2].result is scores[4].result and scores[0].passed
    assert not scores[5].passed  # same code, other problem: its own run
