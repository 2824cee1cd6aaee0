"""Tiny random Hugging Face checkpoints written by transformers, for the parity tests.

These helpers use transformers' own torch models to write checkpoints (so a
checkpoint is an independent reference, not marljax's own output) and need
`torch` (a test-only dependency); it is imported only when they are called.
Torch-free models, checkpoints and tokenizers are in `marljax.testing.tiny`.

    from marljax.testing import make_tiny_checkpoint
    path = make_tiny_checkpoint(tmp_path / "qwen3", family="qwen3", num_key_value_heads=1)
    model, config = marljax.models.from_pretrained(path)
    tok = marljax.models.load_tokenizer(path)   # ChatML chat template included

Weights are drawn with a larger scale than transformers' init (`std`), so
attention is not uniform and logits are of order 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from marljax.models import families
from marljax.models.tokenizer import make_tokenizer
from marljax.testing.tiny import hf_config

# Named tiny checkpoints (for `make_tiny_checkpoint(path, *CASES[name])`): each family's
# `parity_cases`, name -> (family, HF config overrides).
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    name: (family.model_type, dict(overrides))
    for family in families.FAMILIES.values()
    for name, overrides in family.parity_cases.items()
}


def make_tiny_checkpoint(
    path: str | os.PathLike,
    family: str = "qwen3",
    *,
    seed: int = 0,
    std: float = 0.15,
    dtype: str = "float32",
    tokenizer: bool = True,
    **overrides: Any,
) -> Path:
    """Write a random tiny `family` checkpoint (+ tokenizer) to `path` and return it.

    family: "qwen2" | "qwen3" | "llama". overrides: HF config keys, e.g.
    `num_key_value_heads=1`, `tie_word_embeddings=True`, `attention_bias=True`,
    `rope_scaling={"rope_type": "linear", "factor": 2.0}`. Matrices get N(0, std),
    biases N(0, 0.1), norm weights 1 + N(0, 0.1). dtype: "float32" | "bfloat16"
    (the saved weight dtype). Deterministic in `seed`. Needs torch.
    """
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = hf_config(family, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(path))
    if tokenizer:
        make_tokenizer(path)
    return path


def torch_logits(path: str | os.PathLike, input_ids, attention_mask=None, position_ids=None) -> np.ndarray:
    """Reference float32 logits `[B, T, V]` from transformers (torch, CPU, eager attention)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    ).eval()

    def t(x):
        return None if x is None else torch.tensor(np.array(x), dtype=torch.long)

    with torch.no_grad():
        out = model(input_ids=t(input_ids), attention_mask=t(attention_mask), position_ids=t(position_ids))
    return out.logits.float().numpy()
