"""The optax optimiser of a policy, built from its `OptimizerConfig`, and what its state records.

Layers, outside in:

- `optax.apply_if_finite`: a step whose gradients hold a NaN or inf is
  skipped (parameters and inner state kept) and counted in the state;
- `optax.inject_hyperparams`: the learning rate of the schedule at the
  state's step count, kept in the state as a float32 scalar;
- optional clipping by global norm, then AdamW / Adam / SGD.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from marljax.train.config import OptimizerConfig

# apply_if_finite applies an update anyway after this many non-finite ones in a row; an int32 count
# saturates here, so a non-finite update is never applied: it would destroy the parameters.
NEVER_APPLY_NONFINITE = int(jnp.iinfo(jnp.int32).max)


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """Linear warm-up to `lr`, then constant or cosine decay to `lr * min_lr_ratio`."""
    if cfg.schedule == "constant":
        if cfg.warmup_steps:
            return optax.join_schedules(
                [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)],
                [cfg.warmup_steps])
        return optax.constant_schedule(cfg.lr)
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps,
            decay_steps=cfg.warmup_steps + cfg.decay_steps, end_value=cfg.lr * cfg.min_lr_ratio)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """The policy's optimiser: see the module doc for its layers."""

    def clipped_optimizer(learning_rate: jax.Array) -> optax.GradientTransformation:
        def rate(count: jax.Array) -> jax.Array:
            # As a schedule, the rate is cast to each gradient's dtype before it scales the update, so
            # bfloat16 parameters get bfloat16 updates (apply_if_finite needs one dtype either way).
            del count  # inject_hyperparams has evaluated the schedule at the step count already
            return learning_rate

        if cfg.name == "adamw":
            opt = optax.adamw(rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
        elif cfg.name == "adam":
            opt = optax.adam(rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
        elif cfg.name == "sgd":
            opt = optax.sgd(rate)
        else:
            raise ValueError(f"unknown optimizer {cfg.name!r}")
        if cfg.max_grad_norm is not None:
            opt = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
        return opt

    # Only the learning rate is injected: the other settings stay Python constants, as the optimiser
    # would see them without the wrapper. float32 whatever the parameters' dtype, so that the state
    # records the schedule's value rather than its bfloat16 rounding.
    scheduled = optax.inject_hyperparams(clipped_optimizer, hyperparam_dtype=jnp.float32)
    return optax.apply_if_finite(scheduled(learning_rate=make_schedule(cfg)), NEVER_APPLY_NONFINITE)


def applied_steps(opt_state: optax.ApplyIfFiniteState) -> jax.Array:
    """Steps applied so far by `make_optimizer`'s optimiser (skipped ones not counted)."""
    return opt_state.inner_state.count


def step_metrics(opt_state: Any) -> dict[str, jax.Array]:
    """What the step that produced `opt_state` did, as float32 scalars.

    `skipped`: 1 when the step was skipped as non-finite, else 0; `lr`: the
    learning rate of the last applied step (before any, of the first). A bare
    optax state (not from `make_optimizer`) never skips and records no rate.
    """
    if not isinstance(opt_state, optax.ApplyIfFiniteState):
        return {"skipped": jnp.zeros((), jnp.float32)}
    return {"skipped": 1.0 - opt_state.last_finite.astype(jnp.float32),
            "lr": opt_state.inner_state.hyperparams["learning_rate"]}
