"""Rotary position embeddings (the Hugging Face "rotate half" layout).

Inverse frequencies follow transformers' `modeling_rope_utils`:
default `1 / theta^(2i/d)`, "linear" divides them by `factor`, "llama3"
divides long wavelengths by `factor` and interpolates the middle band.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from marljax.models.config import SUPPORTED_ROPE_TYPES, ModelConfig


def inverse_frequencies(config: ModelConfig) -> np.ndarray:
    """`[head_dim // 2]` float32 inverse frequencies for `config` (static numpy)."""
    dim = config.head_dim
    inv = 1.0 / (np.float32(config.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    inv = inv.astype(np.float32)
    if config.rope_type == "default":
        return inv
    if config.rope_type == "linear":
        return (inv / np.float32(config.rope_factor)).astype(np.float32)
    if config.rope_type == "llama3":
        factor = config.rope_factor
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        old_len = config.rope_original_max_position_embeddings
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"unsupported rope_scaling type {config.rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: np.ndarray) -> jnp.ndarray:
    """Rotate `x` `[..., N, H]` by `positions` `[...]` (int; e.g. `[B, T, N, H]` by `[B, T]`,
    or one decode step's `[B, N, H]` by `[B]`); returns `x.dtype`.

    Angles and the rotation are computed in float32.
    """
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [..., H/2]
    cos = jnp.cos(angles)[..., None, :]  # broadcast over the heads
    sin = jnp.sin(angles)[..., None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
