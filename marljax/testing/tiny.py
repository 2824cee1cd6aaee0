"""Tiny random models, Hugging Face checkpoints and tokenizers, without torch.

For the demo, the tests and the benchmarks: weights are drawn on the host with numpy and written
by marljax's own safetensors writer (`save_pretrained`), so nothing here needs more than the base
install.

    from marljax.testing import write_random_checkpoint
    path = write_random_checkpoint(tmp_path / "qwen3", "qwen3", num_key_value_heads=1)
    model, config = marljax.models.from_pretrained(path)
    tok = marljax.models.load_tokenizer(path)   # ChatML chat template included

A family's tiny checkpoint is its record's `tiny_checkpoint` keys (`marljax.models.families`)
over the common tiny sizes below. `marljax.testing.parity` adds checkpoints written by
transformers' own torch models, an independent reference for the parity tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from marljax.models import families
from marljax.models.tokenizer import EOS_ID, PAD_ID, make_tokenizer

FAMILIES = tuple(families.FAMILIES)  # the registered model types

# HF config keys every tiny checkpoint shares
_BASE: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)


def hf_config(family: str = "qwen3", **overrides: Any):
    """The transformers config of a tiny `family` model; `overrides` are HF config keys."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    record = families.FAMILIES[family]
    kwargs = {**_BASE, "architectures": [record.architecture], **record.tiny_checkpoint, **overrides}
    return transformers.AutoConfig.for_model(family, **kwargs)


def random_model(config, *, seed: int = 0, std: float = 0.15):
    """A `Decoder` for `config` (a `ModelConfig` or preset name) with random weights
    drawn on the host with numpy (no compilation, no torch): matrices N(0, std),
    biases N(0, 0.1), norm weights 1 + N(0, 0.1) -- so logits are of order 1.
    """
    import jax
    from flax import nnx

    from marljax.models.config import ModelConfig
    from marljax.models.decoder import abstract_model

    if isinstance(config, str):
        config = ModelConfig.preset(config)
    graphdef, state = nnx.split(abstract_model(config))
    rng = np.random.default_rng(seed)
    flat = nnx.to_flat_state(state)
    for key, var in flat:
        sds, name = var.get_value(), str(key[-1])
        if "norm" in name:
            x = 1.0 + 0.1 * rng.standard_normal(sds.shape)
        elif name.startswith("b"):
            x = 0.1 * rng.standard_normal(sds.shape)
        else:
            x = std * rng.standard_normal(sds.shape)
        var.set_value(jax.numpy.asarray(x.astype(np.float32)).astype(sds.dtype))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def write_random_checkpoint(
    path: str | os.PathLike,
    family: str = "qwen3",
    *,
    seed: int = 0,
    std: float = 0.15,
    dtype: str = "float32",
    tokenizer: bool = True,
    **overrides: Any,
) -> Path:
    """Write a random tiny `family` Hugging Face checkpoint (+ tokenizer) to `path` and return it.

    family: "qwen2" | "qwen3" | "llama". overrides: HF config keys, e.g.
    `num_key_value_heads=1`, `tie_word_embeddings=True`. Weights as in
    `random_model`; dtype: "float32" | "bfloat16" (the saved weight dtype).
    Deterministic in `seed`. Loadable by transformers as written.
    """
    from marljax.models.config import ModelConfig
    from marljax.models.hf_io import save_pretrained

    config = ModelConfig.from_hf(hf_config(family, **overrides), dtype=dtype, param_dtype=dtype)
    save_pretrained(random_model(config, seed=seed, std=std), path)
    if tokenizer:
        make_tokenizer(path)
    return Path(path)
