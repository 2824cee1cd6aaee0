"""ModelConfig: HF config in/out, validation errors, rotary frequencies vs transformers."""

from __future__ import annotations

import numpy as np
import pytest

from marljax import testing
from marljax.models import PRESETS, ModelConfig, inverse_frequencies


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_round_trips_through_hf_config(name):
    cfg = PRESETS[name]
    hash(cfg)  # usable as a static jit argument
    again = ModelConfig.from_hf(cfg.to_hf_config())
    assert again == cfg


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_from_hf_reads_family_switches(family):
    cfg = ModelConfig.from_hf(testing.hf_config(family))
    assert cfg.qkv_bias == (family == "qwen2") and cfg.o_bias is False
    assert cfg.qk_norm == (family == "qwen3")
    assert cfg.head_dim == (32 if family == "qwen3" else 16)
    assert cfg.rope_type == ("llama3" if family == "llama" else "default")
    assert cfg.tie_word_embeddings == (family == "qwen3")


def test_transformers_v4_style_rope_keys():
    d = testing.hf_config("llama").to_dict()
    d.pop("rope_parameters", None)
    d.update(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 4.0})
    cfg = ModelConfig.from_hf(d)
    assert (cfg.rope_theta, cfg.rope_type, cfg.rope_factor) == (500000.0, "linear", 4.0)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(architectures=["MistralForCausalLM"]), "MistralForCausalLM"),
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(mlp_bias=True), "mlp_bias"),
        (dict(use_sliding_window=True), "use_sliding_window"),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}), "'yarn'"),
        (dict(rope_parameters={"rope_type": "llama3", "factor": 2.0, "rope_theta": 1e4}), "low_freq_factor"),
        (dict(num_key_value_heads=3), "num_kv_heads"),
        (dict(vocab_size=None), "vocab_size"),
    ],
)
def test_unsupported_hf_configs_name_the_key(change, match):
    d = {**testing.hf_config("llama").to_dict(), **change}
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(d)


def test_field_validation():
    with pytest.raises(ValueError, match="dtype"):
        PRESETS["tiny-qwen3"].replace(dtype="float8")
    with pytest.raises(ValueError, match="remat"):
        PRESETS["tiny-qwen3"].replace(remat="sometimes")
    with pytest.raises(ValueError, match="scan_layers"):
        PRESETS["tiny-qwen3"].replace(scan_layers="no")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        PRESETS["tiny-qwen3"].replace(heads=3)
    with pytest.raises(ValueError, match="unknown preset"):
        ModelConfig.preset("gpt-5")


@pytest.mark.parametrize(
    "rope",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_inverse_frequencies_match_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = testing.hf_config(
        "llama", head_dim=64, rope_scaling=rope, rope_theta=500000.0, max_position_embeddings=1024
    )
    cfg = ModelConfig.from_hf(hf)
    if rope is None:
        want = 1.0 / (500000.0 ** (np.arange(0, 64, 2) / 64))
    else:
        want, attention_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf, "cpu")
        want = want.numpy()
        assert attention_factor == 1.0
    got = inverse_frequencies(cfg)
    assert got.shape == (32,) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)
    if rope is not None:  # scaling really changed something
        assert not np.allclose(got, 1.0 / (500000.0 ** (np.arange(0, 64, 2) / 64)), rtol=1e-3)


def test_num_params_matches_parameter_count():
    import jax

    from marljax.testing import random_model

    for name in ("tiny-qwen2", "tiny-qwen3", "tiny-llama"):
        model = random_model(name)
        from flax import nnx

        n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        assert n == PRESETS[name].num_params(), name


def test_each_registered_family_is_supported_once_with_a_tiny_preset_and_parity_cases():
    from marljax.models import SUPPORTED_ARCHITECTURES, families

    assert {f.architecture: f.model_type for f in families.FAMILIES.values()} == SUPPORTED_ARCHITECTURES
    for family in families.FAMILIES.values():
        assert f"tiny-{family.model_type}" in family.presets and family.parity_cases
        assert families.by_architecture(family.architecture) is family
        with pytest.raises(ValueError, match="registered already"):
            families.register(family)
    assert set(testing.CASES) == {n for f in families.FAMILIES.values() for n in f.parity_cases}


def test_auto_attention_is_cudnn_on_a_gpu_where_its_kernel_takes_the_shape():
    from marljax.models.config import platform_attention

    assert platform_attention("bfloat16", 64, "gpu") == "cudnn"
    assert platform_attention("float16", 128, "gpu") == "cudnn"
    assert platform_attention("float32", 64, "gpu") is None  # cuDNN's flash kernel is half precision only
    assert platform_attention("bfloat16", 12, "gpu") is None  # head dim not a multiple of 8
    assert platform_attention("bfloat16", 512, "gpu") is None  # over its 256
    assert platform_attention("bfloat16", 64, "cpu") is None
    assert platform_attention("bfloat16", 64, "tpu") is None


def test_auto_attention_is_resolved_for_the_default_backend_when_the_config_is_made(monkeypatch):
    import jax

    assert ModelConfig.preset("tiny-qwen2", dtype="bfloat16", attention_impl="auto").attention_impl is None
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert ModelConfig.preset("tiny-qwen2", dtype="bfloat16", attention_impl="auto").attention_impl == "cudnn"
    assert ModelConfig.preset("tiny-qwen2", dtype="float32", attention_impl="auto").attention_impl is None
    # a choice made in the config is kept
    assert ModelConfig.preset("tiny-qwen2", dtype="bfloat16", attention_impl="xla").attention_impl == "xla"


def test_a_run_config_asks_for_the_platforms_attention_by_default():
    from marljax.train.config.schema import PolicyModelConfig

    assert PolicyModelConfig(preset="tiny-qwen2").attention_impl == "auto"
