"""Policy-loss kernels: PPO / dual-clip / DAPO clip-higher / GSPO surrogates and loss aggregation.

Everything takes log-prob arrays `[N, L]` (N responses, L response positions)
and a boolean `response_mask [N, L]`; nothing here knows about the model.
Options (strings, floats) are static: pass them as `static_argnames` under
`jax.jit`. `policy_loss` composes the pieces of `losses_surrogate.py` (the
log-ratio of a registered loss type, the clipped surrogate, its metrics) and
`aggregate_loss`. The other loss terms live in `losses_terms.py` (log-probs,
entropy, KL penalty, overlong penalty) and `losses_tis.py` (truncated
importance sampling); everything is re-exported here.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks, losses_util
from marljax.kernels.losses_surrogate import (
    POLICY_RATIOS,
    check_clip_options,
    clipped_surrogate,
    log_ratio,
    surrogate_metrics,
)
from marljax.kernels.losses_terms import (
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    overlong_penalty,
)
from marljax.kernels.losses_tis import tis_weights

__all__ = [
    "AGG_MODES",
    "LOSS_TYPES",
    "POLICY_RATIOS",
    "aggregate_loss",
    "clipped_surrogate",
    "entropy_from_logits",
    "kl_penalty",
    "log_ratio",
    "logprobs_from_logits",
    "overlong_penalty",
    "policy_loss",
    "policy_loss_per_token",
    "surrogate_metrics",
    "tis_weights",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOSS_TYPES = POLICY_RATIOS.names()


def aggregate_loss(
    loss: chex.Array,
    mask: chex.Array | None,
    mode: str = "token-mean",
    *,
    norm_constant: float | None = None,
) -> jax.Array:
    """Reduce a per-token loss `[N, L]` to a scalar over the valid tokens.

    With `m` the mask, `n_i = sum_t m_it` and `S` the set of sequences with
    `n_i > 0` (the names of verl's `agg_loss`; the first three also its values):

    - `"token-mean"`: `sum_it m_it l_it / sum_it m_it` (DAPO, Yu et al. 2025,
      arXiv 2503.14476: every token weighs the same);
    - `"seq-mean-token-mean"`: `mean_{i in S} (sum_t m_it l_it / n_i)` (the
      original GRPO; GSPO's aggregation);
    - `"seq-mean-token-sum"`: `mean_{i in S} sum_t m_it l_it`;
    - `"seq-mean-token-sum-norm"`: `mean_{i in S} sum_t m_it l_it / C` with
      `C = norm_constant`, default `L` (Dr.GRPO, Liu et al. 2025,
      arXiv 2503.20783: a constant normaliser, ideally the generation budget,
      so that the loss does not depend on response length). Pass the
      generation budget as `norm_constant` to keep `C` fixed when `L` varies
      between batches. verl's mode of this name sums over the sequences
      instead of averaging (`sum_i sum_t m_it l_it / L`), so its loss and
      gradient are `N` times this one for a batch of `N` sequences; the Dr.GRPO
      objective averages over the group's responses, as here.

    Empty sequences (no valid token) contribute nothing and are left out of
    the sequence mean; an all-empty batch gives 0, never NaN. Values at
    masked positions are ignored (even inf or NaN in the forward pass).
    """
    _checks.floating(loss, "loss")
    _checks.rank(loss, 2, "loss")
    mask = losses_util.token_mask(mask, loss, "mask", "loss")
    mode = _checks.choice(mode, "mode", AGG_MODES)
    if norm_constant is not None:
        if mode != "seq-mean-token-sum-norm":
            raise ValueError(
                f"argument `norm_constant` is only used with mode='seq-mean-token-sum-norm', got mode={mode!r}"
            )
        norm_constant = losses_util.static_positive_float(norm_constant, "norm_constant")

    loss = jnp.asarray(loss)
    dtype = loss.dtype
    if mode == "token-mean":
        return losses_util.masked_mean(loss, mask)
    token_sum = jnp.sum(jnp.where(mask, loss, jnp.zeros((), dtype)), axis=-1)
    n_tokens = jnp.sum(mask.astype(dtype), axis=-1)
    if mode == "seq-mean-token-mean":
        per_seq = token_sum / jnp.maximum(n_tokens, 1)
    elif mode == "seq-mean-token-sum":
        per_seq = token_sum
    else:
        per_seq = token_sum / (loss.shape[-1] if norm_constant is None else norm_constant)
    return losses_util.masked_mean(per_seq, n_tokens > 0)


def _check_policy_args(logp, logp_old, advantages, response_mask, importance_weights):
    _checks.floating(logp, "logp")
    _checks.floating(logp_old, "logp_old")
    _checks.floating(advantages, "advantages")
    _checks.rank(logp, 2, "logp")
    _checks.same_shape(logp, logp_old, "logp", "logp_old")
    n, length = jnp.shape(logp)
    _checks.rank(advantages, {1, 2}, "advantages")
    if jnp.ndim(advantages) == 1:
        _checks.shape(advantages, (n,), "advantages")
    else:
        _checks.same_shape(logp, advantages, "logp", "advantages")
    mask = losses_util.token_mask(response_mask, logp, "response_mask", "logp")
    if importance_weights is not None:
        _checks.floating(importance_weights, "importance_weights")
        _checks.rank(importance_weights, {1, 2}, "importance_weights")
        _checks.shape(
            importance_weights,
            (n,) if jnp.ndim(importance_weights) == 1 else (n, length),
            "importance_weights",
        )
    return mask


def _per_token(x: chex.Array, mask: jax.Array, dtype) -> jax.Array:
    """`[N]` (one value per response) or `[N, L]` values as `[N, L]`, 0 at masked tokens."""
    x = jnp.asarray(x).astype(dtype)
    x = jnp.broadcast_to(x[:, None] if x.ndim == 1 else x, mask.shape)
    return jnp.where(mask, x, jnp.zeros((), dtype))


def policy_loss_per_token(
    logp: chex.Array,
    logp_old: chex.Array,
    advantages: chex.Array,
    response_mask: chex.Array | None,
    *,
    loss_type: str = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    importance_weights: chex.Array | None = None,
    log_ratio_clamp: float | None = 20.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token clipped surrogate loss `[N, L]` (0 at masked tokens) and metrics.

    Shapes: `logp`, `logp_old` `[N, L]` (current and behaviour-policy log-probs
    of the sampled tokens), `advantages` `[N]` (one per response, broadcast
    over its tokens) or `[N, L]`, `response_mask` bool `[N, L]` (None: all
    valid), `importance_weights` `[N]` or `[N, L]` (e.g. from `tis_weights`).

    The composition of the pieces in `losses_surrogate`:

    1. the ratio `r = exp(log_ratio(logp, logp_old, mask, loss_type=loss_type,
       clamp=log_ratio_clamp))`, with `loss_type` a name in `POLICY_RATIOS`:
       `"ppo"` (token ratios), `"gspo"` (the sequence ratio, the geometric
       mean of the token ratios; aggregate with "seq-mean-token-mean" for the
       paper's objective) or `"gspo-token"` (the sequence ratio's value with
       each token's own gradient, which allows per-token advantages);
    2. `l = clipped_surrogate(r, A, clip_low, clip_high, dual_clip)`:
       `max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`, and with a dual
       clip `c`, `min(l, -c A)` where `A < 0`;
    3. `l = w * l` with `w = stop_gradient(importance_weights)` when given;
    4. metrics from `surrogate_metrics`: `clip_frac`, `clip_frac_low`,
       `clip_frac_high`, `dual_clip_frac`, `approx_kl`, `approx_kl_k3`,
       `ratio_mean`, `ratio_max` (scalars over the valid tokens).

    `log_ratio_clamp` clips the log-ratio (token or sequence) to `[-c, c]`
    before `exp` (verl clamps at 20); None disables it. Masked positions may
    hold any value, inf and NaN included: they change neither the loss nor
    its gradient.
    """
    mask = _check_policy_args(logp, logp_old, advantages, response_mask, importance_weights)
    clip_low, clip_high, dual_clip = check_clip_options(clip_low, clip_high, dual_clip)
    if log_ratio_clamp is not None:
        log_ratio_clamp = losses_util.static_positive_float(log_ratio_clamp, "log_ratio_clamp")

    dtype = losses_util.compute_dtype(logp, logp_old, advantages)
    logp, logp_old = jnp.asarray(logp).astype(dtype), jnp.asarray(logp_old).astype(dtype)
    adv = _per_token(advantages, mask, dtype)
    ratio = jnp.exp(log_ratio(logp, logp_old, mask, loss_type=loss_type, clamp=log_ratio_clamp))
    loss = clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip)
    if importance_weights is not None:
        loss = loss * jax.lax.stop_gradient(_per_token(importance_weights, mask, dtype))
    loss = jnp.where(mask, loss, jnp.zeros((), dtype))

    token_lr = log_ratio(logp, logp_old, mask, loss_type="ppo", clamp=log_ratio_clamp)
    metrics = surrogate_metrics(
        ratio, adv, token_lr, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    return loss, metrics


def policy_loss(
    logp: chex.Array,
    logp_old: chex.Array,
    advantages: chex.Array,
    response_mask: chex.Array | None,
    *,
    loss_type: str = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    importance_weights: chex.Array | None = None,
    log_ratio_clamp: float | None = 20.0,
    agg_mode: str | None = None,
    norm_constant: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Scalar clipped policy loss: `policy_loss_per_token` reduced by `aggregate_loss`.

    Shapes and options as in `policy_loss_per_token`; returns `(loss, metrics)`
    with a scalar loss to minimise. `agg_mode` is one of `AGG_MODES`;
    None picks `"token-mean"` for `"ppo"` (DAPO, verl's default) and
    `"seq-mean-token-mean"` for `"gspo"` / `"gspo-token"` (the GSPO paper's
    `1/G sum_i` over sequences). `norm_constant` is the Dr.GRPO constant of
    `"seq-mean-token-sum-norm"` (default L).

    Presets: PPO `clip_low=clip_high=0.2`; DAPO `clip_low=0.2,
    clip_high=0.28, agg_mode="token-mean"`; dual-clip PPO `dual_clip=3.0`;
    GSPO `loss_type="gspo", clip_low=3e-4, clip_high=4e-4` (the paper's
    sequence-level ranges); Dr.GRPO `agg_mode="seq-mean-token-sum-norm"`.
    """
    if agg_mode is None:
        agg_mode = "token-mean" if loss_type == "ppo" else "seq-mean-token-mean"
    agg_mode = _checks.choice(agg_mode, "agg_mode", AGG_MODES)
    loss_tokens, metrics = policy_loss_per_token(
        logp,
        logp_old,
        advantages,
        response_mask,
        loss_type=loss_type,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        importance_weights=importance_weights,
        log_ratio_clamp=log_ratio_clamp,
    )
    mask = losses_util.token_mask(response_mask, logp, "response_mask", "logp")
    return aggregate_loss(loss_tokens, mask, agg_mode, norm_constant=norm_constant), metrics
