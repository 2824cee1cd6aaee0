"""Tiny random models, Hugging Face checkpoints and tokenizers, without torch.

For the demo, the presets and the benchmarks: weights are drawn on the host
with numpy and written by marljax's own safetensors writer (`save_pretrained`),
so nothing here needs more than the base install.

    from marljax.models.tiny import write_random_checkpoint
    path = write_random_checkpoint(tmp_path / "qwen3", "qwen3", num_key_value_heads=1)
    model, config = marljax.models.from_pretrained(path)
    tok = marljax.models.load_tokenizer(path)   # ChatML chat template included

`marljax.models.testing` adds checkpoints written by transformers' own torch
models, an independent reference for the parity tests.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES = ("qwen2", "qwen3", "llama")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
PAD_ID, IM_START_ID, EOS_ID = 0, 1, 2

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

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

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # Qwen2/2.5: q/k/v biases, untied embeddings by default
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], tie_word_embeddings=False, rope_theta=10000.0),
    # Qwen3: q/k RMSNorm, head_dim (32) != hidden_size / heads (16), tied embeddings
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"], head_dim=32, tie_word_embeddings=True, rope_theta=1000000.0
    ),
    # Llama 3.x: llama3 rope scaling whose bands fall inside the tiny head_dim
    "llama": dict(
        architectures=["LlamaForCausalLM"],
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
}

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Agents cooperate: the coder writes, the tester checks, the reviewer decides.",
    "1 + 1 = 2, 2 * 3 = 6, 10 / 4 = 2.5",
    "for i in range(10):\n    print(i * i)\n",
    "Question: what is the capital of France? Answer: Paris.",
] * 4


def hf_config(family: str = "qwen3", **overrides: Any):
    """The transformers config of a tiny `family` model; `overrides` are HF config keys."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    kwargs = {**_BASE, **FAMILY_DEFAULTS[family], **overrides}
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


def make_tokenizer(
    path: str | os.PathLike | None = None, vocab_size: int = 320, corpus: Sequence[str] | None = None
):
    """A byte-level BPE `PreTrainedTokenizerFast` with ChatML specials and chat template.

    Ids: `<|endoftext|>` = 0 (pad), `<|im_start|>` = 1, `<|im_end|>` = 2 (eos);
    `vocab_size` <= 512 fits every tiny model. BPE merges are learnt from
    `corpus` (default: a few generic lines). Saved to `path` when given
    (loadable with `transformers.AutoTokenizer.from_pretrained(path)`).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS if corpus is None else corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    if path is not None:
        fast.save_pretrained(str(path))
    return fast
