"""Problem data: schema parsing and errors, JSONL loading, synthetic rows, the grain stream."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from marljax.rewards import AssertTest, CallTest, Problem, StdioTest, math_reward, run_program
from marljax.tasks import DataError, load_problems, make_tasks, parse_row, synthetic_rows, write_jsonl
from marljax.train.data import ProblemStream

HUMANEVAL = Path(__file__).resolve().parents[2].parent / "shared/data/HumanEval.jsonl.gz"
SRC = "data/train.jsonl:7"

HUMANEVAL_ROW = {
    "task_id": "Toy/0",
    "prompt": 'def add(a, b):\n    """Sum."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "canonical_solution": "    return a + b\n",
}
MBPP_ROW = {
    "task_id": 11,
    "text": "Write a function to double a number.",
    "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
    "challenge_test_list": ["assert double(K) == 2 * K"],
    "test_setup_code": "K = 21",
    "test_imports": ["import math"],
}
STDIN_ROW = {
    "id": "sum-2",
    "question": "Read two integers and print their sum.",
    "inputs": ["1 2\n", "5 -5\n", "10 20\n"],
    "outputs": ["3\n", "0\n", "30\n"],
    "public": 1,
}
CALL_ROW = {
    "task_id": "lcb/1",
    "prompt": "Implement Solution.maxOf(a, b).",
    "fn_name": "maxOf",
    "inputs": [[1, 2], "7\n3"],
    "outputs": [2, "7"],
}
MATH_ROW = {"problem": "What is 1/4 + 1/4?", "answer": "\\frac{1}{2}"}

STDIN_CODE = "a, b = map(int, input().split())\nprint(a + b)\n"
CALL_CODE = "class Solution:\n    def maxOf(self, a, b):\n        return max(a, b)\n"


def passes(program) -> bool:
    return run_program(program).passed


# ------------------------------------------------------------------ schemas
def test_humaneval_row():
    p = parse_row(HUMANEVAL_ROW, "humaneval", SRC)
    assert (p.id, p.prompt, p.schema, p.source, p.answer) == (
        "Toy/0",
        HUMANEVAL_ROW["prompt"],
        "humaneval",
        SRC,
        None,
    )
    program = p.program("    return a + b\n")
    assert [type(t) for t in program.tests] == [AssertTest] and "check(add)" in program.tests[0].code
    assert passes(program)
    assert not passes(p.program("    return a - b\n"))


def test_mbpp_row():
    p = parse_row(MBPP_ROW, "mbpp", SRC)
    assert (p.id, p.prompt, p.schema) == ("11", MBPP_ROW["text"], "mbpp")
    program = p.program("def double(x):\n    return 2 * x\n")
    assert [t.split for t in program.tests] == ["public", "public", "private"]
    assert "import math" in program.setup and "K = 21" in program.setup
    assert passes(program)
    # Right on the public asserts, wrong on the private one (K = 21): fails only there.
    result = run_program(p.program("def double(x):\n    return {2: 4, 0: 0}.get(x, 0)\n"))
    assert [t.passed for t in result.tests] == [True, True, False]
    # sanitized MBPP calls the description "prompt"
    other = {k: v for k, v in MBPP_ROW.items() if k != "text"} | {"prompt": "Double it."}
    assert parse_row(other, "mbpp", SRC).prompt == "Double it."


def test_stdio_row_stdin():
    p = parse_row(STDIN_ROW, "stdio", SRC)
    assert (p.id, p.prompt, p.schema) == ("sum-2", STDIN_ROW["question"], "stdio")
    program = p.program(STDIN_CODE)
    assert all(isinstance(t, StdioTest) for t in program.tests)
    assert [t.split for t in program.tests] == ["public", "private", "private"]
    assert passes(program)
    assert not passes(p.program("a, b = map(int, input().split())\nprint(a - b)\n"))


def test_stdio_row_call_based():
    p = parse_row(CALL_ROW, "stdio", SRC)
    program = p.program(CALL_CODE)
    assert program.fn_name == "maxOf"
    assert [(t.args, t.output, t.split) for t in program.tests] == [
        ((1, 2), 2, "public"),
        ((7, 3), 7, "public"),
    ]
    assert passes(program)
    assert not passes(p.program(CALL_CODE.replace("max(", "min(")))


def test_math_row():
    p = parse_row(MATH_ROW, "math", SRC)
    assert (p.id, p.prompt, p.answer) == (
        SRC,
        MATH_ROW["problem"],
        "\\frac{1}{2}",
    )  # id defaults to the source
    assert math_reward("So the sum is \\boxed{0.5}.", p.answer) == 1.0
    assert math_reward("So the sum is \\boxed{1/3}.", p.answer) == 0.0
    assert parse_row({"question": "2+2?", "answer": 4, "id": 9}, "math", SRC).answer == "4"
    with pytest.raises(ValueError, match="no program"):
        p.program("print(1)")


@pytest.mark.parametrize("row", [HUMANEVAL_ROW, MBPP_ROW, STDIN_ROW, CALL_ROW, MATH_ROW])
def test_problem_rebuilds_from_json_fields(row):
    p = parse_row(row, "auto", SRC)
    again = json.loads(json.dumps(p.fields))
    assert parse_row(again, p.schema, p.source) == p


@pytest.mark.parametrize(
    "row, schema",
    [
        (HUMANEVAL_ROW, "humaneval"),
        (MBPP_ROW, "mbpp"),
        (STDIN_ROW, "stdio"),
        (CALL_ROW, "stdio"),
        (MATH_ROW, "math"),
    ],
)
def test_auto_detection(row, schema):
    assert parse_row(row, "auto", SRC).schema == schema


def drop(row, key):
    return {k: v for k, v in row.items() if k != key}


ERRORS = [  # (row, schema, key the message must name)
    (drop(HUMANEVAL_ROW, "entry_point"), "humaneval", "'entry_point'"),
    (HUMANEVAL_ROW | {"prompt": 3}, "humaneval", "'prompt'"),
    (drop(MBPP_ROW, "text"), "mbpp", "'text'"),
    (MBPP_ROW | {"test_list": "assert True"}, "mbpp", "'test_list'"),
    (MBPP_ROW | {"test_list": ["assert True", 3]}, "mbpp", "test_list[1]"),
    (MBPP_ROW | {"test_list": []}, "mbpp", "'test_list'"),
    (MBPP_ROW | {"task_id": True}, "mbpp", "'task_id'"),
    (drop(STDIN_ROW, "inputs"), "stdio", "'inputs'"),
    (STDIN_ROW | {"outputs": ["3\n"]}, "stdio", "'outputs'"),
    (STDIN_ROW | {"public": 4}, "stdio", "'public'"),
    (STDIN_ROW | {"inputs": [1, 2, 3]}, "stdio", "inputs[0]"),
    (CALL_ROW | {"inputs": [[1, 2], "7\nnot json"]}, "stdio", "inputs[1]"),
    (drop(MATH_ROW, "answer"), "math", "'answer'"),
    (MATH_ROW | {"answer": True}, "math", "'answer'"),
    (drop(MATH_ROW, "problem"), "math", "'problem'"),
    (MATH_ROW, "latex", "'latex'"),
    ({"prompt": "hi"}, "auto", "'answer'"),
]


@pytest.mark.parametrize("row, schema, key", ERRORS)
def test_bad_rows_name_file_line_and_key(row, schema, key):
    with pytest.raises(DataError) as info:
        parse_row(row, schema, SRC)
    assert str(info.value).startswith(SRC + ": ")
    assert key in str(info.value)


def test_error_message_shape():
    with pytest.raises(
        DataError, match=r"^data/train.jsonl:7: missing key 'entry_point' \(schema humaneval\)$"
    ):
        parse_row(drop(HUMANEVAL_ROW, "entry_point"), "humaneval", SRC)
    assert issubclass(DataError, ValueError)


# ------------------------------------------------------------------ loading
def test_load_jsonl_sources_and_blank_lines(tmp_path):
    path = tmp_path / "mix.jsonl"
    path.write_text(
        "\n".join([json.dumps(HUMANEVAL_ROW), "", "  ", json.dumps(STDIN_ROW), json.dumps(MATH_ROW)]) + "\n\n"
    )
    problems = load_problems(path)
    assert [(p.schema, p.source) for p in problems] == [
        ("humaneval", f"{path}:1"),
        ("stdio", f"{path}:4"),
        ("math", f"{path}:5"),
    ]
    assert problems[2].id == f"{path}:5"


def test_load_gz(tmp_path):
    rows = [MBPP_ROW | {"task_id": k} for k in range(5)]
    path = write_jsonl(rows, tmp_path / "mbpp.jsonl.gz")
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # really gzip
    with gzip.open(path, "rt") as f:
        assert [json.loads(line) for line in f] == rows
    problems = load_problems(str(path), schema="mbpp")
    assert [p.id for p in problems] == ["0", "1", "2", "3", "4"]
    assert problems[0].fields == rows[0]


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(MATH_ROW) + "\n{not json\n")
    with pytest.raises(DataError, match=rf"^{bad}:2: invalid JSON: "):
        load_problems(bad)

    bad.write_text("\n[1, 2]\n")
    with pytest.raises(DataError, match=rf"^{bad}:2: expected a JSON object, got list"):
        load_problems(bad)

    bad.write_text(json.dumps(MATH_ROW) + "\n" + json.dumps(HUMANEVAL_ROW) + "\n")
    with pytest.raises(DataError, match=rf"^{bad}:2: missing key 'problem' or 'question' \(schema math\)"):
        load_problems(bad, schema="math")

    bad.write_text("\n".join(json.dumps(STDIN_ROW | {"id": i}) for i in ["a", "b", "a"]) + "\n")
    with pytest.raises(DataError, match=rf"^{bad}:3: duplicate id 'a' \(first at {bad}:1\)"):
        load_problems(bad)

    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match=rf"^{missing}: no such file"):
        load_problems(missing)

    fake_gz = tmp_path / "fake.jsonl.gz"
    fake_gz.write_text(json.dumps(MATH_ROW) + "\n")
    with pytest.raises(DataError, match=rf"^{fake_gz}: cannot read"):
        load_problems(fake_gz)

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(DataError, match=rf"^{empty}: no problems"):
        load_problems(empty)


def test_humaneval_real_data():
    if not HUMANEVAL.exists():
        pytest.skip(f"../shared/data/HumanEval.jsonl.gz not present (a fresh clone): {HUMANEVAL}")
    problems = load_problems(HUMANEVAL)
    assert len(problems) == 164 and len({p.id for p in problems}) == 164
    assert {p.schema for p in problems} == {"humaneval"}
    assert problems[0].id == "HumanEval/0" and problems[0].source == f"{HUMANEVAL}:1"
    for p in (problems[0], problems[53], problems[163]):
        assert p.prompt == p.fields["prompt"]
        assert passes(p.program(p.fields["canonical_solution"])), p.id
    assert not passes(problems[0].program("    return None\n"))


# ---------------------------------------------------------------- synthetic
def test_synthetic_rows_run_in_the_sandbox(tmp_path):
    tasks = make_tasks(6, seed=3, difficulty=3)
    problems = load_problems(write_jsonl(synthetic_rows(6, seed=3, difficulty=3), tmp_path / "syn.jsonl"))
    assert [(p.id, p.prompt, p.schema) for p in problems] == [(t.task_id, t.prompt, "stdio") for t in tasks]
    for p, task in zip(problems, tasks):
        program = p.program(task.reference)
        expected = [(a, o, "public") for a, o in task.public] + [(a, o, "private") for a, o in task.private]
        assert [(t.args, t.output, t.split) for t in program.tests] == expected
        assert all(isinstance(t, CallTest) for t in program.tests)
        result = run_program(program)
        assert result.passed and result.pass_fraction() == 1.0, (p.id, result.status)
        assert not passes(p.program("def f(x):\n    return 123456789\n"))


# ------------------------------------------------------------------- stream
def toy(n: int) -> list[Problem]:
    return [
        parse_row({"problem": f"q{i}", "answer": str(i), "id": f"p{i}"}, "math", f"toy:{i + 1}")
        for i in range(n)
    ]


def ids(batches) -> list[str]:
    return [p.id for batch in batches for p in batch]


def take(stream, k: int) -> list[list[str]]:
    return [[p.id for p in next(stream)] for _ in range(k)]


def test_shuffle_is_a_fresh_permutation_each_epoch():
    problems = toy(10)
    everything = sorted(p.id for p in problems)
    stream = ProblemStream(problems, batch_size=4, seed=1, epochs=3, shard_index=0, shard_count=1)
    batches = list(stream)
    assert [len(b) for b in batches] == [4] * 7 + [2]  # 30 problems; batches straddle epochs
    assert all(isinstance(b, list) and isinstance(b[0], Problem) for b in batches)
    flat = ids(batches)
    epochs = [flat[i : i + 10] for i in range(0, 30, 10)]
    assert all(sorted(e) == everything for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    assert epochs[0] != everything
    with pytest.raises(StopIteration):
        next(stream)

    def order(seed):
        return ids(ProblemStream(problems, batch_size=4, seed=seed, epochs=2, shard_index=0, shard_count=1))

    assert order(1) == flat[:20]
    assert order(2) != order(1)


def test_no_shuffle_epochs_and_drop_remainder():
    problems = toy(10)
    stream = ProblemStream(
        problems, batch_size=4, shuffle=False, epochs=2, drop_remainder=True, shard_index=0, shard_count=1
    )
    batches = list(stream)
    assert [len(b) for b in batches] == [4] * 5
    assert ids(batches) == [f"p{i}" for i in list(range(10)) * 2]


@pytest.mark.parametrize("epochs", [1, 4])
def test_epoch_count_is_exact(epochs):
    stream = ProblemStream(toy(7), batch_size=3, epochs=epochs, shard_index=0, shard_count=1)
    counts = Counter(ids(stream))
    assert counts == Counter({f"p{i}": epochs for i in range(7)})
    assert stream.epoch == epochs


def test_forever_and_epoch_info():
    stream = ProblemStream(toy(10), batch_size=4, seed=5)  # shards default to this (single) JAX process
    assert stream.epoch_size == 10 and stream.steps_per_epoch == 2.5
    batches = take(stream, 3)
    assert (stream.step, stream.epoch) == (3, 1)
    batches += take(stream, 100)  # far past any epoch count: never stops
    assert stream.epoch == 41 and all(len(b) == 4 for b in batches)


@pytest.mark.parametrize("batch_size", [1, 3, 6])  # 1 overflowed grain's length; 6 > the 4 problems
@pytest.mark.parametrize("shuffle", [True, False])
def test_endless_stream_cycles_epoch_after_epoch(batch_size, shuffle):
    problems, epochs = toy(4), 6
    everything = [p.id for p in problems]

    def make(**kw):
        return ProblemStream(
            problems, batch_size=batch_size, seed=3, shuffle=shuffle, shard_index=0, shard_count=1, **kw
        )

    stream = make()
    steps = epochs * 4 // batch_size
    flat = [i for batch in take(stream, steps) for i in batch]
    assert len(flat) == steps * batch_size and stream.epoch == epochs
    per_epoch = [flat[e * 4 : (e + 1) * 4] for e in range(epochs)]
    assert all(sorted(e) == everything for e in per_epoch)  # every problem once per epoch
    assert flat == ids(make(epochs=epochs))  # the same order as a finite stream of as many epochs
    if shuffle:
        assert len({tuple(e) for e in per_epoch}) > 1  # reshuffled across epochs
    else:
        assert flat == everything * epochs


def test_shards_are_disjoint_and_cover_each_epoch():
    problems = toy(10)
    everything = {p.id for p in problems}
    full = ids(ProblemStream(problems, batch_size=1, seed=7, epochs=2, shard_index=0, shard_count=1))
    shards = [
        ids(ProblemStream(problems, batch_size=2, seed=7, epochs=2, shard_index=i, shard_count=3))
        for i in range(3)
    ]
    sizes = [len(s) // 2 for s in shards]
    assert sizes == [4, 3, 3]
    for e in range(2):
        parts = [set(s[e * n : (e + 1) * n]) for s, n in zip(shards, sizes)]
        assert set().union(*parts) == everything and sum(map(len, parts)) == 10
        # every process slices the same global permutation of this epoch
        for i, (s, n) in enumerate(zip(shards, sizes)):
            assert s[e * n : (e + 1) * n] == full[e * 10 : (e + 1) * 10][i::3]
    assert set(shards[0][:4]) != set(shards[0][4:])  # a shard gets different problems in different epochs


@pytest.mark.parametrize("k", [0, 2, 5])  # 2 and 5 batches of 4 from 10: the next batch straddles an epoch
def test_state_resumes_exactly(k):
    problems = toy(10)

    def make(**kw):
        return ProblemStream(problems, batch_size=4, seed=11, shard_index=1, shard_count=2, **kw)

    reference = make()
    take(reference, k)
    state = json.loads(json.dumps(reference.get_state()))
    resumed = make()
    resumed.set_state(state)
    assert (resumed.step, resumed.epoch) == (reference.step, reference.epoch)
    assert take(resumed, 8) == take(reference, 8)

    # a finite stream resumes to the same end
    finite, uninterrupted = make(epochs=6), make(epochs=6)  # 30 problems: 8 batches
    head = take(uninterrupted, k)
    assert take(finite, k) == head
    again = make(epochs=6)
    again.set_state(json.loads(json.dumps(finite.get_state())))
    assert [[p.id for p in b] for b in again] == [[p.id for p in b] for b in uninterrupted]


def test_state_from_another_stream_is_refused():
    state = ProblemStream(toy(10), batch_size=4, seed=1, shard_index=0, shard_count=1).get_state()
    with pytest.raises(ValueError, match="seed"):
        ProblemStream(toy(10), batch_size=4, seed=2, shard_index=0, shard_count=1).set_state(state)
    with pytest.raises(ValueError, match="ids_crc32"):
        ProblemStream(toy(10)[::-1], batch_size=4, seed=1, shard_index=0, shard_count=1).set_state(state)


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=1.0), "batch_size"),
        (dict(batch_size=2, shard_index=3, shard_count=3), "shard_index"),
        (dict(batch_size=2, shard_index=0), "shard_count"),
        (dict(batch_size=2, epochs=0), "epochs"),
        (dict(batch_size=2, epochs=float("inf")), "epochs"),
        (dict(batch_size=2, seed=-1), "seed"),
    ],
)
def test_stream_rejects_bad_arguments(kw, name):
    with pytest.raises(ValueError, match=name):
        ProblemStream(toy(4), **kw)


def test_empty_shard_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        ProblemStream(toy(2), batch_size=1, shard_index=2, shard_count=3)
