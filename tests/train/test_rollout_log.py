"""Rollout logs: a tiny run writes each logged step's samples, a resumed run rewrites the redone
steps as the uninterrupted run wrote them, and `marljax rollouts` prints them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from marljax.train import rollout_log
from marljax.train.config import ConfigError, config_from_dict

FIELDS = {
    "step", "agent", "policy", "version", "problem", "episode", "node", "parent", "depth", "turn",
    "reward", "advantage", "passed", "finish_reason", "temperature", "prompt_len", "completion_len",
    "prompt", "completion",
}  # fmt: skip


def tiny_config(tmp: Path, run_dir: Path, **train):
    data = tmp / "seven.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"q{k}", "problem": f"Question {k}: answer 7", "answer": "7"}) + "\n"
            for k in range(8)
        )
    )
    return config_from_dict(
        {
            "run_dir": str(run_dir),
            "policies": {
                "main": {
                    "model": {"preset": "tiny-qwen3"},
                    "optimizer": {"lr": 3e-3},
                    "buffer": {"threshold": 8},
                    "micro_batch_size": 8,
                }
            },
            "agents": {
                "solver": {"policy": "main", "template": "{problem}"}
            },  # the tokenizer's chat template applies
            "data": {"source": {"kind": "jsonl", "train": str(data)}, "batch_size": 2},
            "sampler": {"max_new_tokens": 8},
            "workflow": {"kind": "grpo", "group_size": 4},
            "train": {"steps": 3, "save_every": 2, "log_to": [], "progress": False, **train},
        }
    )


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """A 3-step run logging every step, with each step's rollout kept for comparison."""
    from marljax.train.loop import Trainer

    tmp = tmp_path_factory.mktemp("rlog")
    trainer = Trainer(tiny_config(tmp, tmp / "run", log_rollouts=1))
    rollouts, inner = [], trainer.workflow.rollout
    trainer.workflow.rollout = lambda *a, **kw: rollouts.append(inner(*a, **kw)) or rollouts[-1]
    trainer.run()
    return trainer, tmp, rollouts


@pytest.mark.slow
def test_each_step_logs_its_samples_as_the_model_saw_them(logged_run):
    trainer, tmp, rollouts = logged_run
    run_dir = tmp / "run"
    assert rollout_log.logged_steps(run_dir) == [1, 2, 3] and len(rollouts) == 3
    assert sorted(p.name for p in (run_dir / "rollouts").iterdir()) == [
        f"step_00000{s}.jsonl" for s in (1, 2, 3)
    ]
    tok = trainer.policies["main"].turns.tokenizer
    for step, rollout in enumerate(rollouts, 1):
        records = rollout_log.read_step(run_dir, step)
        assert len(records) == len(rollout) == 8
        rows = rollout.rows
        for i, (r, gen, ids) in enumerate(zip(records, rollout.generations, rollout.ids)):
            assert set(r) == FIELDS and r["step"] == step
            assert r["prompt"].startswith("<|im_start|>user\nQuestion ") and r["prompt"].endswith(
                "assistant\n"
            )
            assert r["prompt"] == tok.decode(rows.prompt_ids[i], skip_special_tokens=False)
            np.testing.assert_array_equal(tok(r["prompt"])["input_ids"], rows.prompt_ids[i])
            assert r["completion"] == tok.decode(rows.completion_ids[i], skip_special_tokens=False)
            assert (r["prompt_len"], r["completion_len"]) == (
                len(rows.prompt_ids[i]),
                len(rows.completion_ids[i]),
            )
            assert (r["reward"], r["advantage"], r["passed"]) == (
                rows.reward[i],
                rows.advantage[i],
                rows.passed[i],
            )
            assert (r["agent"], r["policy"], r["version"]) == (rows.agent[i], rows.policy[i], rows.version[i])
            assert {k: r[k] for k in ids} == dict(ids)
            assert r["finish_reason"] == gen.finish_reason in ("eos", "stop", "length")


@pytest.mark.slow
def test_a_resumed_run_rewrites_the_redone_steps_as_the_uninterrupted_run(logged_run):
    from marljax.train.loop import Trainer

    _, tmp, _ = logged_run
    run_dir = tmp / "resumed"
    cfg = tiny_config(tmp, run_dir, log_rollouts=1)
    crashed = Trainer(cfg)
    inner = crashed.train_step

    def crash_after_step_3():
        metrics = inner()
        if crashed.step == 3:  # logged, not yet checkpointed (the newest checkpoint is step 2)
            raise KeyboardInterrupt
        return metrics

    crashed.train_step = crash_after_step_3
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    crashed.close()
    folder = run_dir / "rollouts"
    (folder / "step_000003.jsonl").write_text('{"step": 3, "stale": true}\n')
    (folder / "step_000007.jsonl").write_text('{"step": 7, "stale": true}\n')  # from an older, longer run
    (folder / "step_000003.jsonl.tmp").write_text('{"step": 3, "to')  # a write cut by the crash
    Trainer(cfg).run()
    reference = tmp / "run" / "rollouts"
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in reference.iterdir())
    for path in reference.iterdir():
        assert (folder / path.name).read_text() == path.read_text(), path.name


@pytest.mark.slow
def test_off_by_default(logged_run, tmp_path):
    from marljax.train.loop import Trainer

    _, tmp, _ = logged_run
    cfg = tiny_config(tmp, tmp_path / "run", steps=1)
    assert cfg.train.log_rollouts == 0
    Trainer(cfg).run()
    assert (tmp_path / "run" / "metrics.jsonl").is_file() and not (tmp_path / "run" / "rollouts").exists()


def test_negative_log_rollouts_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="train.log_rollouts"):
        tiny_config(tmp_path, tmp_path / "run", log_rollouts=-1)


@pytest.mark.slow
def test_viewer_prints_a_step_grouped_by_problem(logged_run, capsys):
    from marljax.cli import main

    _, tmp, rollouts = logged_run
    run_dir = str(tmp / "run")
    assert main(["rollouts", run_dir, "--step", "2"]) == 0
    out = capsys.readouterr().out
    records = rollout_log.read_step(run_dir, 2)
    assert out.startswith("step 2: 8 samples\n")
    for problem in {r["problem"] for r in records}:
        assert out.count(f"=== problem {problem}: 4 samples, mean reward ") == 1
    assert out.count("--- prompt (") == 2  # once per group
    assert out.count("--- solver (policy main v1) episode ") == 8
    for r in records:
        assert f"reward {r['reward']:.4g} advantage {r['advantage']:.4g}" in out
        assert f"{r['finish_reason']}, {r['completion_len']} tokens ---" in out
        assert rollout_log.printable(r["prompt"]) in out and rollout_log.printable(r["completion"]) in out
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out)  # a completion cannot drive the terminal

    assert main(["rollouts", run_dir, "--limit", "3"]) == 0  # the last logged step by default
    out = capsys.readouterr().out
    assert out.startswith("step 3: 8 samples, showing 3\n") and out.count("--- solver") == 3
    assert main(["rollouts", run_dir, "--agent", "nobody"]) == 0
    assert capsys.readouterr().out == "step 3: 0 samples\n"
    with pytest.raises(SystemExit, match="step 9 was not logged; logged steps: 1, 2, 3"):
        main(["rollouts", run_dir, "--step", "9"])
    with pytest.raises(SystemExit, match="no rollout logs"):
        main(["rollouts", str(tmp)])
