"""Private helpers shared by the loss kernels (`losses*.py`); not part of the public API."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks


def compute_dtype(*xs: chex.Array) -> jnp.dtype:
    """Floating dtype to compute in: the inputs' common float type, at least float32.

    bfloat16/float16 log-probs are upcast so that `exp`, `logsumexp` and the
    masked sums are not done in half precision; float64 stays float64.
    """
    return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `x` over the True entries of `mask`; 0 when there are none (never NaN)."""
    x = jnp.asarray(x)
    total = jnp.sum(jnp.where(mask, x, jnp.zeros((), x.dtype)))
    count = jnp.sum(mask.astype(x.dtype))
    return total / jnp.maximum(count, 1)


def masked_max(x: jax.Array, mask: jax.Array, empty: float = 0.0) -> jax.Array:
    """Max of `x` over the True entries of `mask`; `empty` when there are none."""
    x = jnp.asarray(x)
    lowest = jnp.array(-jnp.inf, x.dtype)
    out = jnp.max(jnp.where(mask, x, lowest))
    return jnp.where(jnp.any(mask), out, jnp.array(empty, x.dtype))


def token_mask(mask: chex.Array | None, like: chex.Array, mask_name: str, like_name: str) -> jax.Array:
    """Boolean `[N, L]` mask (all True when None), checked against `like`."""
    return _checks.mask_or_ones(mask, like, mask_name, like_name)


def static_positive_float(value: Any, name: str) -> float:
    value = _checks.static_float(value, name)
    if not value > 0:
        raise ValueError(f"argument `{name}` must be > 0, got {value}")
    return value
