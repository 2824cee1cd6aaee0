"""The memory estimate against the real arrays of a policy, and its printout at Trainer start."""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import pytest

from marljax.models.config import ModelConfig
from marljax.train.config import PolicyConfig, load_config
from marljax.train.memory import estimate, policy_estimate
from marljax.train.policy import Policy

ROOT = Path(__file__).resolve().parents[2]


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


@pytest.mark.parametrize(
    "optimizer, param_dtype", [("adamw", "float32"), ("sgd", "float32"), ("adam", "bfloat16")]
)
def test_parameter_and_optimizer_bytes_are_the_real_ones(optimizer, param_dtype):
    cfg = PolicyConfig.model_validate(
        {
            "model": {"preset": "tiny-llama", "param_dtype": param_dtype},
            "optimizer": {"name": optimizer},
            "reference": True,
        }
    )
    pol = Policy("p", cfg)
    est = policy_estimate(pol, seq_len=64)
    assert est.params == est.total_params == nbytes(pol.params)
    assert est.reference == nbytes(pol.ref_params)
    # optax adds a few step counters (int32 scalars) besides the moments
    assert 0 <= nbytes(pol.opt_state) - est.optimizer <= 16
    assert est.optimizer == (0 if optimizer == "sgd" else 2 * nbytes(pol.params))
    assert est.gradients == 2 * est.params and est.sampler_copy == 0


def test_activations_shrink_with_remat_and_micro_batches():
    cfg = ModelConfig.preset("qwen3-0.6b", dtype="bfloat16", param_dtype="bfloat16")
    big = estimate(cfg, micro_batch_size=8, seq_len=2048, remat=False)
    remat = estimate(cfg, micro_batch_size=8, seq_len=2048, remat=True)
    small = estimate(cfg, micro_batch_size=2, seq_len=2048, remat=False)
    sharded = estimate(cfg, mesh_shape={"fsdp": 4, "tensor": 2}, micro_batch_size=8, seq_len=2048)
    assert remat.activations < big.activations / 4 and remat.activations_alt == big.activations
    assert small.activations * 3 < big.activations
    assert 0.5e9 < big.total_params < 1.5e9  # about 0.6 B parameters, 2 bytes each
    assert sharded.params < big.params / 6 and sharded.rows == 2  # 8 rows over fsdp=4
    text = big.report("adamw", device_limit=16 * 2**30)
    for word in (
        "parameters",
        "optimizer (adamw, 2 moments)",
        "remat off",
        "DOES NOT FIT",
        ".model.remat",
        ".micro_batch_size",
        ".mesh.fsdp",
    ):
        assert word in text, (word, text)


def test_trainer_prints_the_estimate_at_start(tmp_path, caplog):
    from marljax.train.loop import Trainer

    cfg = load_config(ROOT / "configs" / "grpo_tiny.yaml", [f"run_dir={tmp_path}"])
    with caplog.at_level(logging.INFO, logger="marljax.train.loop"):
        trainer = Trainer(cfg)
    trainer.close()
    text = caplog.text
    assert "memory estimate, policy 'main'" in text and "policies.main.model.remat" in text, text
    seq = cfg.sampler.max_prompt_len + cfg.sampler.max_new_tokens
    assert f"{cfg.policies['main'].micro_batch_size} rows x {seq} tokens" in text, text


def test_sampler_kv_cache_is_what_the_engine_allocates_for_its_slots():
    from marljax.sampler import get_engine

    cfg = ModelConfig.preset("tiny-qwen3")
    est = estimate(cfg, seq_len=48, sampler_slots=4)
    state = get_engine(cfg).empty_state(4, 48, 4)
    assert est.kv_cache == nbytes(state.kv) == 4 * est.kv_per_sequence
    assert "sampler KV cache" in est.report() and "4 slots" in est.report()
    # over 2 data-parallel devices each holds half the slots
    assert estimate(cfg, seq_len=48, sampler_slots=4, mesh_shape={"data": 2}).kv_cache == est.kv_cache // 2
