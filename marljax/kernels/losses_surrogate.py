"""The pieces of a clipped policy-gradient loss, each usable on its own (as in rlax's policy_gradients):

- `log_ratio`: `log pi / pi_old` per token, formed as the loss type says; the
  ways to form it are registered by name in `POLICY_RATIOS`;
- `clipped_surrogate`: PPO's clipped objective given the ratio, with
  asymmetric (clip-higher) and dual clipping;
- `surrogate_metrics`: clip fractions, KL estimates and ratio statistics.

`policy_loss_per_token` (losses.py) composes them. Shapes: `[N, L]` (N
responses, L response positions) with a boolean mask `[N, L]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks, losses_util
from marljax.kernels.losses_registry import Registry

# Each loss type's function maps (logp, logp_old, mask), all [N, L] with 0 at masked tokens, to the log-ratio.
POLICY_RATIOS: Registry[Callable[[jax.Array, jax.Array, jax.Array], jax.Array]] = Registry("loss_type")


def _response_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `x` over each response's valid tokens, `[N, 1]` (0 for an empty response)."""
    n_tokens = jnp.sum(mask.astype(x.dtype), axis=-1, keepdims=True)
    return jnp.sum(x, axis=-1, keepdims=True) / jnp.maximum(n_tokens, 1)


@POLICY_RATIOS.register("ppo")
def ppo_log_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """PPO (Schulman et al. 2017): each token its own ratio, `lr_t = logp_t - logp_old_t`."""
    del mask
    return logp - logp_old


@POLICY_RATIOS.register("gspo")
def gspo_log_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): `log s_i = mean_{t valid} lr_it` at every token of response i.

    `s_i` is the geometric mean of the token ratios; its gradient flows
    through all of them. The paper's objective aggregates with
    "seq-mean-token-mean".
    """
    return jnp.broadcast_to(_response_mean(logp - logp_old, mask), jnp.shape(logp))


@POLICY_RATIOS.register("gspo-token")
def gspo_token_log_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO-token: `sg[log s_i] + logp_t - sg[logp_t]`, GSPO's `log s_i` in value, with token t's own gradient.

    This allows per-token advantages; with one advantage per response it
    equals "gspo" in value and gradient.
    """
    sg = jax.lax.stop_gradient
    return sg(_response_mean(logp - logp_old, mask)) + logp - sg(logp)


def log_ratio(
    logp: chex.Array,
    logp_old: chex.Array,
    response_mask: chex.Array | None,
    *,
    loss_type: str = "ppo",
    clamp: float | None = 20.0,
) -> jax.Array:
    """Log-ratio `[N, L]` of the current to the behaviour policy, formed as `loss_type` says.

    Shapes: `logp`, `logp_old` `[N, L]`, `response_mask` bool `[N, L]` (None:
    all valid). `loss_type` is a name in `POLICY_RATIOS` ("ppo", "gspo",
    "gspo-token"). `clamp` clips the result to `[-c, c]` so that `exp` stays
    finite (verl clamps at 20), gradient 0 beyond it; None disables it.
    Masked positions may hold any value, inf and NaN included: they reach
    neither a valid token's value nor its gradient.
    """
    _checks.floating(logp, "logp")
    _checks.floating(logp_old, "logp_old")
    _checks.rank(logp, 2, "logp")
    _checks.same_shape(logp, logp_old, "logp", "logp_old")
    mask = losses_util.token_mask(response_mask, logp, "response_mask", "logp")
    form = POLICY_RATIOS.get(loss_type)
    if clamp is not None:
        clamp = losses_util.static_positive_float(clamp, "clamp")

    dtype = losses_util.compute_dtype(logp, logp_old)
    zero = jnp.zeros((), dtype)
    # Zero the masked positions first so that garbage there never reaches a value or a gradient.
    logp = jnp.where(mask, jnp.asarray(logp).astype(dtype), zero)
    logp_old = jnp.where(mask, jnp.asarray(logp_old).astype(dtype), zero)
    out = form(logp, logp_old, mask)
    return out if clamp is None else jnp.clip(out, -clamp, clamp)


def check_clip_options(clip_low: Any, clip_high: Any, dual_clip: Any) -> tuple[float, float, float | None]:
    """The clip options as static floats: `0 <= clip_low < 1`, `clip_high >= 0`, `dual_clip > 1` or None."""
    clip_low = _checks.static_float(clip_low, "clip_low", minimum=0.0)
    if clip_low >= 1.0:
        raise ValueError(f"argument `clip_low` must be < 1 (the ratio floor is 1 - clip_low), got {clip_low}")
    clip_high = _checks.static_float(clip_high, "clip_high", minimum=0.0)
    if dual_clip is not None:
        dual_clip = _checks.static_float(dual_clip, "dual_clip")
        if not dual_clip > 1.0:
            raise ValueError(f"argument `dual_clip` must be > 1 (Ye et al. 2020), got {dual_clip}")
    return clip_low, clip_high, dual_clip


def _check_ratio_and_advantages(ratio: chex.Array, advantages: chex.Array) -> None:
    _checks.floating(ratio, "ratio")
    _checks.floating(advantages, "advantages")
    _checks.same_shape(ratio, advantages, "ratio", "advantages")


def _negated_objectives(ratio: jax.Array, advantages: jax.Array, clip_low: float, clip_high: float):
    """`(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`: PPO's two objectives as losses."""
    return -advantages * ratio, -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)


def clipped_surrogate(
    ratio: chex.Array,
    advantages: chex.Array,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> jax.Array:
    """Per-token loss of PPO's clipped surrogate objective, given the ratio (rlax's clipped_surrogate_pg_loss).

    Elementwise over equal shapes (usually `[N, L]`). With `eps_lo = clip_low`,
    `eps_hi = clip_high` (DAPO's clip-higher: 0.2 / 0.28), the loss (minus
    the objective) is

        l = max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi))
        if dual_clip c is set and A < 0:  l = min(l, -c A)

    (PPO: Schulman et al. 2017; dual clip: Ye et al. 2020, arXiv 1912.09729,
    c > 1, verl's `clip_ratio_c`; here off unless given). The options are
    static (trace-time constants).
    """
    _check_ratio_and_advantages(ratio, advantages)
    clip_low, clip_high, dual_clip = check_clip_options(clip_low, clip_high, dual_clip)
    adv = jnp.asarray(advantages)
    unclipped, clipped = _negated_objectives(jnp.asarray(ratio), adv, clip_low, clip_high)
    loss = jnp.maximum(unclipped, clipped)
    if dual_clip is None:
        return loss
    return jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)


def surrogate_metrics(
    ratio: chex.Array,
    advantages: chex.Array,
    token_log_ratio: chex.Array,
    mask: chex.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> dict[str, jax.Array]:
    """Scalar diagnostics of `clipped_surrogate`, masked means over the valid tokens, without gradient.

    `ratio` is the ratio the surrogate used, `token_log_ratio` the per-token
    `logp - logp_old` (`log_ratio(..., loss_type="ppo")`), all of one shape with
    the boolean `mask`; clip options as in `clipped_surrogate`.

    `clip_frac` (clipped branch active), `clip_frac_low` (clipped with A < 0,
    i.e. r < 1 - eps_lo), `clip_frac_high` (clipped with A > 0, r > 1 + eps_hi),
    `dual_clip_frac`, `approx_kl` (k1: mean of `logp_old - logp`),
    `approx_kl_k3` (mean of `r_t - 1 - lr_t` with token ratios), `ratio_mean`,
    `ratio_max`.
    """
    _check_ratio_and_advantages(ratio, advantages)
    _checks.same_shape(ratio, token_log_ratio, "ratio", "token_log_ratio")
    mask = losses_util.token_mask(mask, ratio, "mask", "ratio")
    clip_low, clip_high, dual_clip = check_clip_options(clip_low, clip_high, dual_clip)

    sg = jax.lax.stop_gradient
    ratio, adv, token_lr = (
        sg(jnp.asarray(ratio)),
        sg(jnp.asarray(advantages)),
        sg(jnp.asarray(token_log_ratio)),
    )
    dtype = ratio.dtype
    unclipped, clipped = _negated_objectives(ratio, adv, clip_low, clip_high)
    is_clipped = clipped > unclipped
    if dual_clip is None:
        is_dual = jnp.zeros(jnp.shape(ratio), bool)
    else:
        is_dual = (adv < 0) & (jnp.maximum(unclipped, clipped) > -adv * dual_clip)

    def fraction(flags):
        return losses_util.masked_mean(flags.astype(dtype), mask)

    return {
        "clip_frac": fraction(is_clipped),
        "clip_frac_low": fraction(is_clipped & (adv < 0)),
        "clip_frac_high": fraction(is_clipped & (adv > 0)),
        "dual_clip_frac": fraction(is_dual),
        "approx_kl": losses_util.masked_mean(-token_lr, mask),
        "approx_kl_k3": losses_util.masked_mean(jnp.expm1(token_lr) - token_lr, mask),
        "ratio_mean": losses_util.masked_mean(ratio, mask),
        "ratio_max": losses_util.masked_max(ratio, mask),
    }
