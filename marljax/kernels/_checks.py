"""Argument checks shared by the kernels.

All checks run at trace time (on shapes, dtypes and static options), so they
cost nothing inside a compiled function, and every message names the argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np


def _tag(name: str) -> str:
    return f"argument `{name}`"


def rank(x: chex.Array, expected: int | set[int], name: str) -> None:
    chex.assert_rank(x, expected, custom_message=_tag(name))


def shape(x: chex.Array, expected: tuple, name: str) -> None:
    """`expected` may hold None for any size (and Ellipsis, as in chex)."""
    chex.assert_shape(x, expected, custom_message=_tag(name))


def same_shape(x: chex.Array, y: chex.Array, x_name: str, y_name: str) -> None:
    if jnp.shape(x) != jnp.shape(y):
        raise ValueError(
            f"argument `{y_name}` has shape {jnp.shape(y)} but `{x_name}` has shape "
            f"{jnp.shape(x)}; they must match"
        )


def floating(x: chex.Array, name: str) -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{_tag(name)} must be a floating array, got dtype {jnp.result_type(x)}")


def integer(x: chex.Array, name: str) -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
        raise TypeError(f"{_tag(name)} must be an integer array, got dtype {jnp.result_type(x)}")


def boolean_or_none(x: chex.Array | None, name: str) -> None:
    if x is not None and jnp.result_type(x) != jnp.bool_:
        raise TypeError(f"{_tag(name)} must be a boolean array, got dtype {jnp.result_type(x)}")


def static_int(value: Any, name: str, minimum: int = 1) -> int:
    if (
        isinstance(value, jax.core.Tracer)
        or not isinstance(value, (int, np.integer))
        or isinstance(value, bool)
    ):
        raise TypeError(f"{_tag(name)} must be a static Python int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{_tag(name)} must be >= {minimum}, got {value}")
    return int(value)


def static_float(value: Any, name: str, minimum: float | None = None, maximum: float | None = None) -> float:
    if isinstance(value, jax.core.Tracer) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{_tag(name)} must be a static Python number, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{_tag(name)} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{_tag(name)} must be <= {maximum}, got {value}")
    return float(value)


def choice(value: Any, name: str, options: Iterable[str]) -> str:
    options = tuple(options)
    if value not in options:
        raise ValueError(f"{_tag(name)} must be one of {options}, got {value!r}")
    return value


def is_concrete(x: chex.Array) -> bool:
    """True when `x` holds values we can inspect now (not traced under jit/vmap)."""
    return not isinstance(x, jax.core.Tracer)


def ids_in_range(ids: chex.Array, upper: int, name: str) -> None:
    """Value check on concrete ids; under jit the kernels mark bad ids with NaN instead."""
    if not is_concrete(ids):
        return
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= upper):
        bad = ids[(ids < 0) | (ids >= upper)]
        raise ValueError(
            f"{_tag(name)} must lie in [0, {upper}); found {bad.size} value(s) outside, e.g. {int(bad[0])}"
        )


def mask_or_ones(mask: chex.Array | None, like: chex.Array, mask_name: str, like_name: str) -> jax.Array:
    """Validate an optional boolean mask against `like` and return it (all True when None)."""
    if mask is None:
        return jnp.ones(jnp.shape(like), dtype=bool)
    boolean_or_none(mask, mask_name)
    same_shape(like, mask, like_name, mask_name)
    return jnp.asarray(mask)
