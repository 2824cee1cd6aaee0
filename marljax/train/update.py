"""The jitted update step: recompute log-probs, apply the loss kernels, accumulate, optax.

`make_update_fn` builds `update(params, opt_state, batch) -> (params,
opt_state, metrics)` for one policy: a `lax.scan` over the micro-batches of
`batch` (arrays `[M, mb, T]` from `collate`) sums gradients, each
micro-batch weighted by its share of the aggregation's denominator (valid
tokens for "token-mean", valid sequences otherwise), so the result equals the
gradient of the loss over the whole batch at once. A non-finite loss or
gradient skips the optimiser step (parameters and optimiser state are kept)
and reports `skipped = 1`, so one bad batch never ends a run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from marljax import kernels as K
from marljax.models.config import ModelConfig
from marljax.models.decoder import hidden_states, logprobs_from_hidden


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Static loss options of one policy (hashable, so they can be jit constants)."""

    loss_type: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    agg_mode: str = "token-mean"
    norm_constant: float | None = None
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    tis_cap: float | None = None
    tis_level: str = "token"

    @classmethod
    def from_config(cls, cfg: Any, norm_constant: float | None = None) -> "LossSettings":
        """From a `LossConfig` (its `type` is our `loss_type`); `norm_constant` defaults to
        the given generation budget."""
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls) if f.name != "loss_type"}
        fields["loss_type"] = cfg.type
        if fields["norm_constant"] is None:
            fields["norm_constant"] = norm_constant
        return cls(**fields)


def _logp_entropy(params, mb, config: ModelConfig, with_entropy: bool):
    h, _ = hidden_states(params, mb["tokens"], config=config, positions=mb["positions"],
                         attention_mask=mb["attention_mask"])
    return logprobs_from_hidden(params, h, mb["labels"], config=config, return_entropy=with_entropy)


def rl_loss(params, mb, *, config: ModelConfig, loss: LossSettings, use_old_logp: bool):
    """Policy-gradient loss of one micro-batch `[mb, T]` and its metrics."""
    logp, entropy = _logp_entropy(params, mb, config, True)
    mask = mb["loss_mask"]
    old = mb["old_logp"] if use_old_logp else jax.lax.stop_gradient(logp)
    metrics = {}
    weights = None
    norm = loss.norm_constant if loss.agg_mode == "seq-mean-token-sum-norm" else None
    if loss.tis_cap is not None:
        weights, tis = K.tis_weights(old, mb["sampling_logp"], mask, level=loss.tis_level, cap=loss.tis_cap)
        metrics.update({f"tis_{k}": v for k, v in tis.items()})
    pg, pg_metrics = K.policy_loss(logp, old, mb["advantages"], mask, loss_type=loss.loss_type,
                                   clip_low=loss.clip_low, clip_high=loss.clip_high,
                                   dual_clip=loss.dual_clip, importance_weights=weights,
                                   agg_mode=loss.agg_mode, norm_constant=norm)
    metrics.update(pg_metrics)
    total = pg
    ent = K.aggregate_loss(entropy, mask, loss.agg_mode, norm_constant=norm)
    if loss.entropy_coef:
        total = total - loss.entropy_coef * ent
    if loss.kl_coef:
        kl = K.aggregate_loss(K.kl_penalty(logp, mb["ref_logp"], loss.kl_estimator), mask, loss.agg_mode,
                              norm_constant=norm)
        total = total + loss.kl_coef * kl
        metrics["kl_ref"] = kl
    metrics.update(pg_loss=pg, entropy=K.aggregate_loss(entropy, mask, "token-mean"))
    return total, metrics


def sft_loss(params, mb, *, config: ModelConfig):
    """Token-mean negative log-likelihood of the completion tokens."""
    logp = _logp_entropy(params, mb, config, False)
    nll = K.aggregate_loss(-logp, mb["loss_mask"], "token-mean")
    return nll, {"nll": nll}


def micro_weights(loss_mask: jax.Array, agg_mode: str) -> tuple[jax.Array, jax.Array]:
    """Per micro-batch weights `[M]` for the loss (aggregation denominator share) and
    for token-averaged metrics (token share); both sum to 1 unless the batch is empty."""
    tokens = jnp.sum(loss_mask, axis=(1, 2)).astype(jnp.float32)
    seqs = jnp.sum(jnp.any(loss_mask, axis=2), axis=1).astype(jnp.float32)
    share = lambda x: x / jnp.maximum(jnp.sum(x), 1.0)  # noqa: E731
    return share(tokens if agg_mode == "token-mean" else seqs), share(tokens)


def accumulate(loss_fn: Callable, params, batch: dict, agg_mode: str):
    """(loss, grads, metrics) of the whole batch, one micro-batch at a time."""
    loss_w, token_w = micro_weights(batch["loss_mask"], agg_mode)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def add(acc, mb, lw, tw):
        (loss, metrics), grads = grad_fn(params, mb)
        g_acc, l_acc, m_acc = acc
        g_acc = jax.tree.map(lambda a, g: a + lw * g, g_acc, grads)
        m_acc = {k: m_acc[k] + tw * v for k, v in metrics.items()}
        return g_acc, l_acc + lw * loss, m_acc

    def body(acc, xs):  # micro-batches without loss tokens (shape-bucket padding) are skipped
        mb, lw, tw = xs
        return jax.lax.cond(jnp.any(mb["loss_mask"]), lambda a: add(a, mb, lw, tw), lambda a: a, acc), None

    _, metrics_shape = jax.eval_shape(loss_fn, params, jax.tree.map(lambda x: x[0], batch))
    zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32),
             {k: jnp.zeros((), jnp.float32) for k in metrics_shape})
    (grads, loss, metrics), _ = jax.lax.scan(body, zeros, (batch, loss_w, token_w))
    return loss, grads, metrics


def guarded_step(optimizer: optax.GradientTransformation, params, opt_state, grads, loss):
    """An optax step that leaves params and state untouched if loss or gradients are not finite."""
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_state, opt_state),
            grad_norm, 1.0 - finite.astype(jnp.float32))


def make_update_fn(loss_fn: Callable, optimizer: optax.GradientTransformation, agg_mode: str):
    """Jitted `update(params, opt_state, batch) -> (params, opt_state, metrics)`;
    params and optimiser state buffers are donated."""

    def update(params, opt_state, batch):
        loss, grads, metrics = accumulate(loss_fn, params, batch, agg_mode)
        params, opt_state, grad_norm, skipped = guarded_step(optimizer, params, opt_state, grads, loss)
        return params, opt_state, {**metrics, "loss": loss, "grad_norm": grad_norm, "skipped": skipped}

    return jax.jit(update, donate_argnums=(0, 1))


def make_logprob_fn(config: ModelConfig):
    """Jitted `logprobs(params, batch) -> [M, mb, T]`: log-probs of `labels`, no gradient."""

    def logprobs(params, batch):
        def one(mb):  # micro-batches without loss tokens (shape-bucket padding) are skipped
            return jax.lax.cond(jnp.any(mb["loss_mask"]), lambda: _logp_entropy(params, mb, config, False),
                                lambda: jnp.zeros(mb["labels"].shape, jnp.float32))
        return jax.lax.map(one, batch)

    return jax.jit(logprobs)
