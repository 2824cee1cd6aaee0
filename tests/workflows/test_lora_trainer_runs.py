"""The shipped adapter-team config (`configs/mars2_lora_tiny.yaml`) trains through the real trainer:
three LoRA adapters on one frozen base held once, each updating from its own buffer, resumed
exactly from its checkpoint; the real-size config validates."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from marljax.train.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.slow(seconds=70)
def test_mars2_lora_tiny_config_trains_and_resumes(tmp_path):
    from marljax.train.loop import Trainer

    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "train.steps=2",
        "train.save_every=1",
        "train.eval_every=2",
        "train.log_to=[]",
        "train.progress=false",
        "sampler.max_new_tokens=16",
        "agents.carol.sampling.max_new_tokens=12",
        "data.batch_size=2",
        "data.source.n_eval=2",
        "workflow.max_nodes=6",  # nodes enough that each of the three agents gets some
        *(f"policies.{p}.buffer.threshold=2" for p in ("writer", "fixer", "tester")),
    ]
    cfg = load_config(CONFIGS / "mars2_lora_tiny.yaml", overrides)
    trainer = Trainer(cfg)
    base = trainer.policies["writer"].learner.frozen
    frozen = jax.tree.map(np.array, base)
    trainer.run()
    assert len(trainer.bases) == 1
    assert all(p.learner.frozen is base for p in trainer.policies.values())
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(frozen)):  # the base never changes
        np.testing.assert_array_equal(np.asarray(a), b)
    versions = {n: p.version for n, p in trainer.policies.items()}
    assert all(v >= 1 for v in versions.values()), (versions, {n: len(b) for n, b in trainer.buffers.items()})
    adapters = {n: jax.tree.map(np.array, p.params) for n, p in trainer.policies.items()}
    # an update with zero advantages everywhere (all nodes of a tree scored alike) leaves an adapter
    # as it was; across the three, the tiny task's rewards move some
    moved = {n: float(np.abs(a["wq"]["b"]).max()) for n, a in adapters.items()}
    assert any(m > 0 for m in moved.values()), moved

    again = Trainer(cfg)
    assert again.restore() and again.step == 2
    for n, p in again.policies.items():
        assert p.version == versions[n]
        for x, y in zip(jax.tree.leaves(p.params), jax.tree.leaves(adapters[n])):
            np.testing.assert_array_equal(np.asarray(x), y)
    again.close()
    trainer.close()


def test_mars2_lora_qwen_config_validates():
    cfg = load_config(CONFIGS / "mars2_lora_qwen.yaml")
    assert {p.lora.rank for p in cfg.policies.values()} == {16}
    assert len({p.model for p in cfg.policies.values()}) == 1  # one base for the team
