"""Logit parity with transformers (torch, CPU, float32) on tiny random checkpoints."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax import testing
from marljax.models import from_pretrained, positions_from_mask

B, T = 3, 9


def _batch(kind: str, vocab: int = 512):
    rng = np.random.RandomState(1)
    ids = rng.randint(3, vocab, size=(B, T))
    mask = np.ones((B, T), np.int64)
    if kind == "left":  # rows with 0, 3 and 5 pads at the front
        for b, n in enumerate((0, 3, 5)):
            mask[b, :n] = 0
            ids[b, :n] = testing.PAD_ID
    elif kind == "right":
        for b, n in enumerate((0, 2, 6)):
            mask[b, T - n :] = 0
            ids[b, T - n :] = testing.PAD_ID
    pos = np.asarray(positions_from_mask(jnp.asarray(mask)))
    if kind == "offset":  # explicit position ids that do not start at 0
        pos = pos + np.array([[37], [0], [100]])
    return ids, mask, pos


@functools.cache
def _torch_model(path):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _torch_logits(path, ids, mask, pos):
    import torch

    with torch.no_grad():
        out = _torch_model(path)(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos)
        )
    return out.logits.numpy()


@pytest.mark.parametrize("kind", ["left", "right", "offset"])
@pytest.mark.parametrize("case", sorted(testing.CASES))
def test_logits_match_transformers(checkpoint, case, kind):
    path = checkpoint(case)
    ids, mask, pos = _batch(kind)
    ref = _torch_logits(path, ids, mask, pos)
    model, _ = from_pretrained(path)
    ours, cache = model(jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask))
    assert cache is None and ours.shape == (B, T, 512) and ours.dtype == jnp.float32
    valid = mask.astype(bool)
    # the fixture must give non-trivial logits, else parity would be vacuous
    assert ref[valid].std() > 0.5
    np.testing.assert_allclose(np.asarray(ours)[valid], ref[valid], atol=1e-4, rtol=0)


def test_bfloat16_compute_close_to_float32(checkpoint):
    """bf16 params and compute vs fp32, same weights. Tolerance: max |diff| <= 0.15 and
    mean |diff| <= 0.03 on logits of std ~1.2 (bf16 has 8 mantissa bits, ~4e-3 relative)."""
    path = checkpoint("qwen3-tied-gqa2")
    ids, mask, pos = _batch("left")
    args = (jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask))
    f32, _ = from_pretrained(path)
    bf16, cfg = from_pretrained(path, dtype="bfloat16")
    assert cfg.param_dtype == "bfloat16" and bf16.layers.wq.get_value().dtype == jnp.bfloat16
    lf, _ = f32(*args)
    lb, _ = jax.jit(lambda *a: bf16(*a))(*args)
    assert lb.dtype == jnp.float32
    diff = np.abs(np.asarray(lb) - np.asarray(lf))[mask.astype(bool)]
    assert np.isfinite(diff).all()
    assert diff.max() <= 0.15 and diff.mean() <= 0.03, (diff.max(), diff.mean())
    # and argmax mostly agrees
    agree = (np.asarray(lb).argmax(-1) == np.asarray(lf).argmax(-1))[mask.astype(bool)].mean()
    assert agree >= 0.9
