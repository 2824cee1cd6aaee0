"""Advantage estimators of the single-agent baselines and of AT-GRPO, MARS2 and Dr. MAS.

Each is :func:`marljax.kernels.group_advantages` with the grouping its paper
prescribes; the group key is what distinguishes the methods.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks
from marljax.kernels.groups import group_advantages


def grpo_advantages(rewards, group_ids, num_groups, mask=None, *, eps=1e-6):
    """GRPO (Shao et al. 2024, arXiv 2402.03300): ``(r - mean_g) / (std_g + eps)``.

    ``rewards, group_ids, mask: [N]``; one group per prompt. Returns ``[N]``.
    """
    return group_advantages(rewards, group_ids, num_groups, mask, eps=eps)


def dr_grpo_advantages(rewards, group_ids, num_groups, mask=None):
    """Dr.GRPO (Liu et al. 2025, arXiv 2503.20783): ``r - mean_g``, no std division.

    ``[N] -> [N]``. Pair it with the ``seq-mean-token-sum-norm`` loss aggregation.
    """
    return group_advantages(rewards, group_ids, num_groups, mask, scale="none")


def rloo_advantages(rewards, group_ids, num_groups, mask=None):
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): ``r_i - mean_{j != i} r_j`` within the group.

    Equal to ``G / (G - 1) * (r_i - mean_g)`` for a group of ``G`` valid samples. ``[N] -> [N]``.
    """
    return group_advantages(rewards, group_ids, num_groups, mask, center="loo", scale="none")


def at_grpo_group_ids(problem_ids, turn_ids, agent_ids, *, num_turns: int, num_agents: int):
    """AT-GRPO group key ``(problem, turn, agent)`` flattened to ``(p * T + t) * K + k``. ``[N] -> [N]``."""
    for name, ids in (("problem_ids", problem_ids), ("turn_ids", turn_ids), ("agent_ids", agent_ids)):
        _checks.rank(ids, 1, name)
        _checks.integer(ids, name)
        _checks.same_shape(problem_ids, ids, "problem_ids", name)
    num_turns = _checks.static_int(num_turns, "num_turns")
    num_agents = _checks.static_int(num_agents, "num_agents")
    _checks.ids_in_range(turn_ids, num_turns, "turn_ids")
    _checks.ids_in_range(agent_ids, num_agents, "agent_ids")
    return (problem_ids * num_turns + turn_ids) * num_agents + agent_ids


def at_grpo_advantages(
    rewards,
    problem_ids,
    turn_ids,
    agent_ids,
    *,
    num_problems: int,
    num_turns: int,
    num_agents: int,
    mask=None,
    eps: float = 1e-6,
    scale: str = "std",
):
    """AT-GRPO (Zhao et al. 2025, arXiv 2510.11062): agent- and turn-wise groups.

    Only samples of the same agent at the same turn of the same problem are
    compared: the K candidates branched from one state at a turn. With
    ``g = (p, t, k)``: ``A_i = (r_i - mean_g) / (std_g + eps)``.

    Args:
      rewards: ``[N]`` float; problem_ids, turn_ids, agent_ids: ``[N]`` int.
      num_problems, num_turns, num_agents: static sizes of each id.

    Returns:
      ``[N]`` advantages.
    """
    num_problems = _checks.static_int(num_problems, "num_problems")
    _checks.ids_in_range(problem_ids, num_problems, "problem_ids")
    ids = at_grpo_group_ids(problem_ids, turn_ids, agent_ids, num_turns=num_turns, num_agents=num_agents)
    return group_advantages(rewards, ids, num_problems * num_turns * num_agents, mask, eps=eps, scale=scale)


def mars2_advantages(rewards, tree_ids, num_trees: int, mask=None, *, eps: float = 1e-6, ddof: int = 1):
    """MARS2 (arXiv 2602.07848): one group per search tree, across all its agents and depths.

    ``A_n = (r_n - mean_T) / (std_T + eps)`` over every node ``n`` of tree
    ``T``, whichever agent wrote it and at whatever depth. Trees may have
    different node counts (ragged); pad with ``mask=False``.

    ``rewards, tree_ids, mask: [N]``. Returns ``[N]``.
    """
    return group_advantages(rewards, tree_ids, num_trees, mask, eps=eps, ddof=ddof)


def _agent_moments(rewards, agent_ids, num_agents, mask):
    """Population mean and variance per agent and over the batch (ddof 0)."""
    valid = mask.astype(rewards.dtype)
    values = jnp.where(mask, rewards, 0.0)
    count = jax.ops.segment_sum(valid, agent_ids, num_segments=num_agents)
    mean_k = jax.ops.segment_sum(values, agent_ids, num_segments=num_agents) / jnp.maximum(count, 1)
    dev_k = jnp.where(mask, rewards - mean_k[agent_ids], 0.0)
    var_k = jax.ops.segment_sum(dev_k**2, agent_ids, num_segments=num_agents) / jnp.maximum(count, 1)
    mean = jnp.sum(values) / jnp.maximum(jnp.sum(valid), 1)
    var = jnp.sum(jnp.where(mask, (rewards - mean) ** 2, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
    return count, mean_k, var_k, mean, var


def amplification_factor(rewards, agent_ids, num_agents: int, mask=None, *, eps: float = 1e-6):
    """Dr. MAS diagnostic (arXiv 2602.08847): ``(sigma_k^2 + (mu_k - mu)^2) / sigma^2`` per agent.

    The factor by which normalising with the global ``(mu, sigma)`` instead of
    agent ``k``'s own ``(mu_k, sigma_k)`` scales the second moment of that
    agent's advantages, hence of its score-function gradient when the score
    is independent of the reward noise. Population moments (ddof 0) over
    valid samples; an agent with no valid sample gets 0.

    ``rewards, agent_ids, mask: [N]``. Returns ``[K]``.
    """
    _checks_agents(rewards, agent_ids, num_agents)
    mask = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    count, mean_k, var_k, mean, var = _agent_moments(rewards, agent_ids, num_agents, mask)
    factor = (var_k + (mean_k - mean) ** 2) / (var + eps**2)
    return jnp.where(count > 0, factor, 0.0)


def _checks_agents(rewards, agent_ids, num_agents):
    _checks.rank(rewards, 1, "rewards")
    _checks.floating(rewards, "rewards")
    _checks.integer(agent_ids, "agent_ids")
    _checks.same_shape(rewards, agent_ids, "rewards", "agent_ids")
    _checks.static_int(num_agents, "num_agents")
    _checks.ids_in_range(agent_ids, num_agents, "agent_ids")


def dr_mas_advantages(
    rewards,
    agent_ids,
    num_agents: int,
    mask=None,
    *,
    group_ids=None,
    num_groups: int | None = None,
    eps: float = 1e-6,
    ddof: int = 1,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Dr. MAS (arXiv 2602.08847): agent-wise normalisation.

    Each agent's advantages use that agent's own statistics, computed over
    the steps where it acted: ``A_i = (r_i - mu_k) / (sigma_k + eps)`` with
    ``k`` the agent of sample ``i``. With ``group_ids`` the statistics are
    per agent inside each problem group (key ``g * K + k``); without, per
    agent over the whole batch.

    Args:
      rewards, agent_ids, mask: ``[N]``.
      num_agents: static K.
      group_ids, num_groups: optional ``[N]`` problem groups and their static count.

    Returns:
      ``(advantages [N], metrics)`` where metrics holds ``amplification [K]``
      (see :func:`amplification_factor`), ``agent_mean [K]``, ``agent_std [K]``
      (population) and ``agent_count [K]``.
    """
    _checks_agents(rewards, agent_ids, num_agents)
    if group_ids is None:
        keys, num_keys = agent_ids, num_agents
    else:
        if num_groups is None:
            raise ValueError("argument `num_groups` is required when `group_ids` is given")
        _checks.integer(group_ids, "group_ids")
        _checks.same_shape(rewards, group_ids, "rewards", "group_ids")
        num_groups = _checks.static_int(num_groups, "num_groups")
        _checks.ids_in_range(group_ids, num_groups, "group_ids")
        keys, num_keys = group_ids * num_agents + agent_ids, num_groups * num_agents
    advantages = group_advantages(rewards, keys, num_keys, mask, eps=eps, ddof=ddof)
    valid = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    count, mean_k, var_k, _, _ = _agent_moments(rewards, agent_ids, num_agents, valid)
    metrics = {
        "amplification": amplification_factor(rewards, agent_ids, num_agents, valid, eps=eps),
        "agent_mean": mean_k,
        "agent_std": jnp.sqrt(var_k),
        "agent_count": count,
    }
    return advantages, metrics


def global_advantages(rewards, mask=None, *, eps: float = 1e-6, ddof: int = 1) -> chex.Array:
    """Batch-wide normalisation ``(r - mu) / (sigma + eps)``: the baseline Dr. MAS compares against. ``[N] -> [N]``."""
    _checks.rank(rewards, 1, "rewards")
    ids = jnp.zeros(jnp.shape(rewards), dtype=jnp.int32)
    return group_advantages(rewards, ids, 1, mask, eps=eps, ddof=ddof)
