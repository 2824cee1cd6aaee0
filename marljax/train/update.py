"""The jitted update step: recompute log-probs, apply the loss kernels, accumulate, optax.

`make_update_fn` builds `update(params, opt_state, batch) -> (params,
opt_state, metrics)` for one policy: a `lax.scan` over the micro-batches of
`batch` (arrays `[M, mb, T]` from `collate`) sums gradients, each
micro-batch weighted by its share of the aggregation's denominator (valid
tokens for "token-mean", valid sequences otherwise), so the result equals the
gradient of the loss over the whole batch at once. A step whose loss or
gradient is not finite is skipped (`guarded_step`: parameters and optimiser
state are kept) and reports `skipped = 1`, so one bad batch never ends a run.

With a `mesh`, each function is traced inside `activation_sharding(mesh)`: the model pins its
activations to rows over the data axes (`marljax.models.sharding`), so every device holds only its
rows' activations whatever the parameters' layout.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from marljax import kernels
from marljax.models.config import ModelConfig
from marljax.models.decoder import hidden_states, logprobs_from_hidden
from marljax.models.sharding import activation_sharding
from marljax.train.config import LossConfig
from marljax.train.optim import step_metrics


def _logp_entropy(
    params, mb, config: ModelConfig, with_entropy: bool, temperature: bool = True, lora_dropout: float = 0.0
):
    """Log-probs (and entropy) of the labels under `softmax(logits / T)`, T the temperature each
    row was sampled at (the sampler's convention: no top-k/top-p truncation on either side);
    `temperature=False` for the plain likelihood (SFT). `lora_dropout`: the adapter dropout rate
    (updates of adapter policies), keyed by the micro-batch's `lora_seed`."""
    dropout = (lora_dropout, jax.random.key(mb["lora_seed"])) if lora_dropout else None
    h, _ = hidden_states(
        params,
        mb["tokens"],
        config=config,
        positions=mb["positions"],
        attention_mask=mb["attention_mask"],
        lora_dropout=dropout,
    )
    scale = mb["temperature"][:, None, None] if temperature else 1.0  # over [rows, chunk, V] logits
    return logprobs_from_hidden(
        params, h, mb["labels"], config=config, temperature=scale, return_entropy=with_entropy
    )


def rl_loss(
    params, mb, *, config: ModelConfig, loss: LossConfig, use_old_logp: bool, lora_dropout: float = 0.0
):
    """Policy-gradient loss of one micro-batch `[mb, T]` and its metrics."""
    logp, entropy = _logp_entropy(params, mb, config, True, lora_dropout=lora_dropout)
    mask = mb["loss_mask"]
    old = mb["old_logp"] if use_old_logp else jax.lax.stop_gradient(logp)
    metrics = {}
    weights = None
    norm = loss.agg_norm_constant
    if loss.tis_cap is not None:
        weights, tis = kernels.tis_weights(
            old,
            mb["sampling_logp"],
            mask,
            level=loss.tis_level,
            cap=loss.tis_cap,
            mode=loss.tis_mode,
            veto=loss.tis_veto,
        )
        metrics.update({f"tis_{k}": v for k, v in tis.items()})
    pg, pg_metrics = kernels.policy_loss(
        logp, old, mb["advantages"], mask, importance_weights=weights, **loss.policy_loss_options()
    )
    metrics.update(pg_metrics)
    total = pg
    ent = kernels.aggregate_loss(entropy, mask, loss.agg_mode, norm_constant=norm)
    if loss.entropy_coef:
        total = total - loss.entropy_coef * ent
    if loss.kl_coef:
        kl = kernels.aggregate_loss(
            kernels.kl_penalty(logp, mb["ref_logp"], loss.kl_estimator),
            mask,
            loss.agg_mode,
            norm_constant=norm,
        )
        total = total + loss.kl_coef * kl
        metrics["kl_ref"] = kl
    metrics.update(pg_loss=pg, entropy=kernels.aggregate_loss(entropy, mask, "token-mean"))
    return total, metrics


def sft_loss(params, mb, *, config: ModelConfig, lora_dropout: float = 0.0):
    """Token-mean negative log-likelihood of the completion tokens."""
    logp = _logp_entropy(params, mb, config, False, temperature=False, lora_dropout=lora_dropout)
    nll = kernels.aggregate_loss(-logp, mb["loss_mask"], "token-mean")
    return nll, {"nll": nll}


def _unless_padding(mb: dict, compute: Callable, padding_value: Callable):
    """`compute()` for a micro-batch with loss tokens, else `padding_value()`: micro-batches added to
    reach a shape bucket have none, and skipping them saves their forward and backward passes."""
    return jax.lax.cond(jnp.any(mb["loss_mask"]), compute, padding_value)


def micro_weights(loss_mask: jax.Array, agg_mode: str) -> tuple[jax.Array, jax.Array]:
    """Per micro-batch weights `[M]` for the loss (aggregation denominator share) and
    for token-averaged metrics (token share); both sum to 1 unless the batch is empty."""
    tokens = jnp.sum(loss_mask, axis=(1, 2)).astype(jnp.float32)
    seqs = jnp.sum(jnp.any(loss_mask, axis=2), axis=1).astype(jnp.float32)

    def share(x):
        return x / jnp.maximum(jnp.sum(x), 1.0)

    return share(tokens if agg_mode == "token-mean" else seqs), share(tokens)


def accumulate(loss_fn: Callable, params, batch: dict, agg_mode: str, shardings=None):
    """(loss, grads, metrics) of the whole batch, one micro-batch at a time. `shardings` (a tree
    like `params`, or one sharding for all): the gradient accumulator's layout, which the
    partitioner would otherwise guess (it may split a layer axis the parameters do not split,
    then move the whole array back every micro-batch)."""
    loss_w, token_w = micro_weights(batch["loss_mask"], agg_mode)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def pinned(tree):
        if shardings is None:
            return tree
        if isinstance(shardings, NamedSharding):
            return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, shardings), tree)
        return jax.lax.with_sharding_constraint(tree, shardings)

    def add(acc, mb, lw, tw):
        (loss, metrics), grads = grad_fn(params, mb)
        g_acc, l_acc, m_acc = acc
        # in the parameter dtype: a float32 weight times bfloat16 gradients promotes to float32,
        # and the scan's carry must keep its dtype (bfloat16 parameters could not train otherwise)
        g_acc = pinned(jax.tree.map(lambda a, g: (a + lw * g).astype(a.dtype), g_acc, pinned(grads)))
        m_acc = {k: m_acc[k] + tw * v for k, v in metrics.items()}
        return g_acc, l_acc + lw * loss, m_acc

    def body(acc, xs):
        mb, lw, tw = xs
        return _unless_padding(mb, lambda: add(acc, mb, lw, tw), lambda: acc), None

    _, metrics_shape = jax.eval_shape(loss_fn, params, jax.tree.map(lambda x: x[0], batch))
    zeros = (
        pinned(jax.tree.map(jnp.zeros_like, params)),
        jnp.zeros((), jnp.float32),
        {k: jnp.zeros((), jnp.float32) for k in metrics_shape},
    )
    (grads, loss, metrics), _ = jax.lax.scan(body, zeros, (batch, loss_w, token_w))
    return loss, grads, metrics


def guarded_step(optimizer: optax.GradientTransformation, params, opt_state, grads, loss):
    """An optax step that leaves params and state as they were if the loss or the gradients are not
    finite: `(params, opt_state, grad_norm, skipped)`. Selecting after the step (rather than inside
    the optimiser, as `optax.apply_if_finite` does with a `lax.cond`) leaves a finite step bit for bit
    what the plain optimiser computes."""
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)

    def keep_if_finite(new, old):
        return jnp.where(finite, new, old)

    return (
        jax.tree.map(keep_if_finite, new_params, params),
        jax.tree.map(keep_if_finite, new_state, opt_state),
        grad_norm,
        1.0 - finite.astype(jnp.float32),
    )


def whole(params, frozen=None):
    """`combine` when the trainable parameters are the whole model (nothing frozen)."""
    return params


def make_update_fn(
    loss_fn: Callable,
    optimizer: optax.GradientTransformation,
    agg_mode: str,
    schedule: optax.Schedule | None = None,
    combine: Callable = whole,
    mesh: Mesh | None = None,
    shardings=None,
):
    """Jitted `update(params, opt_state, batch, frozen=None) -> (params, opt_state, metrics)`;
    params and optimiser state buffers are donated. The metrics include `skipped`, and `lr`
    given the optimiser's `schedule` (`marljax.train.optim.step_metrics`).

    `params` are the trainable part and the loss sees `combine(params, frozen)` (by default the
    trainable part is the whole model; adapter policies: the frozen base with the adapter):
    gradients, optimiser state and the step cover `params` alone, and `frozen` is neither donated
    nor changed. `mesh`: the activations' (see the module doc); `shardings`: the parameters', which
    the gradient accumulator keeps (`accumulate`)."""

    def update(params, opt_state, batch, frozen=None):
        def fn(p, mb):
            return loss_fn(combine(p, frozen), mb)

        with activation_sharding(mesh):
            loss, grads, metrics = accumulate(fn, params, batch, agg_mode, shardings)
        params, opt_state, grad_norm, skipped = guarded_step(optimizer, params, opt_state, grads, loss)
        return (
            params,
            opt_state,
            {**metrics, "loss": loss, "grad_norm": grad_norm, **step_metrics(opt_state, skipped, schedule)},
        )

    return jax.jit(update, donate_argnums=(0, 1))


def make_agent_grad_norm_fn(
    loss_fn: Callable, agg_mode: str, combine: Callable = whole, mesh: Mesh | None = None
):
    """Jitted `norms(params, batch, agent_rows, num_agents, frozen=None) -> [num_agents]`: a
    diagnostic, the global norm of the gradient of the loss of each agent's rows alone.

    `agent_rows [M, mb]` holds each row's agent index (-1 for padding rows). Agent k's gradient is
    the one `accumulate` gives for the batch with every other agent's rows masked out, which equals
    the gradient of a batch holding only agent k's samples (masked rows count in no loss
    denominator); an agent without rows gets 0. Several agents on one policy share its gradient,
    so the update's `grad_norm` cannot tell which agent a spike comes from (Dr. MAS, arXiv
    2602.08847, Lemma 4.2: global normalisation scales agent k's gradient second moment). It costs
    one more forward and backward pass per agent, hence off unless asked for."""

    def norms(params, batch, agent_rows, num_agents, frozen=None):
        def fn(p, mb):
            return loss_fn(combine(p, frozen), mb)

        def one(k):
            mine = batch["loss_mask"] & (agent_rows == k)[:, :, None]
            _, grads, _ = accumulate(fn, params, {**batch, "loss_mask": mine}, agg_mode)
            return optax.tree.norm(grads)

        # lax.map, not a Python loop: one compiled body whatever the number of agents
        with activation_sharding(mesh):
            return jax.lax.map(one, jnp.arange(num_agents))

    return jax.jit(norms, static_argnums=(3,))


def make_logprob_fn(config: ModelConfig, mesh: Mesh | None = None):
    """Jitted `logprobs(params, batch) -> [M, mb, T]`: log-probs of `labels`, no gradient."""

    def logprobs(params, batch):
        def one(mb):
            return _unless_padding(
                mb,
                lambda: _logp_entropy(params, mb, config, False),
                lambda: jnp.zeros(mb["labels"].shape, jnp.float32),
            )

        with activation_sharding(mesh):
            return jax.lax.map(one, batch)

    return jax.jit(logprobs)
