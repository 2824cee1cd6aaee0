"""`marljax check-data FILE`: every row's reference answer runs against its own tests in the
sandbox; the rows whose reference fails are named by file:line (issue 41)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from marljax import cli

HUMANEVAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "HumanEval.jsonl.gz"


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_wrong_reference_is_named_by_its_line_and_fails_the_command(tmp_path, capsys):
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
    rows = [
        {
            "task_id": 1,
            "text": "Add two numbers.",
            "code": "def add(a, b):\n    return a + b\n",
            "test_list": tests,
        },
        {
            "task_id": 2,
            "text": "Add two numbers.",
            "code": "def add(a, b):\n    return a * b\n",
            "test_list": tests,
        },
        {"task_id": 3, "text": "Add two numbers.", "test_list": tests},  # no reference
    ]
    path = write(tmp_path / "mbpp.jsonl", rows)
    assert cli.main(["check-data", path]) == 1
    out = capsys.readouterr().out.splitlines()
    # 2 * 2 == 4 passes, 1 * 2 == 3 does not: half the tests
    assert (
        out[0]
        == f"{path}:2: 2: the reference passes 50% of the tests (test 0: wrong_answer: expected '3', got '2')"
    )
    assert (
        out[-1] == f"{path}: 1 of 2 reference answers pass all their tests; 1 rows have no reference answer"
    )


def test_references_that_pass_exit_0(tmp_path, capsys):
    row = {"question": "Print the sum of two numbers.", "solution": "a, b = map(int, input().split())\nprint(a + b)\n",
           "inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}  # fmt: skip
    path = write(tmp_path / "stdio.jsonl", [{"id": "sum", **row}])
    assert cli.main(["check-data", path, "--schema", "stdio"]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: 1 of 1 reference answers pass all their tests"


def test_humaneval_canonical_solutions_all_pass(tmp_path, capsys):
    if not HUMANEVAL.exists():
        pytest.skip(f"{HUMANEVAL} is absent (the shared data folder beside the project)")
    path = tmp_path / "humaneval.jsonl"
    path.write_bytes(gzip.decompress(HUMANEVAL.read_bytes()))
    assert cli.main(["check-data", str(path)]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.strip().endswith("164 of 164 reference answers pass all their tests")
