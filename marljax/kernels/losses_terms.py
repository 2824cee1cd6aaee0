"""Per-token terms that sit beside the policy loss: log-probs, entropy, KL penalty, overlong penalty.

All functions are pure and elementwise over leading axes, so they work under
`jit` (options static) and `vmap`.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks, losses_util

KL_KINDS = ("k1", "k2", "k3")


def _shift_by_max(z: jax.Array) -> jax.Array:
    """`z - max(z)` over the last axis (max without gradient; 0 for an all -inf row).

    Subtracting the max before the gathered logit and the log-partition are
    combined keeps their difference exact in float32 even for logits ~1e4.
    """
    top = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    return z - jnp.where(jnp.isfinite(top), top, jnp.zeros((), z.dtype))


def logprobs_from_logits(logits: chex.Array, labels: chex.Array, temperature: float = 1.0) -> jax.Array:
    """Log-probability of each label under `softmax(logits / temperature)`.

    Shapes: `logits [..., V]` (usually `[N, L, V]`), `labels [...]` integer ids
    (usually `[N, L]`); returns `[...]`, float32 at least.

    Formula: `log p(y) = z_y - logsumexp(z)` with `z = logits / temperature`,
    the gathered logit minus the log-partition, so no `[..., V]` log-softmax
    tensor is built. The temperature must be the one the sampler used, or the
    trainer's log-probs do not match the sampler's (as in verl, which divides
    the logits by the rollout temperature before computing log-probs).

    Labels outside `[0, V)` raise when the labels are concrete; under `jit`
    they give NaN (out-of-range gathers fill with NaN).
    """
    _checks.floating(logits, "logits")
    _checks.integer(labels, "labels")
    if jnp.ndim(logits) < 1:
        raise ValueError("argument `logits` must have a vocabulary axis (rank >= 1), got a scalar")
    if jnp.shape(labels) != jnp.shape(logits)[:-1]:
        raise ValueError(
            f"argument `labels` has shape {jnp.shape(labels)} but must equal the leading shape "
            f"{jnp.shape(logits)[:-1]} of `logits` {jnp.shape(logits)}"
        )
    temperature = losses_util.static_positive_float(temperature, "temperature")
    vocab = jnp.shape(logits)[-1]
    _checks.ids_in_range(labels, vocab, "labels")

    z = jnp.asarray(logits).astype(losses_util.compute_dtype(logits))
    if temperature != 1.0:
        z = z / temperature
    shifted = _shift_by_max(z)
    picked = jnp.take_along_axis(shifted, jnp.asarray(labels)[..., None], axis=-1, mode="fill")[..., 0]
    return picked - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))


def entropy_from_logits(logits: chex.Array) -> jax.Array:
    """Entropy of the categorical distribution `softmax(logits)` over the last axis.

    Shapes: `logits [..., V]` -> `[...]`, float32 at least.

    Formula: `H = logsumexp(z) - sum_v softmax(z)_v * z_v`, which equals
    `-sum_v p_v log p_v` without forming `log p`; both terms use `z - max(z)`
    (the same value, stable and precise for large logits).
    Entries at `-inf` (banned tokens) have probability 0 and contribute 0.
    """
    _checks.floating(logits, "logits")
    if jnp.ndim(logits) < 1:
        raise ValueError("argument `logits` must have a vocabulary axis (rank >= 1), got a scalar")
    shifted = _shift_by_max(jnp.asarray(logits).astype(losses_util.compute_dtype(logits)))
    exp = jnp.exp(shifted)
    total = jnp.sum(exp, axis=-1, keepdims=True)
    # Replace -inf by 0 so that 0 * (-inf) never appears, in value or gradient.
    finite = jnp.where(jnp.isneginf(shifted), jnp.zeros((), shifted.dtype), shifted)
    return jnp.log(total[..., 0]) - jnp.sum(exp / total * finite, axis=-1)


def kl_penalty(
    logp: chex.Array, ref_logp: chex.Array, kind: str = "k1", clamp: float | None = None
) -> jax.Array:
    """Per-token sample estimate of KL(pi || pi_ref) from tokens sampled from pi.

    Shapes: `logp`, `ref_logp` `[N, L]` (any equal shapes) -> same shape.
    Reduce with `aggregate_loss` and the response mask.

    With `d = ref_logp - logp` (log of `r = pi_ref / pi`), the estimators of
    Schulman (2020), "Approximating KL divergence" (joschu.net/blog/kl-approx.html):

    - `"k1"`: `-d = logp - ref_logp` (unbiased, high variance, can be negative);
    - `"k2"`: `d**2 / 2` (biased, low variance, >= 0);
    - `"k3"`: `exp(d) - d - 1` (unbiased, low variance, >= 0; the estimator of
      DeepSeekMath's GRPO and verl's `low_var_kl`).

    `clamp`: optional static bound `c > 0`; the value is clipped to `[-c, c]`
    (verl clips k3 to [-10, 10]). For `"k3"`, `d` is capped just below the
    float overflow point of `exp` so the value stays finite (gradient 0 there).
    """
    _checks.floating(logp, "logp")
    _checks.floating(ref_logp, "ref_logp")
    _checks.same_shape(logp, ref_logp, "logp", "ref_logp")
    kind = _checks.choice(kind, "kind", KL_KINDS)
    if clamp is not None:
        clamp = losses_util.static_positive_float(clamp, "clamp")

    dtype = losses_util.compute_dtype(logp, ref_logp)
    d = jnp.asarray(ref_logp).astype(dtype) - jnp.asarray(logp).astype(dtype)
    if kind == "k1":
        kl = -d
    elif kind == "k2":
        kl = 0.5 * jnp.square(d)
    else:
        d = jnp.minimum(d, math.log(float(jnp.finfo(dtype).max)) - 1.0)
        kl = jnp.expm1(d) - d
    if clamp is not None:
        kl = jnp.clip(kl, -clamp, clamp)
    return kl


def overlong_penalty(lengths: chex.Array, max_len: int, buffer_len: int, factor: float = 1.0) -> jax.Array:
    """DAPO's soft overlong punishment, a reward term added to each response's reward.

    Shapes: `lengths [N]` (integer or float response lengths; any shape works
    elementwise) -> `[N]`, float32 at least.

    Formula (Yu et al. 2025, DAPO, arXiv 2503.14476, "soft overlong punishment"), with
    `L_max = max_len`, `L_cache = buffer_len`, scaled by `factor`:

        0                                   if |y| <= L_max - L_cache
        factor * ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
        -factor                             if |y| > L_max

    i.e. `-factor * clip((|y| - (L_max - L_cache)) / L_cache, 0, 1)`; the ramp
    reaches `-factor` exactly at `|y| = L_max`. DAPO used L_max = 20480,
    L_cache = 4096 and factor 1 (verl: `overlong_buffer.len`, `penalty_factor`).
    """
    dt = jnp.result_type(lengths)
    if not (jnp.issubdtype(dt, jnp.integer) or jnp.issubdtype(dt, jnp.floating)):
        raise TypeError(f"argument `lengths` must be an integer or floating array, got dtype {dt}")
    max_len = _checks.static_int(max_len, "max_len", minimum=1)
    buffer_len = _checks.static_int(buffer_len, "buffer_len", minimum=1)
    if buffer_len > max_len:
        raise ValueError(f"argument `buffer_len` ({buffer_len}) must be <= `max_len` ({max_len})")
    factor = _checks.static_float(factor, "factor", minimum=0.0)

    x = jnp.asarray(lengths).astype(losses_util.compute_dtype(lengths))
    excess = (x - (max_len - buffer_len)) / buffer_len
    return 0.0 - factor * jnp.clip(excess, 0.0, 1.0)  # 0.0 - x: +0.0, not -0.0, below the ramp
