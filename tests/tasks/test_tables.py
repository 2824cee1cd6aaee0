"""Problems from the files most datasets come as (issue 41): a parquet file and a Hugging Face
`datasets` split saved with `save_to_disk` load to the same problems as the same rows in JSONL."""

from __future__ import annotations

import json

import pytest

from marljax.jsonl import DataError, write_jsonl
from marljax.tasks.files import load_problems

pa = pytest.importorskip("pyarrow", reason="tables need pyarrow (the data and test extras)")

ROWS = [
    {
        "task_id": 1,
        "text": "Write a function to add two numbers.",
        "code": "def add(a, b):\n    return a + b\n",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 2,
        "text": "Write a function to double a number.",
        "code": "def double(x):\n    return 2 * x\n",
        "test_list": ["assert double(2) == 4"],
        "test_setup_code": "",
        "challenge_test_list": ["assert double(-1) == -2"],
    },
]


def as_fields(problems):
    return [(p.id, p.prompt, p.schema, dict(p.fields)) for p in problems]


def test_parquet_rows_load_as_their_jsonl(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "mbpp.parquet")
    table = load_problems(tmp_path / "mbpp.parquet", "mbpp")
    lines = load_problems(write_jsonl(ROWS, tmp_path / "mbpp.jsonl"), "mbpp")
    assert as_fields(table) == as_fields(lines)
    assert [p.source for p in table] == [f"{tmp_path / 'mbpp.parquet'}:{i}" for i in (1, 2)]


def test_a_saved_datasets_split_loads_as_its_jsonl(tmp_path):
    # the layout `datasets.Dataset.save_to_disk` writes: Arrow IPC streams listed in state.json
    split = tmp_path / "mbpp" / "train"
    split.mkdir(parents=True)
    schema = pa.Table.from_pylist(ROWS).schema  # one schema for every shard, as datasets writes
    for k, rows in enumerate([ROWS[:1], ROWS[1:]]):
        table = pa.Table.from_pylist(rows, schema=schema)
        path = str(split / f"data-0000{k}-of-00002.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            writer.write_table(table)
    files = [{"filename": f"data-0000{k}-of-00002.arrow"} for k in range(2)]
    (split / "state.json").write_text(json.dumps({"_data_files": files, "_split": "train"}))
    (tmp_path / "mbpp" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    lines = load_problems(write_jsonl(ROWS, tmp_path / "mbpp.jsonl"), "mbpp")
    assert as_fields(load_problems(split, "mbpp")) == as_fields(lines)
    with pytest.raises(DataError, match=r"a DatasetDict; name one of its splits, e\.g\. .*/mbpp/train"):
        load_problems(tmp_path / "mbpp", "mbpp")


def test_a_bad_table_is_a_one_line_error_naming_it(tmp_path):
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(DataError, match=rf"^{bad}: cannot read"):
        load_problems(bad)
    with pytest.raises(DataError, match=r"no such file"):
        load_problems(tmp_path / "missing.parquet")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match=r"without state\.json"):
        load_problems(tmp_path / "plain")
