"""Reruns of a damaged run directory: each resumes from the newest restorable step and leaves
metrics.jsonl with every logged step once; what it cannot use is set aside, never deleted."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from marljax.train.checkpoint import write_manifest
from marljax.train.metrics import METRICS_FILE, read_metrics

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each test trains a tiny model for a few steps, some twice


def config(run_dir: Path, steps: int, save_every: int):
    from marljax.train.config import load_config

    overrides = [
        f"run_dir={run_dir}",
        f"train.steps={steps}",
        f"train.save_every={save_every}",
        "train.log_to=[]",
        "train.progress=false",
    ]
    return load_config(ROOT / "configs" / "grpo_tiny.yaml", overrides)


def train(run_dir: Path, steps: int, save_every: int) -> None:
    from marljax.train.loop import Trainer

    Trainer(config(run_dir, steps, save_every)).run()


def comparable(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time")} for r in read_metrics(run_dir)]


def biggest_file(directory: Path) -> Path:
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 4] = bytes(b ^ 0xFF for b in data[mid : mid + 4])
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """An uninterrupted 3-step run's metrics (steps 1, 2, 3)."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    train(run_dir, 3, 1)
    got = comparable(run_dir)
    assert [r["step"] for r in got] == [1, 2, 3]
    return got


@pytest.mark.parametrize("damage", ["corrupt", "removed"])
def test_rerun_without_a_restorable_checkpoint_starts_metrics_afresh(tmp_path, reference, damage):
    """Old code appended the rerun's steps to the old file (steps 1, 2, 1, 2), and crashed in the
    first step when a checkpoint existed but did not verify (the rebuilt policies were not the
    ones the generator sampled with)."""
    run_dir = tmp_path / "run"
    train(run_dir, 2, 2)  # one checkpoint, at step 2
    old = (run_dir / METRICS_FILE).read_text()
    if damage == "corrupt":
        flip(biggest_file(run_dir / "checkpoints" / "2" / "main"))
    else:  # e.g. killed before the first checkpoint
        shutil.rmtree(run_dir / "checkpoints")
    with pytest.warns(RuntimeWarning) as caught:
        train(run_dir, 2, 2)
    assert comparable(run_dir) == reference[:2]
    # the old file is kept aside, and the warning says where
    kept = [p for p in (run_dir / "set_aside").iterdir() if p.name.startswith(METRICS_FILE)]
    assert len(kept) == 1 and kept[0].read_text() == old
    assert any(str(kept[0]) in str(w.message) for w in caught)


def test_checkpoint_that_passes_its_manifest_but_does_not_restore_is_set_aside(tmp_path, reference):
    """Old code fell back to step 2, redid step 3 and failed with FileExistsError saving it."""
    run_dir = tmp_path / "run"
    train(run_dir, 3, 1)
    step_dir = run_dir / "checkpoints" / "3"
    bad = biggest_file(step_dir / "main")
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    write_manifest(str(step_dir), 3)  # storage that lies: the manifest vouches for the damage
    with pytest.warns(RuntimeWarning, match="step 3") as caught:
        train(run_dir, 3, 1)
    assert comparable(run_dir) == reference
    kept = list((run_dir / "set_aside").iterdir())
    assert len(kept) == 1 and (kept[0] / "main").is_dir()
    assert any(str(kept[0]) in str(w.message) for w in caught)
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["1", "2", "3"]


def test_corrupt_middle_metrics_line_is_skipped_and_kept_aside(tmp_path, reference):
    """Old code refused to resume ("corrupt metrics line") until the file was edited by hand; the
    damaged line's record is restored from the mirror."""
    run_dir = tmp_path / "run"
    train(run_dir, 2, 1)
    path = run_dir / METRICS_FILE
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = lines[0][:10] + "\x00garbage\n"
    path.write_text("".join(lines))
    with pytest.warns(RuntimeWarning, match=f"{path}:1"):
        train(run_dir, 3, 1)
    assert comparable(run_dir) == reference  # step 1's record comes back from metrics.mirror.jsonl
    kept = [p for p in (run_dir / "set_aside").iterdir() if p.name.startswith(METRICS_FILE)]
    assert len(kept) == 1 and "garbage" in kept[0].read_text()


def test_metrics_are_durable_before_each_checkpoint(tmp_path, monkeypatch):
    """A power cut keeps only what was fsynced: a checkpoint must never be ahead of its metrics,
    else the steps up to it are lost for good (the rerun resumes after them)."""
    from marljax.train.loop import Trainer

    run_dir = tmp_path / "run"
    path = run_dir / METRICS_FILE
    durable = {"size": 0}
    real_fsync = os.fsync

    def fsync(fd):
        real_fsync(fd)
        if os.path.exists(path) and os.path.samestat(os.fstat(fd), os.stat(path)):
            durable["size"] = os.fstat(fd).st_size

    checked = []
    real_save = Trainer.save

    def save(self):
        assert durable["size"] == path.stat().st_size, f"step {self.step}: metrics not fsynced"
        checked.append(self.step)
        real_save(self)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Trainer, "save", save)
    train(run_dir, 2, 1)
    assert checked == [1, 2]
