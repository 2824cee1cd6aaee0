"""An adapter policy exports as a PEFT adapter that `peft` loads on the transformers base model with
the logits marljax computes, or merged into a full checkpoint that transformers loads alone."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from marljax.train.config import PolicyConfig
from marljax.train.policy import Policy
from marljax.workflows.types import Rows

torch = pytest.importorskip("torch", reason="the reference models are transformers' torch models")
peft = pytest.importorskip("peft", reason="peft is the reference loader of exported adapters (test extra)")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def trained(checkpoint):
    path = checkpoint("qwen2-untied-gqa2")  # q/k/v biases, untied head
    cfg = PolicyConfig.model_validate(
        {
            "model": {"path": str(path)},
            "lora": {"rank": 4, "alpha": 16, "targets": ["q", "k", "v", "o", "gate", "up", "down"]},
            "micro_batch_size": 4,
            "optimizer": {"lr": 5e-2},
        }
    )
    policy = Policy("p", cfg)
    rng = np.random.default_rng(0)
    for _ in range(3):  # enough Adam steps that a and b both move
        drawn = [(rng.integers(3, 200, 6), rng.integers(3, 200, 5)) for _ in range(4)]
        policy.update(
            Rows(
                [p for p, _ in drawn],
                [c for _, c in drawn],
                [np.full(5, -4.0, np.float32)] * 4,
                advantage=[1.0, -1.0, 0.5, -0.5],
                agent="p",
            )
        )
    return path, policy


def _marljax_logits(policy, ids):
    from marljax.models import forward

    logits, _ = jax.jit(forward, static_argnames="config")(
        policy.learner.model_params(policy.params), ids, config=policy.config
    )
    return np.asarray(logits)


def test_peft_loads_the_adapter_with_equal_logits(trained, tmp_path):
    base_path, policy = trained
    out = policy.export(tmp_path / "adapter", tokenizer=False)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["base_model_name_or_path"]) == (4, 16.0, str(base_path))
    ids = np.random.default_rng(1).integers(3, 200, (2, 11))
    ours = _marljax_logits(policy, ids)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    with torch.no_grad():
        plain = base(torch.as_tensor(ids)).logits.numpy()
        model = peft.PeftModel.from_pretrained(base, out)
        theirs = model(torch.as_tensor(ids)).logits.numpy()
    assert np.abs(plain - ours).max() > 1e-2  # the adapter moved the model away from the base
    np.testing.assert_allclose(theirs, ours, atol=2e-4, rtol=0)


def test_merged_export_is_a_full_checkpoint_with_equal_logits(trained, tmp_path):
    _, policy = trained
    out = policy.export(tmp_path / "merged", tokenizer=False, merged=True)
    ids = np.random.default_rng(2).integers(3, 200, (2, 9))
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        theirs = model(torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, _marljax_logits(policy, ids), atol=2e-4, rtol=0)
