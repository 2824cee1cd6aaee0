"""Fixtures for tests, benchmarks and the demo: random checkpoints and tokenizers of the registered
model families (`marljax.models.families`). Production code does not import this package; the demo
does, to write its random checkpoints.

- `tiny`: torch-free tiny models and Hugging Face checkpoints (`write_random_checkpoint`);
- `parity`: tiny checkpoints written by transformers' own torch models (`make_tiny_checkpoint`,
  `CASES`, `torch_logits`), the independent reference of the parity tests; needs torch;
- `real_shapes`: random checkpoints with the shapes, tokenizers and chat markup of real models.
"""

from marljax.models.tokenizer import EOS_ID, IM_START_ID, PAD_ID
from marljax.testing.parity import CASES, make_tiny_checkpoint, torch_logits
from marljax.testing.tiny import FAMILIES, hf_config, random_model, write_random_checkpoint

__all__ = [
    "CASES",
    "EOS_ID",
    "FAMILIES",
    "IM_START_ID",
    "PAD_ID",
    "hf_config",
    "make_tiny_checkpoint",
    "random_model",
    "torch_logits",
    "write_random_checkpoint",
]
