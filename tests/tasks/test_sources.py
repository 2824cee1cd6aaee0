"""Problem sources: the registry, a source defined outside the package used from YAML, the eval
split's seed, and the one JSONL reader."""

from __future__ import annotations

import gzip
import importlib
import sys
import textwrap
from typing import Literal

import pytest
import yaml

from marljax.rewards import Problem
from marljax.tasks import (
    EVAL_SEED_OFFSET,
    SOURCES,
    DataError,
    GeneratedSource,
    GridSource,
    ToolTasks,
    make_grid_problems,
    read_jsonl,
    register_source,
)
from marljax.train.config import ConfigError, load_config

CONFIG = {
    "policies": {"main": {"model": {"preset": "tiny-qwen3"}}},
    "agents": {"solver": {"policy": "main"}},
}

RIDDLES = """
from typing import Literal

from marljax.rewards import Problem
from marljax.tasks import GeneratedSource, register_source


@register_source("riddles_test")
class Riddles(GeneratedSource):
    kind: Literal["riddles_test"] = "riddles_test"
    answer: int = 4

    def make(self, n, seed, split):
        return [
            Problem(f"riddle/{seed}/{i}", "2 + 2?", "math", f"<riddles {split}>:{i}", {"answer": self.answer})
            for i in range(n)
        ]
"""


@pytest.fixture
def outside_module(tmp_path, monkeypatch):
    """A module outside marljax that registers a source when imported; unregistered afterwards."""
    (tmp_path / "my_riddles.py").write_text(textwrap.dedent(RIDDLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("my_riddles")
    SOURCES._functions.pop("riddles_test", None)
    sys.modules.pop("my_riddles", None)


def test_a_source_registered_outside_the_package_is_usable_from_yaml(tmp_path, outside_module):
    data = {"source": {"kind": "riddles_test", "n_train": 3, "n_eval": 1, "answer": 5}, "batch_size": 2}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "data": data}))
    cfg = load_config(path)
    assert isinstance(cfg.data.source, outside_module.Riddles)
    train, held_out = cfg.data.source.split("train"), cfg.data.source.split("eval")
    assert [p.id for p in train] == ["riddle/0/0", "riddle/0/1", "riddle/0/2"]
    assert [p.id for p in held_out] == [f"riddle/{EVAL_SEED_OFFSET}/0"]
    assert train[0].fields == {"answer": 5}
    # its own keys are checked like any other section's, named by file and dotted key
    path.write_text(yaml.safe_dump({**CONFIG, "data": {"source": {"kind": "riddles_test", "answr": 5}}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: data.source.answr: unknown key (got 5)"]


def test_registry_is_strict():
    class Again(GeneratedSource):
        kind: Literal["grid"] = "grid"

        def make(self, n, seed, split):
            return []

    with pytest.raises(ValueError, match="data source 'grid' is already registered to GridSource"):
        register_source("grid")(Again)
    with pytest.raises(TypeError, match="must default to 'other'"):
        register_source("other")(Again)
    with pytest.raises(TypeError, match="needs a Source subclass"):
        register_source("other")(Problem)
    with pytest.raises(ValueError, match="`data source` must be one of"):
        SOURCES.get("nope")


def test_generated_splits_are_seeded_apart():
    grid = GridSource(n_train=3, n_eval=2, size=4, seed=7)
    assert [p.fields for p in grid.split("train")] == [p.fields for p in make_grid_problems(3, 7, 4)]
    held_out = make_grid_problems(2, 7 + EVAL_SEED_OFFSET, 4)
    assert [p.fields for p in grid.split("eval")] == [p.fields for p in held_out]
    assert ToolTasks(n_eval=0).split("eval") == []
    with pytest.raises(ValueError, match="split must be one of"):
        grid.split("test")


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write('{"a": 1}\n\n[2]\n')
    assert list(read_jsonl(path)) == [(f"{path}:1", {"a": 1}), (f"{path}:3", [2])]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(DataError, match=rf"^{bad}:2: invalid JSON: "):
        list(read_jsonl(bad))
    with pytest.raises(DataError, match="no such file"):
        list(read_jsonl(tmp_path / "missing.jsonl"))


def test_synthetic_solution_slips_make_the_sft_targets_sloppy_and_only_steps_tasks_take_them():
    from pydantic import ValidationError

    from marljax.tasks.code import SyntheticSource, slip

    clean = SyntheticSource(style="steps", n_train=200)
    sloppy = SyntheticSource(style="steps", n_train=200, solution_slips=1.0)
    pairs = list(zip(clean.split("train"), sloppy.split("train")))
    assert all(c.prompt == s.prompt and c.fields["inputs"] == s.fields["inputs"] for c, s in pairs)
    # at rate 1 every line that admits a slip carries it; adding is the one operation without one
    import random

    for c, s in pairs:
        assert s.fields["solution"] == slip(c.fields["solution"], random.Random(0), 1.0)
    changed = [c.fields["solution"] != s.fields["solution"] for c, s in pairs]
    assert changed == ["x = x + " not in c.fields["solution"] for c, _ in pairs]
    half = SyntheticSource(style="steps", n_train=200, solution_slips=0.5).split("train")
    share = sum(h.fields["solution"] != c.fields["solution"] for (c, _), h in zip(pairs, half)) / sum(changed)
    assert abs(share - 0.5) < 4 * 0.5 / sum(changed) ** 0.5, share  # 4 sigma
    with pytest.raises(ValidationError, match="style: steps only"):
        SyntheticSource(style="examples", solution_slips=0.5)
