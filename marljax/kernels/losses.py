"""Policy-loss kernels: PPO / dual-clip / DAPO clip-higher / GSPO surrogates and loss aggregation.

Everything takes log-prob arrays `[N, L]` (N responses, L response positions)
and a boolean `response_mask [N, L]`; nothing here knows about the model.
Options (strings, floats) are static: pass them as `static_argnames` under
`jax.jit`. The other loss terms live in `losses_terms.py` (log-probs,
entropy, KL penalty, overlong penalty) and `losses_tis.py` (truncated
importance sampling) and are re-exported here.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks
from marljax.kernels import losses_util as _u
from marljax.kernels.losses_terms import entropy_from_logits, kl_penalty, logprobs_from_logits, overlong_penalty
from marljax.kernels.losses_tis import tis_weights

__all__ = [
    "AGG_MODES",
    "LOSS_TYPES",
    "aggregate_loss",
    "entropy_from_logits",
    "kl_penalty",
    "logprobs_from_logits",
    "overlong_penalty",
    "policy_loss",
    "policy_loss_per_token",
    "tis_weights",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOSS_TYPES = ("ppo", "gspo", "gspo-token")


def aggregate_loss(
    loss: chex.Array,
    mask: chex.Array | None,
    mode: str = "token-mean",
    *,
    norm_constant: float | None = None,
) -> jax.Array:
    """Reduce a per-token loss `[N, L]` to a scalar over the valid tokens.

    With `m` the mask, `n_i = sum_t m_it` and `S` the set of sequences with
    `n_i > 0` (names and definitions as verl's `agg_loss`):

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
      between batches.

    Empty sequences (no valid token) contribute nothing and are left out of
    the sequence mean; an all-empty batch gives 0, never NaN. Values at
    masked positions are ignored (even inf or NaN in the forward pass).
    """
    _checks.floating(loss, "loss")
    _checks.rank(loss, 2, "loss")
    mask = _u.token_mask(mask, loss, "mask", "loss")
    mode = _checks.choice(mode, "mode", AGG_MODES)
    if norm_constant is not None:
        if mode != "seq-mean-token-sum-norm":
            raise ValueError(
                f"argument `norm_constant` is only used with mode='seq-mean-token-sum-norm', got mode={mode!r}"
            )
        norm_constant = _u.static_positive_float(norm_constant, "norm_constant")

    loss = jnp.asarray(loss)
    dtype = loss.dtype
    if mode == "token-mean":
        return _u.masked_mean(loss, mask)
    token_sum = jnp.sum(jnp.where(mask, loss, jnp.zeros((), dtype)), axis=-1)
    n_tokens = jnp.sum(mask.astype(dtype), axis=-1)
    if mode == "seq-mean-token-mean":
        per_seq = token_sum / jnp.maximum(n_tokens, 1)
    elif mode == "seq-mean-token-sum":
        per_seq = token_sum
    else:
        per_seq = token_sum / (loss.shape[-1] if norm_constant is None else norm_constant)
    return _u.masked_mean(per_seq, n_tokens > 0)


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
    mask = _u.token_mask(response_mask, logp, "response_mask", "logp")
    if importance_weights is not None:
        _checks.floating(importance_weights, "importance_weights")
        _checks.rank(importance_weights, {1, 2}, "importance_weights")
        _checks.shape(importance_weights, (n,) if jnp.ndim(importance_weights) == 1 else (n, length),
                      "importance_weights")
    return mask


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

    The ratio `r` depends on `loss_type` (`lr_t = logp_t - logp_old_t`):

    - `"ppo"` (Schulman et al. 2017): `r_t = exp(lr_t)`;
    - `"gspo"` (Zheng et al. 2025, arXiv 2507.18071): the sequence ratio
      `s_i = exp(mean_{t valid} lr_it)` (geometric mean of token ratios),
      the same for every token of response i; differentiable through all of
      them. Use `aggregate_loss(..., "seq-mean-token-mean")` for the paper's
      objective;
    - `"gspo-token"`: `s_it = sg[s_i] * pi_t / sg[pi_t]`, i.e.
      `exp(sg[log s_i] + logp_t - sg[logp_t])`: numerically `s_i`, gradient
      through token t only, which allows per-token advantages. With
      per-sequence advantages it equals `"gspo"` in value and gradient.

    Per token (loss = minus the objective), with `eps_lo = clip_low`,
    `eps_hi = clip_high` (DAPO's clip-higher: 0.2 / 0.28):

        l = max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi))
        if dual_clip c is set and A < 0:  l = min(l, -c A)

    (dual clip: Ye et al. 2020, arXiv 1912.09729, c > 1; verl's
    `clip_ratio_c`, default there 3.0; here off unless given). Then
    `l = w * l` with `w = stop_gradient(importance_weights)` when given.
    `log_ratio_clamp` clips the log-ratio (token or sequence) to `[-c, c]`
    before `exp` for stability (verl clamps at 20), gradient 0 beyond it;
    None disables it.

    Metrics (scalars, masked means over valid tokens): `clip_frac` (clipped
    branch active), `clip_frac_low` (clipped with A < 0, i.e. r < 1 - eps_lo),
    `clip_frac_high` (clipped with A > 0, r > 1 + eps_hi), `dual_clip_frac`,
    `approx_kl` (k1: mean of `logp_old - logp`), `approx_kl_k3` (mean of
    `r_t - 1 - lr_t` with token ratios), `ratio_mean`, `ratio_max` (of the
    ratio actually used). Masked positions may hold any value, inf and NaN
    included: they change neither the loss nor its gradient.
    """
    mask = _check_policy_args(logp, logp_old, advantages, response_mask, importance_weights)
    loss_type = _checks.choice(loss_type, "loss_type", LOSS_TYPES)
    clip_low = _checks.static_float(clip_low, "clip_low", minimum=0.0)
    if clip_low >= 1.0:
        raise ValueError(f"argument `clip_low` must be < 1 (the ratio floor is 1 - clip_low), got {clip_low}")
    clip_high = _checks.static_float(clip_high, "clip_high", minimum=0.0)
    if dual_clip is not None:
        dual_clip = _checks.static_float(dual_clip, "dual_clip")
        if not dual_clip > 1.0:
            raise ValueError(f"argument `dual_clip` must be > 1 (Ye et al. 2020), got {dual_clip}")
    if log_ratio_clamp is not None:
        log_ratio_clamp = _u.static_positive_float(log_ratio_clamp, "log_ratio_clamp")

    dtype = _u.compute_dtype(logp, logp_old, advantages)
    zero = jnp.zeros((), dtype)
    shape = jnp.shape(logp)
    # Sanitise masked positions first so that garbage there never reaches a value or a gradient.
    logp = jnp.where(mask, jnp.asarray(logp).astype(dtype), zero)
    logp_old = jnp.where(mask, jnp.asarray(logp_old).astype(dtype), zero)
    adv = jnp.asarray(advantages).astype(dtype)
    adv = jnp.where(mask, jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, shape), zero)

    token_log_ratio = logp - logp_old
    if loss_type == "ppo":
        log_ratio = token_log_ratio
    else:
        n_tokens = jnp.sum(mask.astype(dtype), axis=-1, keepdims=True)
        seq_log_ratio = jnp.sum(token_log_ratio, axis=-1, keepdims=True) / jnp.maximum(n_tokens, 1)
        if loss_type == "gspo":
            log_ratio = jnp.broadcast_to(seq_log_ratio, shape)
        else:
            sg = jax.lax.stop_gradient
            log_ratio = sg(seq_log_ratio) + logp - sg(logp)
    if log_ratio_clamp is not None:
        log_ratio = jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp)
        token_log_ratio = jnp.clip(token_log_ratio, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)

    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    if dual_clip is not None:
        bound = -adv * dual_clip
        is_dual = (adv < 0) & (loss > bound)
        loss = jnp.where(adv < 0, jnp.minimum(loss, bound), loss)
    else:
        is_dual = jnp.zeros(shape, bool)
    if importance_weights is not None:
        w = jnp.asarray(importance_weights).astype(dtype)
        w = jnp.broadcast_to(w[:, None] if w.ndim == 1 else w, shape)
        loss = loss * jax.lax.stop_gradient(jnp.where(mask, w, zero))
    loss = jnp.where(mask, loss, zero)

    sg_ratio = jax.lax.stop_gradient(ratio)
    sg_lr = jax.lax.stop_gradient(token_log_ratio)
    as_float = lambda b: b.astype(dtype)  # noqa: E731
    metrics = {
        "clip_frac": _u.masked_mean(as_float(is_clipped), mask),
        "clip_frac_low": _u.masked_mean(as_float(is_clipped & (adv < 0)), mask),
        "clip_frac_high": _u.masked_mean(as_float(is_clipped & (adv > 0)), mask),
        "dual_clip_frac": _u.masked_mean(as_float(is_dual), mask),
        "approx_kl": _u.masked_mean(-sg_lr, mask),
        "approx_kl_k3": _u.masked_mean(jnp.expm1(sg_lr) - sg_lr, mask),
        "ratio_mean": _u.masked_mean(sg_ratio, mask),
        "ratio_max": _u.masked_max(sg_ratio, mask),
    }
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
    mask = _u.token_mask(response_mask, logp, "response_mask", "logp")
    return aggregate_loss(loss_tokens, mask, agg_mode, norm_constant=norm_constant), metrics
