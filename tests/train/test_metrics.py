"""MetricsWriter / read_metrics / Progress and the run plots."""

from __future__ import annotations

import io
import json
import math
import os
import struct
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib.image import imread
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from marljax.train.metrics import MetricsWriter, Progress, read_metrics
from marljax.train.plot import curves, make_figure, plot_run


def read_events(logdir: Path) -> list[event_pb2.Event]:
    """Events of every TensorBoard file under `logdir`, from the TFRecord framing, CRCs checked."""
    events = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            header = data[pos : pos + 8]
            (n,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[pos + 8 : pos + 12])[0] == masked_crc32c(header)
            body = data[pos + 12 : pos + 12 + n]
            assert struct.unpack("<I", data[pos + 12 + n : pos + 16 + n])[0] == masked_crc32c(body)
            events.append(event_pb2.Event.FromString(body))
            pos += 16 + n
    return events


def scalars(events) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for ev in events:
        for v in ev.summary.value:
            out.setdefault(v.tag, []).append((ev.step, v.simple_value))
    return out


def test_round_trip_numpy_jax_and_nonfinite(tmp_path):
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        w.write(
            np.int64(1),
            {
                "agent/coder/reward": np.float32(0.5),
                "agent/coder/n": np.int32(3),
                "policy/main/loss": jnp.asarray(0.25),
                "policy/main/kl_ref": jnp.array([1e-3]),
            },
        )
        assert [r["step"] for r in read_metrics(tmp_path)] == [
            1
        ]  # flushed per line: a kill now loses nothing
        w.write(
            2,
            {
                "agent/coder/reward": float("nan"),
                "policy/main/grad_norm": np.float64(np.inf),
                "policy/main/loss": -math.inf,
                "eval/pass_at_1": 1,
                "flag": np.bool_(True),
            },
        )
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    first, second = records
    assert first["agent/coder/reward"] == 0.5 and type(first["agent/coder/reward"]) is float
    assert first["agent/coder/n"] == 3 and type(first["agent/coder/n"]) is int
    assert first["policy/main/loss"] == 0.25
    assert first["policy/main/kl_ref"] == pytest.approx(1e-3)
    assert isinstance(first["time"], float) and abs(first["time"] - second["time"]) < 60
    assert math.isnan(second["agent/coder/reward"])
    assert second["policy/main/grad_norm"] == math.inf and second["policy/main/loss"] == -math.inf
    assert second["eval/pass_at_1"] == 1 and second["flag"] == 1

    # The file is strict JSON: bare NaN / Infinity would be refused here.
    def refuse(name):
        raise AssertionError(f"non-JSON constant {name}")

    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=refuse)


def test_write_rejects_bad_values(tmp_path):
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        with pytest.raises(ValueError, match="agent/a/reward"):
            w.write(0, {"agent/a/reward": np.zeros(3)})
        with pytest.raises(TypeError, match="agent/a/name"):
            w.write(0, {"agent/a/name": "coder"})
        with pytest.raises(ValueError, match="reserved"):
            w.write(0, {"step": 1.0})
    assert read_metrics(tmp_path) == []
    with pytest.raises(ValueError, match="closed"):
        w.write(1, {"x": 1.0})


def test_enabled_by_default_on_process_zero(tmp_path):
    with MetricsWriter(tmp_path / "run", log_to=()) as w:
        assert w.enabled
        w.write(0, {"x": 1.0})
    assert read_metrics(tmp_path / "run")[0]["x"] == 1.0


def test_tensorboard_scalars_are_readable(tmp_path):
    with MetricsWriter(tmp_path, enabled=True) as w:
        for step in range(3):
            w.write(step, {"agent/coder/reward": 0.1 * step, "policy/main/loss": np.float32(2.0 - step)})
    assert (tmp_path / "tensorboard").is_dir()
    got = scalars(read_events(tmp_path / "tensorboard"))
    assert [s for s, _ in got["agent/coder/reward"]] == [0, 1, 2]
    assert [v for _, v in got["agent/coder/reward"]] == pytest.approx([0.0, 0.1, 0.2])
    assert got["policy/main/loss"] == [(0, 2.0), (1, 1.0), (2, 0.0)]


def test_resume_truncates_exactly(tmp_path):
    with MetricsWriter(tmp_path, enabled=True) as w:
        for step in range(1, 6):
            w.write(step, {"agent/a/reward": float(step)})
    # A new process resumes from the checkpoint at step 3 and replays step 4.
    with MetricsWriter(tmp_path, enabled=True) as w:
        w.resume(3)
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
        w.write(4, {"agent/a/reward": 40.0})
    records = read_metrics(tmp_path)
    assert [(r["step"], r["agent/a/reward"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    # no temp file left
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.jsonl",
        "metrics.mirror.jsonl",
        "tensorboard",
    ]
    # TensorBoard hides the replayed steps through a purge event (SessionLog START at step 4).
    events = read_events(tmp_path / "tensorboard")
    starts = [ev.step for ev in events if ev.HasField("session_log") and ev.session_log.status == 1]
    assert starts == [4]
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2


def test_resume_to_step_zero_and_twice(tmp_path):
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        for step in range(4):
            w.write(step, {"x": float(step)})
        w.resume(2)
        w.resume(0)
        assert [r["step"] for r in read_metrics(tmp_path)] == [0]
        w.write(1, {"x": 9.0})
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(0, 0.0), (1, 9.0)]


def test_torn_last_line_is_ignored_and_repaired(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        for step in range(3):
            w.write(step, {"agent/a/reward": float(step)})
    with open(path, "a") as f:
        f.write('{"step": 3, "time": 1.0, "agent/a/rew')  # killed mid-line
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        w.write(3, {"agent/a/reward": 3.0})
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    assert path.read_text().endswith("}\n")
    # resume() also drops a torn tail.
    with open(path, "a") as f:
        f.write('{"step": 4')
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        w.resume(10)
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]


def test_complete_last_record_without_newline_is_kept(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}')
    assert [r["x"] for r in read_metrics(tmp_path)] == [1, 2]
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        w.write(2, {"x": 3})
    assert [r["x"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_corrupt_lines_are_skipped_with_file_and_line(tmp_path):
    """Old code raised on a corrupt line before the last, so a run could not resume until the file
    was edited by hand."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, oops\n{"step": 2}\n')
    with pytest.warns(RuntimeWarning, match=f"{path}:2"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [0, 2]
    # A newline-terminated last line was written whole: if it is corrupt, that is corruption, not a kill.
    path.write_text('{"step": 0}\ngarbage\n')
    with pytest.warns(RuntimeWarning, match=f"{path}:2"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [0]
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(tmp_path / "missing")


def test_writer_keeps_a_corrupt_file_aside_and_goes_on(tmp_path):
    path = tmp_path / "metrics.jsonl"
    damaged = '{"step": 1}\n{"step": 2, oops\n{"step": 3}\n'
    path.write_text(damaged)
    with pytest.warns(RuntimeWarning, match=f"{path}:2") as caught:
        w = MetricsWriter(tmp_path, log_to=(), enabled=True)
    (kept,) = (tmp_path / "set_aside").iterdir()
    assert kept.read_text() == damaged and str(kept) in str(caught[0].message)
    with w, warnings.catch_warnings():
        warnings.simplefilter("error")  # the file is clean now: no second warning
        w.resume(3)
        w.write(4, {"x": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 3, 4]


def test_start_afresh_sets_the_old_metrics_aside(tmp_path):
    """Old code had no fresh start: a rerun without a checkpoint appended its steps to the old ones."""
    with MetricsWriter(tmp_path, enabled=True) as w:
        for step in (1, 2):
            w.write(step, {"x": float(step)})
    old = (tmp_path / "metrics.jsonl").read_text()
    with MetricsWriter(tmp_path, enabled=True) as w:
        with pytest.warns(RuntimeWarning, match="set_aside") as caught:
            w.start_afresh()
        assert read_metrics(tmp_path) == []
        w.write(1, {"x": 10.0})
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(1, 10.0)]
    kept = sorted((tmp_path / "set_aside").iterdir())
    assert [p.name.split(".2")[0] for p in kept] == ["metrics.jsonl", "metrics.mirror.jsonl", "tensorboard"]
    assert kept[0].read_text() == old and all(str(p) in str(caught[0].message) for p in kept)
    # the new TensorBoard directory holds the new run only
    assert scalars(read_events(tmp_path / "tensorboard")) == {"x": [(1, 10.0)]}
    # nothing to set aside: no warning, no folder
    fresh = tmp_path / "fresh"
    with MetricsWriter(fresh, enabled=True) as w, warnings.catch_warnings():
        warnings.simplefilter("error")
        w.start_afresh()
    assert sorted(p.name for p in fresh.iterdir()) == ["metrics.jsonl", "metrics.mirror.jsonl"]


def test_resume_keeps_each_step_once(tmp_path):
    # a file that older versions appended a rerun to: the later record of a step is the live one
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(f'{{"step": {s}, "x": {x}}}\n' for s, x in [(1, 1), (2, 2), (3, 3), (1, 10), (2, 20)])
    )
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        w.resume(2)
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(1, 10), (2, 20)]


def test_sync_makes_the_records_durable(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_size), real(fd)))
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        w.write(1, {"x": 1.0})
        w.sync()
        size = (tmp_path / "metrics.jsonl").stat().st_size
        assert synced == [size, size] == [(tmp_path / "metrics.mirror.jsonl").stat().st_size] * 2


def test_damage_to_one_of_the_two_files_loses_no_record(tmp_path):
    """Every record is written to metrics.jsonl and metrics.mirror.jsonl: a corrupt line, a cut
    file or a deleted file on either side is repaired from the other, with each step once."""
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        for step in (1, 2, 3):
            w.write(step, {"x": float(step)})
    whole = [(r["step"], r["x"]) for r in read_metrics(tmp_path)]
    assert whole == [(1, 1.0), (2, 2.0), (3, 3.0)]
    main, mirror = tmp_path / "metrics.jsonl", tmp_path / "metrics.mirror.jsonl"
    good = main.read_text()
    lines = good.splitlines(keepends=True)
    for damage in (
        lambda: main.write_text(lines[0] + "{oops\n" + lines[2]),  # a corrupt middle line
        lambda: mirror.write_text(lines[0][:5] + "\x00" + lines[0][6:] + lines[1] + lines[2]),
        lambda: main.write_text(lines[0]),  # cut short
        lambda: main.unlink(),
        lambda: mirror.unlink(),
    ):
        main.write_text(good)
        mirror.write_text(good)
        damage()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            MetricsWriter(tmp_path, log_to=(), enabled=True).close()
        assert main.read_text() == mirror.read_text() == good


def test_disabled_writer_writes_nothing(tmp_path):
    run = tmp_path / "run"
    with MetricsWriter(run, enabled=False) as w:
        w.write(0, {"agent/a/reward": 1.0})
        w.resume(0)
    assert not run.exists()


def test_progress_enabled_and_disabled():
    out = io.StringIO()
    with Progress(3, desc="train", enabled=True, file=out) as bar:
        bar.update(reward=np.float32(0.41234), kl=jnp.asarray(0.002))
        bar.update(2, reward=0.5)
    text = out.getvalue()
    assert "train" in text and "3/3" in text and "reward=0.5" in text
    quiet = io.StringIO()
    with Progress(3, initial=1, enabled=False, file=quiet) as bar:
        bar.update(1, reward=1.0)
    assert quiet.getvalue() == ""
    bar = Progress(10, initial=4, enabled=True, file=io.StringIO())
    bar.update(reward=0.41234, kl=0.002)
    assert "reward=0.412 kl=0.002" in str(bar._bar)
    bar.note("evaluating 64 problems")  # shown at once, in place of the numbers, until the next update
    assert "evaluating 64 problems" in str(bar._bar) and "reward" not in str(bar._bar)
    bar.update(reward=0.5)
    assert "evaluating" not in str(bar._bar) and "reward=0.5" in str(bar._bar)
    bar.close()
    bar.close()


def _records():
    return [
        {
            "step": 0,
            "time": 0.0,
            "agent/coder/reward": 0.1,
            "agent/tester/reward": 0.2,
            "agent/coder/pass_rate": 0.0,
            "policy/main/kl_ref": 0.0,
            "policy/main/loss": 1.0,
            "agent/coder/adv_mean": 0.0,
            "time/step_s": 1.5,
        },
        {
            "step": 1,
            "time": 1.0,
            "agent/coder/reward": 0.3,
            "policy/main/kl_ref": 0.01,
            "policy/main/loss": 0.8,
            "eval/pass_at_1": 0.25,
            "eval/pass_at_8": 0.5,
        },
        {
            "step": 2,
            "time": 2.0,
            "agent/coder/reward": 0.5,
            "agent/tester/reward": float("nan"),
            "agent/coder/pass_rate": 0.5,
            "policy/main/kl_ref": 0.02,
            "policy/main/loss": 0.7,
        },
        {
            "step": 3,
            "time": 3.0,
            "agent/coder/reward": 0.6,
            "agent/tester/reward": 0.7,
            "policy/main/kl_ref": 0.03,
            "policy/main/loss": 0.6,
            "eval/pass_at_1": 0.5,
        },
    ]


def test_curves_one_line_per_agent_or_policy():
    got = curves(_records())
    assert list(got) == ["reward", "pass_rate", "kl_ref", "loss", "eval"]
    assert list(got["reward"]) == ["coder", "tester"]
    steps, values = got["reward"]["coder"]
    assert steps.tolist() == [0, 1, 2, 3] and values.tolist() == [0.1, 0.3, 0.5, 0.6]
    steps, values = got["reward"]["tester"]  # absent at step 1: no point there
    assert steps.tolist() == [0, 2, 3]
    assert values[0] == 0.2 and math.isnan(values[1]) and values[2] == 0.7
    assert got["pass_rate"]["coder"][0].tolist() == [0, 2]
    assert list(got["kl_ref"]) == ["main"] and got["kl_ref"]["main"][1].tolist() == [0.0, 0.01, 0.02, 0.03]
    assert {k: v[0].tolist() for k, v in got["eval"].items()} == {"pass_at_1": [1, 3], "pass_at_8": [1]}
    # agent and policy lines in one figure keep their kind in the label
    mixed = curves([{"step": 0, "agent/a/entropy": 1.0, "policy/main/entropy": 2.0}])
    assert list(mixed["entropy"]) == ["agent/a", "policy/main"]


def test_make_figure_has_one_labelled_line_per_series():
    series = curves(_records())["reward"]
    fig = make_figure("reward", series, smoothing=0.0)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["coder", "tester"]
    fig = make_figure("reward", series, smoothing=0.6)
    (ax,) = fig.axes
    labelled = [line for line in ax.lines if not line.get_label().startswith("_")]
    assert [line.get_label() for line in labelled] == ["coder", "tester"]
    assert len(ax.lines) == 4  # raw points kept under each smoothed line
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["coder", "tester"]


def test_plot_run_writes_valid_pngs(tmp_path):
    with MetricsWriter(tmp_path, log_to=(), enabled=True) as w:
        for r in _records():
            w.write(r["step"], {k: v for k, v in r.items() if k not in ("step", "time")})
    paths = plot_run(tmp_path)
    assert [p.name for p in paths] == ["reward.png", "pass_rate.png", "kl_ref.png", "loss.png", "eval.png"]
    for p in paths:
        assert p.parent == tmp_path / "plots"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert imread(p).shape == (400, 700, 4)
    other = plot_run(tmp_path, tmp_path / "elsewhere", smoothing=0.0)
    assert [p.name for p in other] == [p.name for p in paths] and all(p.is_file() for p in other)


def test_plot_run_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=f"{tmp_path / 'metrics.jsonl'}.*no records"):
        plot_run(tmp_path)
