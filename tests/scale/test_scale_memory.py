"""The memory estimate against the real arrays of a policy, and its printout at Trainer start."""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import pytest

from marljax.models.config import REMAT_POLICIES, ModelConfig
from marljax.models.lora import LoraSpec
from marljax.train.config import PolicyConfig, load_config
from marljax.train.memory import (
    adapter_bytes,
    estimate,
    param_bytes,
    policy_estimate,
    sampling_bytes,
    team_bytes,
)
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
    assert est.reference == nbytes(pol.state.ref_params)
    # optax adds a few step counters (int32 scalars) besides the moments
    assert 0 <= nbytes(pol.state.opt_state) - est.optimizer <= 16
    assert est.optimizer == (0 if optimizer == "sgd" else 2 * nbytes(pol.params))
    assert est.gradients == 2 * est.params and est.sampler_copy == 0


def test_activations_shrink_with_remat_and_micro_batches():
    cfg = ModelConfig.preset("qwen3-0.6b", dtype="bfloat16", param_dtype="bfloat16")
    big = estimate(cfg, micro_batch_size=8, seq_len=2048, remat="none")
    remat = estimate(cfg, micro_batch_size=8, seq_len=2048, remat="full")
    small = estimate(cfg, micro_batch_size=2, seq_len=2048, remat="none")
    assert estimate(cfg, micro_batch_size=8, seq_len=2048, remat=True).activations == remat.activations
    sharded = estimate(cfg, mesh_shape={"fsdp": 4, "tensor": 2}, micro_batch_size=8, seq_len=2048)
    assert remat.activations < big.activations / 4 and remat.activations_alt == big.activations
    assert small.activations * 3 < big.activations
    assert 0.5e9 < big.total_params < 1.5e9  # about 0.6 B parameters, 2 bytes each
    assert sharded.params < big.params / 6 and sharded.rows == 2  # 8 rows over fsdp=4
    text = big.report("adamw", device_limit=16 * 2**30)
    for word in (
        "parameters",
        "optimizer (adamw, 2 moments)",
        "with remat none",
        "DOES NOT FIT",
        ".model.remat",
        ".micro_batch_size",
        ".mesh.fsdp",
    ):
        assert word in text, (word, text)


def test_named_remat_policies_save_what_they_name():
    # tiny-llama: D 64, F 128, 4 query heads and 2 kv heads of 16, float32; 2 layers
    cfg = ModelConfig.preset("tiny-llama")
    rows, T = 2, 64
    e = {r: estimate(cfg, micro_batch_size=rows, seq_len=T, remat=r) for r in REMAT_POLICIES}
    assert e["full"].activations < e["save_qkv_proj"].activations < e["dots"].activations
    assert e["dots"].activations < e["minimal"].activations < e["none"].activations
    per_token = {  # values saved per token and layer (memory.py's doc)
        "full": 64,
        "save_qkv_proj": 64 + (4 + 2 * 2) * 16,
        "dots": 3 * 64 + (4 + 2 * 2) * 16 + 2 * 128,
        "minimal": 3 * 64 + (4 + 2 * 2) * 16 + 2 * 128 + 4 * 16,
    }
    for r, values in per_token.items():
        # the policies differ only in what the layers keep: layers x rows x T x values x 4 bytes
        assert e[r].activations - e["full"].activations == 2 * rows * T * (values - 64) * 4, r
        assert e[r].remat == r and e[r].activations_alt == e["none"].activations
    assert e["none"].activations_alt == e["full"].activations
    # rows split over data x fsdp: 8 rows on data=4 keep what 2 rows keep on one device
    assert estimate(cfg, micro_batch_size=8, seq_len=T, remat="dots", mesh_shape={"data": 4}).activations == (
        e["dots"].activations
    )
    # the backward pass holds the larger of one layer's recompute and the loss head; on fsdp=4 the
    # head also holds the gathered embedding (twice, float32 compute here) and its float32 gradient
    layer = rows * T * (4 * (4 * 64 + (3 * 4 + 4 * 2) * 16 + 4 * 128) + 4 * 2 * 4 * T)
    head = 2 * rows * 256 // 4 * 512 * 4 + 2 * rows * T * 64 * 4  # chunks of min(256, T) = 64
    assert layer > head  # so one device holds one layer's recompute ...
    fsdp = estimate(cfg, micro_batch_size=8, seq_len=T, remat="dots", mesh_shape={"fsdp": 4})
    gathered = 512 * 64 * (2 * 4 + 4)
    assert head + gathered > layer  # ... and on fsdp=4 the head with the gathered embedding
    assert fsdp.activations - e["dots"].activations == head + gathered - layer
    with pytest.raises(ValueError, match="remat must be one of"):
        estimate(cfg, remat="some")


def test_trainer_prints_the_estimate_at_start(tmp_path, caplog):
    from marljax.train.loop import Trainer

    cfg = load_config(ROOT / "configs" / "grpo_tiny.yaml", [f"run_dir={tmp_path}"])
    with caplog.at_level(logging.INFO, logger="marljax.train.loop"):
        trainer = Trainer(cfg)
    trainer.close()
    # one line at the info level (a CPU reports no device memory: nothing to fit against)
    lines = [r.getMessage() for r in caplog.records if "memory estimate" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert (
        lines[0].startswith("memory estimate, policy 'main': peak ~") and "per device (resident" in lines[0]
    )
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="marljax.train.loop"):
        trainer = Trainer(cfg)
    trainer.close()
    text = caplog.text  # the breakdown at the debug level
    assert "memory estimate, policy 'main'" in text and "policies.main.model.remat" in text, text
    seq = cfg.sampler.max_prompt_len + cfg.sampler.max_new_tokens
    assert f"{cfg.policies['main'].micro_batch_size} rows x {seq} tokens" in text, text


def test_sampler_kv_cache_is_what_the_engine_allocates_for_its_slots():
    from marljax.sampler import get_engine

    cfg = ModelConfig.preset("tiny-qwen3")
    est = estimate(cfg, seq_len=48, sampler_slots=4)
    state = get_engine(cfg).empty_state(4, 48, 4)
    assert est.kv_cache == nbytes(state.kv) == 4 * est.kv_per_sequence
    assert "KV cache" in est.report() and "4 slots" in est.report()
    # over 2 data-parallel devices each holds half the slots
    assert estimate(cfg, seq_len=48, sampler_slots=4, mesh_shape={"data": 2}).kv_cache == est.kv_cache // 2


# the tiny config's terms by hand: 2 layers, 2 kv heads of 32, vocabulary 512, float32 storage
TINY_KV = 2 * 2 * 48 * 2 * 32 * 4  # keys and values x layers x positions x kv heads x head dim x bytes
TINY_LOGITS = 512 * 4  # one slot's float32 logits


def test_gradients_are_one_update_s_not_resident_state():
    cfg = ModelConfig.preset("tiny-qwen3")
    p = param_bytes(cfg)[1]
    e = estimate(cfg, micro_batch_size=2, seq_len=48, sampler_slots=4, platform="cpu")
    assert (e.params, e.optimizer, e.gradients) == (p, 2 * p, 2 * p)
    assert e.state == 3 * p  # parameters and two AdamW moments; no gradients
    assert e.update == 2 * p + e.activations  # float32 on float32: no compute copies
    assert e.sampling == 4 * TINY_KV + 4 * TINY_LOGITS  # no weight copies either
    assert e.update > e.sampling and e.peak == 3 * p + e.update
    # two full policies on one device: both states, one update's gradients and activations
    assert team_bytes([e, e]) == 2 * 3 * p + 2 * p + e.activations
    assert team_bytes([e] * 8) == 8 * 3 * p + 2 * p + e.activations


def test_sampling_counts_weight_copies_kv_cache_and_logits():
    cfg = ModelConfig.preset("tiny-qwen3", dtype="bfloat16")  # float32 master weights
    p = param_bytes(cfg)[1]
    kv = TINY_KV // 2  # a bfloat16 cache
    gpu = estimate(cfg, seq_len=48, sampler_slots=4, platform="gpu")
    # one bfloat16 copy of the weights, the sampler's: p / 2 bytes
    assert gpu.sampling == p // 2 + 4 * kv + 4 * TINY_LOGITS
    assert gpu.compute_copy == 0  # the update's narrower casts are not counted
    # on CPU bfloat16 storage computes in float32: two float32 copies, 4 x the bfloat16 bytes
    cpu_bf16 = ModelConfig.preset("tiny-qwen3", dtype="bfloat16", param_dtype="bfloat16")
    b = param_bytes(cpu_bf16)[1]
    cpu = estimate(cpu_bf16, seq_len=48, sampler_slots=4, platform="cpu")
    assert b == p // 2 and cpu.sampling == 4 * b + 4 * kv + 4 * TINY_LOGITS
    assert cpu.compute_copy == 4 * b  # the update's float32 parameters and gradients
    # many slots: the sampling call is the larger phase, and the peak counts it
    wide = estimate(cfg, seq_len=48, sampler_slots=4096, platform="gpu")
    assert wide.sampling == p // 2 + 4096 * (kv + TINY_LOGITS) > wide.update
    assert (
        wide.peak == wide.state + wide.sampling and team_bytes([wide, wide]) == 2 * wide.state + wide.sampling
    )
    text = wide.report()
    for word in (
        "resident:",
        "update: gradients",
        "sampling: KV cache",
        "logits",
        "compute-dtype weight copies",
    ):
        assert word in text, (word, text)
    assert "the larger phase: sampling" in text


def test_adapters_on_one_base_sample_with_the_base_s_copies_once():
    cfg = ModelConfig.preset("tiny-qwen3", dtype="bfloat16")
    base = param_bytes(cfg)[1]
    spec = LoraSpec(rank=4, alpha=8)
    a = adapter_bytes(cfg, spec)
    kv = TINY_KV // 2

    def adapter(key):  # 1024 slots: a sampling call larger than an update
        return estimate(cfg, seq_len=48, sampler_slots=1024, platform="gpu", lora=spec, base_key=key)

    e = adapter("b")
    assert (e.state, e.base, e.update) == (3 * a + base, base, 2 * a + e.activations)
    # one sampling call of three adapters: them stacked, the base's one bfloat16 copy, the stacked
    # adapters' bfloat16 copies (the prefill's and the decode's: half the float32 bytes each), the
    # KV cache, the logits
    call = 3 * a + (base // 2 + 3 * a) + 1024 * (kv + TINY_LOGITS)
    assert sampling_bytes([e] * 3) == call
    assert call > e.update
    assert team_bytes([e] * 3) == 3 * 3 * a + base + call
    # another base: its own state and its own call (the larger of the two calls)
    assert team_bytes([e, e, adapter("c")]) == 3 * 3 * a + 2 * base + (
        2 * a + base // 2 + 2 * a + 1024 * (kv + TINY_LOGITS)
    )
