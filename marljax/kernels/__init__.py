"""Pure-array credit-assignment and loss kernels.

Arrays in, arrays out: no model, no I/O, no Python state. Every kernel checks
shapes, dtypes and options at trace time (errors name the argument), runs
under ``jax.jit`` with its options static and under ``jax.vmap``.
"""

from marljax.kernels.advantages import (
    amplification_factor,
    at_grpo_advantages,
    at_grpo_group_ids,
    dr_grpo_advantages,
    dr_mas_advantages,
    global_advantages,
    grpo_advantages,
    mars2_advantages,
    rloo_advantages,
)
from marljax.kernels.groups import dense_group_advantages, group_advantages, normalize_group
from marljax.kernels.losses import (
    AGG_MODES,
    LOSS_TYPES,
    POLICY_RATIOS,
    aggregate_loss,
    clipped_surrogate,
    entropy_from_logits,
    kl_penalty,
    log_ratio,
    logprobs_from_logits,
    overlong_penalty,
    policy_loss,
    policy_loss_per_token,
    surrogate_metrics,
    tis_weights,
)
from marljax.kernels.magrpo import magrpo_advantages, magrpo_node_advantages, tree_returns
from marljax.kernels.shapley import (
    coalition_index,
    leave_one_out_credit,
    sampled_shapley_values,
    shapley_values,
    sharp_advantages,
    sharp_rewards,
)

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
    "amplification_factor",
    "at_grpo_advantages",
    "at_grpo_group_ids",
    "coalition_index",
    "dense_group_advantages",
    "dr_grpo_advantages",
    "dr_mas_advantages",
    "global_advantages",
    "group_advantages",
    "grpo_advantages",
    "leave_one_out_credit",
    "magrpo_advantages",
    "magrpo_node_advantages",
    "mars2_advantages",
    "normalize_group",
    "rloo_advantages",
    "sampled_shapley_values",
    "shapley_values",
    "sharp_advantages",
    "sharp_rewards",
    "tree_returns",
]
