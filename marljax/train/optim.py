"""The optax optimiser of a policy, built from its `OptimizerConfig`, and what its state records.

Optional clipping by global norm, then AdamW / Adam / SGD on the learning-rate
schedule. Two optax wrappers are deliberately not used, because each changes
the last bit of every finite step (XLA compiles the update differently), so a
run would no longer reproduce: `optax.inject_hyperparams` (the rate becomes a
runtime scalar instead of a folded constant; `step_metrics` evaluates the
schedule for the log instead) and `optax.apply_if_finite` (the update runs in a
`lax.cond` branch; `marljax.train.update.guarded_step` selects the old or new
parameters after the step instead).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from marljax.train.config import OptimizerConfig


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """Linear warm-up to `lr`, then constant or cosine decay to `lr * min_lr_ratio`."""
    if cfg.schedule == "constant":
        if cfg.warmup_steps:
            return optax.join_schedules(
                [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), optax.constant_schedule(cfg.lr)],
                [cfg.warmup_steps],
            )
        return optax.constant_schedule(cfg.lr)
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=cfg.lr,
            warmup_steps=cfg.warmup_steps,
            decay_steps=cfg.warmup_steps + cfg.decay_steps,
            end_value=cfg.lr * cfg.min_lr_ratio,
        )
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """The policy's optimiser: see the module doc."""
    schedule = make_schedule(cfg)
    if cfg.name == "adamw":
        opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    elif cfg.name == "adam":
        opt = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    elif cfg.name == "sgd":
        opt = optax.sgd(schedule)
    else:
        raise ValueError(f"unknown optimizer {cfg.name!r}")
    if cfg.max_grad_norm is not None:
        opt = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
    return opt


def applied_steps(opt_state: Any) -> jax.Array:
    """Steps applied so far by `make_optimizer`'s optimiser: its schedule's step count (a skipped
    step leaves the state, and so the count, as it was)."""
    (_, count), *_ = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    return count


def step_metrics(
    opt_state: Any, skipped: jax.Array, schedule: optax.Schedule | None = None
) -> dict[str, jax.Array]:
    """What the step that produced `opt_state` did, as float32 scalars: `skipped` (1 when it was
    skipped as non-finite) and, given the optimiser's `schedule`, `lr`, the learning rate of the
    last applied step (before any, of the first)."""
    out = {"skipped": skipped}
    if schedule is not None:
        out["lr"] = jnp.asarray(schedule(jnp.maximum(applied_steps(opt_state) - 1, 0)), jnp.float32)
    return out
