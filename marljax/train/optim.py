"""optax optimisers and learning-rate schedules from a policy's optimizer settings."""

from __future__ import annotations

from typing import Any

import optax


def make_schedule(cfg: Any) -> optax.Schedule:
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


def make_optimizer(cfg: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, schedule): optional clipping by global norm, then AdamW / Adam / SGD."""
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
    return opt, schedule
