"""End to end: a tiny GRPO run learns, survives SIGKILL, exports to transformers; CLI errors name the culprit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from marljax.train.config import config_from_dict
from marljax.train.metrics import read_metrics


def seven_task(tmp: Path, run_dir: Path, **train) -> Path:
    """A math task whose answer is always 7: a random tiny model says a final 7 in
    about 4% of 16-token answers, so GRPO has a signal from the first step."""
    data = tmp / "seven.jsonl"
    with data.open("w") as f:
        for k in range(16):
            f.write(json.dumps({"id": f"q{k}", "problem": f"Question {k}: answer 7", "answer": "7"}) + "\n")
    cfg = {
        "name": "seven",
        "run_dir": str(run_dir),
        "policies": {
            "main": {
                "model": {"preset": "tiny-qwen3"},
                "optimizer": {"lr": 3e-3},
                "buffer": {"threshold": 64},
                "micro_batch_size": 32,
            }
        },
        "agents": {"solver": {"policy": "main"}},
        "data": {"source": {"kind": "jsonl", "train": str(data), "eval": str(data)}, "batch_size": 8},
        "sampler": {"max_new_tokens": 16},
        "workflow": {"kind": "grpo", "group_size": 8},
        "train": {"steps": 30, "save_every": 10, "log_to": [], "progress": False, **train},
    }
    path = tmp / "seven.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli(*args, **kw) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-m", "marljax.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def run_cli(*args, timeout=600) -> subprocess.CompletedProcess:
    p = cli(*args)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    from marljax.train.loop import Trainer

    tmp = tmp_path_factory.mktemp("grpo")
    config = seven_task(tmp, tmp / "run")
    trainer = Trainer(config_from_dict(yaml.safe_load(config.read_text()), str(config)))
    trainer.run()
    return trainer, tmp / "run"


@pytest.mark.slow
def test_grpo_mean_reward_rises(grpo_run):
    _, run_dir = grpo_run
    rewards = [r["agent/solver/reward"] for r in read_metrics(run_dir)]
    assert len(rewards) == 30
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert 0 < first < 0.15, rewards  # the initial policy sometimes solves it
    assert last > first + 0.3, rewards
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["10", "20", "30"]


@pytest.mark.slow
def test_rerunning_a_finished_run_says_so_and_another_config_is_refused(grpo_run, caplog):
    from marljax.train.config import ConfigError
    from marljax.train.loop import Trainer

    trainer, run_dir = grpo_run
    cfg, before = trainer.cfg, (run_dir / "config.yaml").read_text()
    fewer = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 5})})
    with caplog.at_level("WARNING"):
        Trainer(fewer).run()
    assert f"{run_dir} is already at step 30 >= train.steps=5: nothing to do" in caplog.text
    # a run that did nothing records no settings
    assert (run_dir / "config.yaml").read_text() == before and not list(run_dir.glob("config-*"))
    with pytest.raises(ConfigError, match=r"seed: 0 in the run's config.yaml, 1 now"):
        Trainer(cfg.model_copy(update={"seed": 1})).run()
    assert (run_dir / "config.yaml").read_text() == before
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["10", "20", "30"]


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_trained_logits(grpo_run, tmp_path):
    from marljax.models.decoder import forward
    from marljax.testing import torch_logits

    trainer, run_dir = grpo_run
    res = run_cli("export", str(run_dir), "--policy", "main", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr
    ids = np.array([[5, 17, 42, 99, 7, 250, 3, 11]])
    ours = np.asarray(
        forward(trainer.policies["main"].params, jnp.asarray(ids), config=trainer.policies["main"].config)[0]
    )
    theirs = torch_logits(tmp_path / "hf", ids)
    np.testing.assert_allclose(theirs, ours, atol=1e-4)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf"))("answer 7")["input_ids"]
    # a step the run does not keep (no SFT here, so no step 0): one line naming the steps it keeps
    res = run_cli("export", str(run_dir), "--policy", "main", "--step", "0", str(tmp_path / "hf0"))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "step 0" in res.stderr and "steps kept: 10, 20, 30" in res.stderr, res.stderr
    assert not (tmp_path / "hf0").exists()


def _kill_when(proc: subprocess.Popen, ready, timeout=300) -> None:
    t0 = time.time()
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early: {proc.communicate()[1][-2000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out waiting for the kill point")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _steps_logged(run_dir: Path) -> int:
    try:
        return len(read_metrics(run_dir))
    except (FileNotFoundError, ValueError):
        return 0


def _writing_checkpoint(run_dir: Path) -> bool:
    ckpt = run_dir / "checkpoints"
    return ckpt.is_dir() and any("tmp" in name for name in os.listdir(ckpt))


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith("time")} for r in records]


@pytest.mark.slow
def test_sigkill_mid_run_and_mid_checkpoint_then_resume_matches_uninterrupted(tmp_path):
    steps = dict(steps=12, save_every=2)
    reference = tmp_path / "reference"
    res = run_cli("train", str(seven_task(tmp_path, reference, **steps)))
    assert res.returncode == 0, res.stderr
    expected = _comparable(read_metrics(reference))
    assert len(expected) == 12

    run = tmp_path / "killed"
    config = str(seven_task(tmp_path, run, **steps))
    # 1) killed between checkpoints, after step 5 was logged (checkpoint 4 complete)
    _kill_when(cli("train", config), lambda: _steps_logged(run) >= 5)
    # 2) resumed, then killed while an orbax write is in flight
    _kill_when(cli("train", config), lambda: _steps_logged(run) >= 6 and _writing_checkpoint(run))
    # 3) resumed to the end
    res = run_cli("train", config)
    assert res.returncode == 0, res.stderr
    assert "resumed" in res.stderr
    assert _comparable(read_metrics(run)) == expected


@pytest.mark.slow
def test_ctrl_c_says_where_the_run_is_and_how_to_resume(tmp_path):
    from marljax.train.checkpoint import RunCheckpointer

    run = tmp_path / "run"
    config = str(seven_task(tmp_path, run, steps=1000, save_every=3))
    # a terminal's Ctrl-C reaches the whole process group: the trainer and its sandbox workers
    proc = subprocess.Popen(
        [sys.executable, "-m", "marljax.cli", "train", config],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.time()
    while _steps_logged(run) < 4:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.time() - t0 < 300, "timed out waiting for step 4"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    saved = RunCheckpointer(run, ["main"]).latest_step()
    assert saved is not None and saved % 3 == 0
    lines = out.splitlines()
    assert lines[0].startswith("interrupted at step "), out
    assert lines[0].endswith(f": rerun `marljax train {config}` to resume from step {saved}"), out
    assert f"  checkpoints    {run}/checkpoints/ (newest: step {saved})" in lines, out


@pytest.mark.slow
def test_a_finished_train_command_says_where_its_results_are(grpo_run):
    from marljax.cli import train_summary

    trainer, run_dir = grpo_run
    config = str(run_dir.parent / "seven.yaml")
    lines = train_summary(trainer, config, ["train.steps=30"])
    assert lines[0] == "seven: step 30 of 30"
    assert f"  checkpoints    {run_dir}/checkpoints/ (newest: step 30)" in lines
    assert f"  metrics        {run_dir}/metrics.jsonl" in lines  # the fixture's run writes no TensorBoard
    assert "  rollouts       none logged (train.log_rollouts=N logs every N-th step)" in lines
    assert lines[lines.index("next:") + 1 :] == [
        f"  marljax eval {config} train.steps=30",
        f"  marljax plot {run_dir}",
        f"  marljax export {run_dir} --policy main OUT_DIR",
    ]


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_and_says_so(grpo_run, tmp_path):
    import shutil

    from marljax.train.checkpoint import RunCheckpointer

    trainer, shared_run = grpo_run
    run_dir = tmp_path / "run"  # a copy: other tests restore the shared run's step 30
    shutil.copytree(shared_run, run_dir)
    step_dir = run_dir / "checkpoints" / "30" / "main"
    biggest = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = biggest.read_bytes()
    biggest.write_bytes(data[: len(data) // 2])
    with pytest.warns(RuntimeWarning, match="30"):
        got = RunCheckpointer(run_dir, ["main"]).restore(
            {"main": trainer.policies["main"].state.restore_target()}
        )
    assert got is not None and got[0] == 20
    assert int(got[1]["main"]["version"]) == 20 and got[2]["step"] == 20


def test_cli_config_error_names_the_key_and_file(tmp_path):
    path = tmp_path / "bad.yaml"
    cfg = (
        yaml.safe_load(Path("configs/grpo_tiny.yaml").read_text())
        if Path("configs/grpo_tiny.yaml").exists()
        else None
    )
    assert cfg is not None, "run from the repository root"
    cfg["policies"]["main"]["optimizer"]["lrr"] = 1e-3
    path.write_text(yaml.safe_dump(cfg))
    res = run_cli("train", str(path), timeout=120)
    assert res.returncode == 2
    assert "policies.main.optimizer.lrr" in res.stderr and str(path) in res.stderr
    res = run_cli("train", "configs/grpo_tiny.yaml", "train.steps=many", timeout=120)
    assert res.returncode == 2 and "train.steps" in res.stderr


def test_cli_data_error_names_file_and_line(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n" + '{"problem": "oops"\n')
    res = run_cli(
        "train",
        "configs/grpo_tiny.yaml",
        f"run_dir={tmp_path / 'run'}",
        f"data.source={{kind: jsonl, train: {data}}}",
        timeout=300,
    )
    assert res.returncode == 2
    assert f"{data}:2" in res.stderr


@pytest.mark.slow
def test_plot_and_eval_commands_on_a_finished_run(grpo_run):
    trainer, run_dir = grpo_run
    res = run_cli("plot", str(run_dir))
    assert res.returncode == 0, res.stderr
    for name in ("reward", "pass_rate", "entropy"):
        png = run_dir / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = run_cli("eval", str(run_dir.parent / "seven.yaml"))
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["step"] == 30
    # the CLI restores step 30 and scores greedily: the same as the live trainer at step 30
    assert report["eval/solver/pass_at_1"] == trainer.evaluate()["eval/solver/pass_at_1"]


@pytest.mark.slow
def test_sft_warm_start_lowers_the_nll_of_reference_solutions(tmp_path):
    from marljax.train.loop import Trainer

    cfg = config_from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "policies": {
                "main": {
                    "model": {"preset": "tiny-llama"},
                    "optimizer": {"lr": 3e-3},
                    "reference": True,
                    "loss": {"kl_coef": 0.01},
                    "micro_batch_size": 8,
                }
            },
            "agents": {"coder": {"policy": "main"}},
            "data": {"source": {"kind": "synthetic", "n_train": 8, "difficulty": 1}, "batch_size": 4},
            "sampler": {"max_new_tokens": 8},
            "train": {"steps": 1, "sft_steps": 25, "log_to": [], "progress": False},
        }
    )
    trainer = Trainer(cfg)
    trainer.run()
    nll = [r["sft/main/nll"] for r in read_metrics(tmp_path / "run") if "sft/main/nll" in r]
    assert len(nll) == 25 and nll[-1] < 0.5 * nll[0], nll
    policy = trainer.policies["main"]
    # RL restarts the optimiser's step count after SFT: 16 samples / threshold 8 = 2 updates
    assert policy.state.step == policy.version == 2
    # the warm start is kept as step 0 beside the run's last step: the weights RL's KL held to
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["0", "1"]
    warm = Trainer(cfg)
    # a step the run does not keep is an error that leaves the trainer's states as they were
    initial = leaves(warm.policies["main"].state.params)
    with pytest.raises(FileNotFoundError, match=r"steps kept: 0, 1\)"):
        warm.restore(step=5)
    for got, want in zip(leaves(warm.policies["main"].state.params), initial):
        np.testing.assert_array_equal(got, want)
    assert warm.restore(step=0) and warm.step == 0 and warm.policies["main"].version == 0
    for got, want in zip(leaves(warm.policies["main"].state.params), leaves(policy.state.ref_params)):
        np.testing.assert_array_equal(got, want)
    assert any(np.any(a != b) for a, b in zip(leaves(policy.state.params), leaves(policy.state.ref_params)))
    warm.close()
    trainer.close()


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]
