"""Random checkpoints with the shapes, tokenizers and chat markup of real instruct models.

For rehearsals at real scale without downloading anything (`benchmarks/bench_real.py`): the
weights are random, but the architecture, vocabulary size, special-token ids, chat template and
`generation_config.json` eos ids are those of the named model, so every code path that depends
on them (the embedding and loss head over the real vocabulary, chat prompts, turn-end tokens,
export) runs as it would with the real checkpoint.

    from marljax.testing.real_shapes import write_real_checkpoint
    path = write_real_checkpoint(tmp / "qwen", "qwen2.5-0.5b", num_hidden_layers=2)

Weights are drawn and written one layer at a time (one safetensors shard per layer), so writing
needs about one embedding matrix of host memory, not the whole model. Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from marljax.models import families
from marljax.models.tokenizer import CORPUS
from marljax.testing.tiny import hf_config

# name -> (family, HF config keys, generation_config.json): the registered families' real checkpoints
SHAPES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    name: (family.model_type, dict(real.config), dict(real.generation))
    for family in families.FAMILIES.values()
    for name, real in family.real_checkpoints.items()
}

_CODE = [
    "def solve(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total\n",
    "import sys\nx = int(sys.stdin.readline())\nprint(x * 2)\n",
    "Write a Python program that reads from stdin and prints the answer.",
    "You are a helpful assistant. Previous attempt failed on the public tests.",
]


def _filler(alphabet: list[str]):
    """Distinct byte-level strings (pairs, then triples of alphabet characters): they decode to bytes
    like real vocabulary entries, and no merge produces most of them."""
    for a in alphabet:
        for b in alphabet:
            yield a + b
    for a in alphabet:
        for b in alphabet:
            for c in alphabet:
                yield a + b + c


def make_family_tokenizer(family: str, path: str | os.PathLike | None = None):
    """A byte-level BPE `PreTrainedTokenizerFast` with `family`'s (a registered model type) special
    tokens at their real ids, its chat template and roles (eos, pad, bos); saved to `path` when given.

    Merges are learnt from a few lines of text and code; the regular vocabulary is then padded with
    filler entries up to the first special id, so `len(tokenizer)` is the real one (151,646 for
    Qwen2.5, 128,256 for Llama 3)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if family not in families.FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(families.FAMILIES)}")
    chat = families.FAMILIES[family].chat
    first, specials = chat.first_special_id, chat.specials
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1024, initial_alphabet=alphabet, show_progress=False)
    base.train_from_iterator(CORPUS + _CODE * 4, trainer=trainer)
    learnt = json.loads(base.to_str())["model"]
    vocab = dict(learnt["vocab"])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    fill = _filler(alphabet)
    while len(vocab) < first:
        s = next(fill)
        if s not in vocab:
            vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if (
        chat.bos_prefix
    ):  # e.g. Llama 3 prepends <|begin_of_text|> to plain text (its template writes it itself)
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A $B",
            special_tokens=[(specials[0], first)],
        )
    got = [tok.token_to_id(s) for s in specials]
    if got != list(range(first, first + len(specials))):  # the whole point: specials at the real ids
        raise AssertionError(f"{family}: special ids {got[:3]}... do not start at {first}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **chat.roles)
    fast.chat_template = chat.template
    if path is not None:
        fast.save_pretrained(str(path))
    return fast


def write_generation_config(path: str | os.PathLike, name: str) -> None:
    """`generation_config.json` with the named model's bos / pad / eos ids (its turn-end tokens)."""
    Path(path, "generation_config.json").write_text(json.dumps(SHAPES[name][2], indent=2) + "\n")


def write_random_weights(
    path: str | os.PathLike, hf_cfg: Any, *, seed: int = 0, std: float = 0.02, dtype: str = "float32"
) -> Path:
    """Random weights for the transformers config `hf_cfg`, one safetensors shard per layer plus one
    for the embedding and final norm, with an index: matrices N(0, std), biases N(0, 0.1), norm
    weights 1 + N(0, 0.1). Writes `config.json` too."""
    import ml_dtypes
    from safetensors.numpy import save_file

    from marljax.models.config import ModelConfig
    from marljax.models.hf_io import tensor_map

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = ModelConfig.from_hf(hf_cfg)
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(seed)

    def draw(name: str, shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape, dtype=np.float32)
        if "norm" in name:
            x = 1.0 + 0.1 * x
        else:
            x *= 0.1 if name.endswith("bias") else std
        return x.astype(np_dtype)

    table = tensor_map(config)
    groups = [[t.hf for t in table if not t.stacked]]
    groups += [[t.hf.format(i=i) for t in table if t.stacked] for i in range(config.num_layers)]
    shapes = {t.hf.format(i=i): t.hf_shape for t in table for i in range(config.num_layers)}
    weight_map, total = {}, 0
    for g, names in enumerate(groups):
        fname = f"model-{g + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: draw(n, shapes[n]) for n in names}
        save_file(tensors, str(path / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
        total += sum(t.nbytes for t in tensors.values())
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    hf_cfg.dtype = dtype
    hf_cfg.save_pretrained(str(path))
    return path


def real_hf_config(name: str, **overrides: Any):
    """The transformers config of the named shape (`SHAPES`), with `overrides` (e.g. fewer layers)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
    family, keys, _ = SHAPES[name]
    return hf_config(family, **{**keys, **overrides})


def write_real_checkpoint(
    path: str | os.PathLike,
    name: str,
    *,
    seed: int = 0,
    std: float = 0.02,
    dtype: str = "float32",
    **overrides: Any,
) -> Path:
    """A random checkpoint of the named shape with its family's tokenizer and generation config.

    name: "qwen2.5-0.5b" | "llama-3.2-1b". overrides: HF config keys, e.g. `num_hidden_layers=2`
    for a shallow rehearsal at the real vocabulary and width. Loadable by transformers and marljax.
    """
    write_random_weights(path, real_hf_config(name, **overrides), seed=seed, std=std, dtype=dtype)
    make_family_tokenizer(SHAPES[name][0], path)
    write_generation_config(path, name)
    return Path(path)
