"""Truncated importance sampling (TIS) between the trainer's and the sampler's log-probs."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks, losses_util

TIS_LEVELS = ("token", "sequence")
TIS_MODES = ("truncate", "mask")


def tis_weights(
    logp_trainer: chex.Array,
    logp_sampler: chex.Array,
    mask: chex.Array | None,
    *,
    level: str = "token",
    cap: float = 2.0,
    mode: str = "truncate",
    lo: float | None = None,
    hi: float | None = None,
    veto: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Importance weights correcting for the sampler/trainer mismatch, without gradient.

    The sampler (e.g. a fast inference engine in bf16) and the trainer
    (recomputing the old policy's log-probs) disagree slightly, so the data are
    off-policy for the trainer. TIS (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training") multiplies the
    per-token policy loss by a truncated ratio; pass the result as
    `importance_weights` to `policy_loss`.

    Shapes: `logp_trainer`, `logp_sampler`, `mask` `[N, L]`; returns
    `(weights [N, L], metrics)`.

    With `rho_t = exp(logp_trainer_t - logp_sampler_t)`:

    - `level="token"`:    `w_t = rho_t`;
    - `level="sequence"`: `w_t = prod_{s valid} rho_s = exp(sum_s log rho_s)`
      for every valid token of the sequence (computed in log space; the
      exponent is capped before `exp`, so it never overflows);
    - `mode="truncate"` (TIS): `w = min(w, cap)`;
    - `mode="mask"` (masked IS): `w = w if lo <= w <= hi else 0`, with
      `hi = cap` and `lo = 1 / hi` unless given (as verl's rollout IS).

    With `veto` (verl's `rollout_is_veto_threshold`, as MARTI's scripts set it),
    a sequence in which any valid token has `rho_t < veto` gets weight 0 on
    every token: one token the trainer finds far less likely than the sampler
    did marks the whole sample as too far off-policy.

    Masked (padding) tokens get weight 0, and the output is wrapped in
    `stop_gradient`. In mask mode a rejected token has weight 0 but still
    counts in a token-mean denominator; to drop it from the denominator too
    (verl's rejection sampling), aggregate with `mask & (weights > 0)`.
    Default `cap = 2`: the truncation constant C used in Yao et al.'s examples
    and the usual value of verl's `rollout_is_threshold` / SkyRL's `tis_imp_ratio_cap`.

    Metrics (scalars, over valid tokens): `weight_mean`; `frac_truncated`
    (fraction with `w > cap`, truncate mode; else 0); `frac_masked` (fraction
    rejected, mask mode; else 0); `frac_vetoed` (fraction of sequences with a
    valid token vetoed); `mismatch_kl` (mean of `logp_sampler -
    logp_trainer`, the k1 estimate of KL(sampler || trainer)).
    """
    _checks.floating(logp_trainer, "logp_trainer")
    _checks.floating(logp_sampler, "logp_sampler")
    _checks.rank(logp_trainer, 2, "logp_trainer")
    _checks.same_shape(logp_trainer, logp_sampler, "logp_trainer", "logp_sampler")
    mask = losses_util.token_mask(mask, logp_trainer, "mask", "logp_trainer")
    level = _checks.choice(level, "level", TIS_LEVELS)
    mode = _checks.choice(mode, "mode", TIS_MODES)
    cap = losses_util.static_positive_float(cap, "cap")
    if veto is not None:
        veto = losses_util.static_positive_float(veto, "veto")
        if veto >= 1:
            raise ValueError(f"argument `veto` must be < 1 (a ratio far below 1), got {veto}")
    if mode == "truncate":
        for name, value in (("lo", lo), ("hi", hi)):
            if value is not None:
                raise ValueError(f"argument `{name}` is only used with mode='mask'; truncation uses `cap`")
    else:
        hi = cap if hi is None else losses_util.static_positive_float(hi, "hi")
        lo = 1.0 / hi if lo is None else _checks.static_float(lo, "lo", minimum=0.0)
        if lo >= hi:
            raise ValueError(f"argument `lo` ({lo}) must be < `hi` ({hi})")

    dtype = losses_util.compute_dtype(logp_trainer, logp_sampler)
    zero = jnp.zeros((), dtype)
    trainer = jnp.where(mask, jnp.asarray(logp_trainer).astype(dtype), zero)
    sampler = jnp.where(mask, jnp.asarray(logp_sampler).astype(dtype), zero)
    token_log_ratio = trainer - sampler
    if level == "sequence":
        seq = jnp.sum(token_log_ratio, axis=-1, keepdims=True)
        log_ratio = jnp.broadcast_to(seq, token_log_ratio.shape)
    else:
        log_ratio = token_log_ratio

    if mode == "truncate":
        log_hi = math.log(cap)
        over = log_ratio > log_hi
        weights = jnp.exp(jnp.minimum(log_ratio, log_hi))
        frac_truncated = losses_util.masked_mean(over.astype(dtype), mask)
        frac_masked = jnp.zeros((), dtype)
    else:
        log_hi = math.log(hi)
        log_lo = math.log(lo) if lo > 0 else -math.inf
        keep = (log_ratio >= log_lo) & (log_ratio <= log_hi)
        weights = jnp.where(keep, jnp.exp(jnp.minimum(log_ratio, log_hi)), zero)
        frac_truncated = jnp.zeros((), dtype)
        frac_masked = losses_util.masked_mean((~keep).astype(dtype), mask)

    vetoed = jnp.zeros(mask.shape[:1], bool)
    if veto is not None:
        vetoed = jnp.any(mask & (token_log_ratio < math.log(veto)), axis=-1)
        weights = jnp.where(vetoed[:, None], zero, weights)
    weights = jax.lax.stop_gradient(jnp.where(mask, weights, zero))
    metrics = {
        "weight_mean": losses_util.masked_mean(weights, mask),
        "frac_truncated": jax.lax.stop_gradient(frac_truncated),
        "frac_masked": jax.lax.stop_gradient(frac_masked),
        "frac_vetoed": losses_util.masked_mean(vetoed.astype(dtype), jnp.any(mask, axis=-1)),
        "mismatch_kl": jax.lax.stop_gradient(losses_util.masked_mean(-token_log_ratio, mask)),
    }
    return weights, metrics
