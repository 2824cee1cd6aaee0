"""The demo's two tiny models of different families, written as Hugging Face checkpoints.

Both share one byte-level BPE tokenizer whose merges are learnt from the
demo's task texts, so prompts and programs are short (about 40 and 20
tokens). The models are random (seeded, drawn with numpy) and written by
marljax's own safetensors writer, so the demo needs no torch; marljax then
loads them through the same path as any downloaded checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 512
# (family, HF config overrides): a 4-layer Qwen3 and a smaller 3-layer Llama. Both use plain rope
# with base 10,000: with Qwen3's 1,000,000 most rotary frequencies barely turn over the demo's short
# sequences, and SFT learns far less.
FAMILIES = {
    "qwen3": (
        "qwen3",
        dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=10000.0,
        ),
    ),
    "llama": (
        "llama",
        dict(
            hidden_size=96,
            intermediate_size=256,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            rope_scaling=None,
        ),
    ),
}
TOKENIZER_SEED = 10_000_000  # task seeds the tokenizer corpus is drawn from (disjoint from train / eval)


def steps_problems(n: int, seed: int, steps: int) -> list:
    """`n` "steps" tasks as `Problem`s (the loader's view of them)."""
    from marljax.tasks import parse_row, synthetic_rows

    rows = synthetic_rows(n, seed=seed, difficulty=steps, style="steps")
    return [parse_row(r, "stdio", f"<demo tasks>:{k + 1}") for k, r in enumerate(rows)]


def task_corpus(pool, n: int = 2000, n_refine: int = 100, steps: int = 3) -> list[str]:
    """Texts the tokenizer learns its merges from: tasks, solutions (and their slips), refinement prompts."""
    from marljax.demo.refine import refine_examples
    from marljax.demo.teacher import teacher_completion
    from marljax.train.sft import reference_completion
    from marljax.workflows.base import Agent

    problems = steps_problems(n, TOKENIZER_SEED, steps)
    corpus = [
        text for p in problems for text in (p.prompt, reference_completion(p), teacher_completion(p, 1.0))
    ]
    return corpus + [q for q, _ in refine_examples(problems[:n_refine], Agent("demo", "demo"), pool)]


def ensure_models(root: Path, pool, seed: int = 0) -> dict[str, Path]:
    """Create the checkpoints under `root` unless a previous run finished writing them."""
    from marljax.models.tokenizer import make_tokenizer
    from marljax.testing import write_random_checkpoint

    paths = {name: root / name for name in FAMILIES}
    done = root / "models.json"
    if done.exists():
        return paths
    tokenizer = make_tokenizer(vocab_size=VOCAB, corpus=task_corpus(pool))
    for k, (name, (family, overrides)) in enumerate(FAMILIES.items()):
        write_random_checkpoint(
            paths[name],
            family,
            seed=seed + k,
            std=0.02,
            tokenizer=False,
            vocab_size=VOCAB,
            max_position_embeddings=512,
            **overrides,
        )
        tokenizer.save_pretrained(str(paths[name]))
    done.write_text(json.dumps({name: str(p) for name, p in paths.items()}, indent=1))  # written last
    return paths
