"""The wandb sink (train.log_to: [wandb]), offline: what a run logs there equals metrics.jsonl, a
resumed run continues the same wandb run, a run started afresh gets a new one; TensorBoard is
written only when log_to names it."""

from __future__ import annotations

import json
import math
import socket
import struct
from pathlib import Path

import pytest
import yaml

from marljax.train.metrics import MetricsWriter, read_metrics

BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of framed chunks
HEADER = 7  # ":W&B", a 2-byte magic and a version byte; each chunk's header is 7 bytes too
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list:
    """The protobuf records of one .wandb file, read from its framing (chunks joined)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    records, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def offline_runs(run_dir: Path) -> list[tuple[str, dict[int, dict]]]:
    """(wandb run id, {step: logged values}) of each offline wandb run under the run directory,
    oldest first."""
    import wandb

    wandb.teardown()  # finish() can return before wandb's service has written the whole file
    out = []
    # by time: two sessions in one second are named <second>-<id> and <second>-<id>-1
    for path in sorted((run_dir / "wandb").glob("offline-run-*/*.wandb"), key=lambda p: p.stat().st_mtime_ns):
        run_id, history = None, {}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "history":
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
                }
                # keyed by the record's own step (wandb's internal one only counts the records)
                history[items["step"]] = {
                    k: v for k, v in items.items() if not k.startswith("_") and k != "step"
                }
        out.append((run_id, history))
    return out


def logged_config(run_dir: Path) -> dict:
    """The config the first offline wandb run under the run directory was started with."""
    (path, *_) = sorted((run_dir / "wandb").glob("offline-run-*/*.wandb"), key=lambda p: p.stat().st_mtime_ns)
    (run,) = [r.run for r in wandb_records(path) if r.WhichOneof("record_type") == "run"]
    return {item.key: json.loads(item.value_json) for item in run.config.update}


def assert_same_values(wandb_values: dict, record: dict) -> None:
    expected = {k: v for k, v in record.items() if k not in ("step", "time")}
    assert wandb_values.keys() == expected.keys()
    for key, value in expected.items():
        got = wandb_values[key]
        assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(value, rel=1e-12), key


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """wandb offline, its files under tmp_path, and no way out: any connection it tried would go
    to a closed local port (wandb's own server and every proxied address), and a Python-side
    connection other than a local one fails the test."""
    pytest.importorskip("wandb")  # the test extra has it
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path / "wandb-dir"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(key, raising=False)
    real = socket.socket.connect

    def local_only(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in (
            "127.0.0.1",
            "::1",
            "localhost",
        ):
            raise AssertionError(f"network connection to {address}")
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)


def test_the_writer_logs_each_record_to_one_wandb_run_across_a_resume(tmp_path, offline):
    run = tmp_path / "run"
    settings = {"project": "p", "name": "r", "config": {"seed": 3}}
    with MetricsWriter(run, log_to=("wandb",), wandb=settings, enabled=True) as w:
        w.write(-1, {"sft/main/loss": 2.0})  # SFT's steps come before RL's step 0
        w.write(1, {"agent/a/reward": 0.5, "policy/main/loss": float("nan"), "n": 3})
        w.write(2, {"agent/a/reward": 0.25, "policy/main/loss": 1.5, "n": 4})
    assert not (run / "tensorboard").exists()  # not named in log_to
    run_id = (run / "wandb" / "run_id").read_text().strip()
    ((logged_id, history),) = offline_runs(run)
    assert logged_id == run_id and sorted(history) == [-1, 1, 2]
    for record in read_metrics(run):
        assert_same_values(history[record["step"]], record)

    # a later process resumes from the checkpoint at step 1: the same wandb run goes on
    with MetricsWriter(run, log_to=("wandb",), wandb=settings, enabled=True) as w:
        w.resume(1)
        w.write(2, {"agent/a/reward": 0.75, "policy/main/loss": 1.0, "n": 5})
    first, second = offline_runs(run)
    assert first[0] == second[0] == run_id and sorted(second[1]) == [2]
    assert_same_values(second[1][2], read_metrics(run)[-1])

    # a run that starts from its initial weights sets the old wandb files aside: a new wandb run
    with MetricsWriter(run, log_to=("wandb",), wandb=settings, enabled=True) as w:
        with pytest.warns(RuntimeWarning, match="starts afresh"):
            w.start_afresh()
        w.write(1, {"agent/a/reward": 1.0, "policy/main/loss": 0.0, "n": 6})
    ((new_id, history),) = offline_runs(run)
    assert new_id != run_id and sorted(history) == [1]
    (aside,) = [p for p in (run / "set_aside").iterdir() if p.name.startswith("wandb")]
    assert (aside / "run_id").read_text().strip() == run_id


def test_tensorboard_is_written_only_when_named(tmp_path):
    for log_to in ((), ("tensorboard",)):
        run = tmp_path / "-".join(log_to or ("none",))
        with MetricsWriter(run, log_to=log_to, enabled=True) as w:
            w.write(1, {"x": 1.0})
        events = list(run.glob("tensorboard/events.out.tfevents.*"))
        assert (run / "tensorboard").exists() == bool(events) == ("tensorboard" in log_to)


def test_an_unknown_sink_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'mlflow'"):
        MetricsWriter(tmp_path, log_to=("mlflow",), enabled=True)


def _tiny_config(tmp_path: Path, steps: int) -> Path:
    cfg = {
        "name": "wb",
        "run_dir": str(tmp_path / "run"),
        # one update a step (2 problems x 2 samples fill the buffer): policy metrics are logged too
        "policies": {
            "main": {"model": {"preset": "tiny-qwen3"}, "buffer": {"threshold": 4}, "micro_batch_size": 4}
        },
        "agents": {"solver": {"policy": "main"}},
        "data": {"source": {"kind": "synthetic", "n_train": 4}, "batch_size": 2},
        "sampler": {"max_new_tokens": 8},
        "workflow": {"kind": "grpo", "group_size": 2},
        "train": {"steps": steps, "save_every": 1, "progress": False, "log_to": ["wandb"]},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_a_training_run_logs_to_wandb_and_a_rerun_continues_it(tmp_path, offline):
    from marljax.cli import train_summary
    from marljax.train.config import load_config
    from marljax.train.loop import Trainer

    config = _tiny_config(tmp_path, steps=1)
    Trainer(load_config(config)).run()
    run = tmp_path / "run"
    assert not (run / "tensorboard").exists()  # log_to names wandb only
    ((run_id, history),) = offline_runs(run)
    (record,) = read_metrics(run)
    assert sorted(history) == [1] and "policy/main/loss" in record
    assert_same_values(history[1], record)
    logged = logged_config(run)  # the run's settings, as config.yaml holds them
    assert {k: v for k, v in logged.items() if k != "_wandb"} == yaml.safe_load(
        (run / "config.yaml").read_text()
    )

    trainer = Trainer(load_config(config, ["train.steps=2"]))
    trainer.run()  # resumes from the checkpoint at step 1
    runs = offline_runs(run)
    assert [r for r, _ in runs] == [run_id, run_id]
    assert sorted(runs[1][1]) == [2]
    assert_same_values(runs[1][1][2], read_metrics(run)[-1])
    # `marljax train`'s closing lines say where the wandb run is and how to upload it
    lines = train_summary(trainer, str(config), ["train.steps=2"])
    assert f"  metrics        {run}/metrics.jsonl, wandb: {run}/wandb/" in lines
    assert f"  wandb sync {run}/wandb/offline-run-*   (uploads the offline wandb run)" in lines


def test_a_missing_wandb_is_a_one_line_error_naming_the_key(tmp_path, monkeypatch, capsys):
    import importlib.util

    from marljax.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    assert main(["train", str(_tiny_config(tmp_path, steps=1))]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        'error: train.log_to: wandb is not installed: pip install "marljax[wandb]" (or drop it from the list)'
    )
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before the run directory changed
