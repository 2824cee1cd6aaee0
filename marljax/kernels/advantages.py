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


AT_GRPO_KEYS = ("problem_turn_agent", "pooled", "problem")


def at_grpo_group_ids(
    problem_ids,
    turn_ids,
    agent_ids,
    *,
    num_turns: int,
    num_agents: int,
    key: str = "problem_turn_agent",
    pool_size: int = 1,
):
    """Group ids ``[N] -> [N]`` of AT-GRPO, in ``[0, P * T * K)`` for ``P`` problems.

    ``key``:
      * ``"problem_turn_agent"`` (the paper's): ``(p, t, k)`` flattened to ``(p * T + t) * K + k``;
      * ``"pooled"``: ``(p // pool_size, t, k)``, ``pool_size`` consecutive problems per group, as
        PettingLLMs' code groups (its uid divides an already per-problem index by the sample count
        again); the same agent and turn, but several problems compared together;
      * ``"problem"``: ``p``, one group per problem across all its turns and agents (plain GRPO's
        prompt group).
    """
    for name, ids in (("problem_ids", problem_ids), ("turn_ids", turn_ids), ("agent_ids", agent_ids)):
        _checks.rank(ids, 1, name)
        _checks.integer(ids, name)
        _checks.same_shape(problem_ids, ids, "problem_ids", name)
    num_turns = _checks.static_int(num_turns, "num_turns")
    num_agents = _checks.static_int(num_agents, "num_agents")
    _checks.choice(key, "key", AT_GRPO_KEYS)
    pool_size = _checks.static_int(pool_size, "pool_size", minimum=1)
    _checks.ids_in_range(turn_ids, num_turns, "turn_ids")
    _checks.ids_in_range(agent_ids, num_agents, "agent_ids")
    if key == "problem":
        return problem_ids
    if key == "pooled":
        problem_ids = problem_ids // pool_size
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
    key: str = "problem_turn_agent",
    pool_size: int = 1,
):
    """AT-GRPO (Zhao et al. 2025, arXiv 2510.11062): agent- and turn-wise groups.

    Only samples of the same agent at the same turn of the same problem are
    compared: the K candidates branched from one state at a turn. With
    ``g = (p, t, k)``: ``A_i = (r_i - mean_g) / (std_g + eps)``.

    Args:
      rewards: ``[N]`` float; problem_ids, turn_ids, agent_ids: ``[N]`` int.
      num_problems, num_turns, num_agents: static sizes of each id.
      key, pool_size: the grouping (see :func:`at_grpo_group_ids`); the default is the paper's,
        the others are there to measure what the key changes.

    Returns:
      ``[N]`` advantages.
    """
    num_problems = _checks.static_int(num_problems, "num_problems")
    _checks.ids_in_range(problem_ids, num_problems, "problem_ids")
    ids = at_grpo_group_ids(
        problem_ids,
        turn_ids,
        agent_ids,
        num_turns=num_turns,
        num_agents=num_agents,
        key=key,
        pool_size=pool_size,
    )
    return group_advantages(rewards, ids, num_problems * num_turns * num_agents, mask, eps=eps, scale=scale)


def mars2_advantages(rewards, tree_ids, num_trees: int, mask=None, *, eps: float = 1e-6, ddof: int = 1):
    """MARS2 (arXiv 2602.07848): one group per search tree, across all its agents and depths.

    ``A_n = (r_n - mean_T) / (std_T + eps)`` over every node ``n`` of tree
    ``T``, whichever agent wrote it and at whatever depth. Trees may have
    different node counts (ragged); pad with ``mask=False``.

    ``rewards, tree_ids, mask: [N]``. Returns ``[N]``.
    """
    return group_advantages(rewards, tree_ids, num_trees, mask, eps=eps, ddof=ddof)


def _moments(rewards, keys, num_keys, valid):
    """Count, population mean and variance (ddof 0) of the valid rewards of each key `[num_keys]`."""
    w = valid.astype(rewards.dtype)
    count = jax.ops.segment_sum(w, keys, num_segments=num_keys)
    mean = jax.ops.segment_sum(rewards * w, keys, num_segments=num_keys) / jnp.maximum(count, 1)
    dev = jnp.where(valid, rewards - mean[keys], 0.0)
    var = jax.ops.segment_sum(dev**2, keys, num_segments=num_keys) / jnp.maximum(count, 1)
    return count, mean, var


def amplification_factor(
    rewards,
    agent_ids,
    num_agents: int,
    mask=None,
    *,
    group_ids=None,
    num_groups: int | None = None,
):
    """Dr. MAS diagnostic (arXiv 2602.08847): how much one normalisation shared by all agents scales
    each agent's advantage second moment, against agent-wise normalisation.

    Within a normalisation group g (a problem's samples; one group without
    ``group_ids``), global normalisation gives agent ``k``'s samples the second
    moment ``f_gk = (sigma_gk^2 + (mu_gk - mu_g)^2) / sigma_g^2`` where agent-wise
    normalisation gives 1. The factor is the mean of ``f_gk`` over agent k's
    samples, ``sum_g n_gk f_gk / sum_g n_gk``, over the groups where agent k's
    own rewards vary: the ratio of the two gradient second moments when the
    score is independent of the reward noise. The Lemma assumes
    ``sigma_gk > 0``; in a group where agent k's rewards are all equal,
    agent-wise normalisation gives its samples zero advantage (no gradient)
    while the shared one gives them ``(mu_gk - mu_g) / sigma_g``, an unbounded
    ratio that no finite ``f_gk`` stands for, so those samples are left out
    (as are groups where no reward varies: both give zero advantages). A
    batch-wide ``(mu, sigma)`` over groups of different difficulty would count
    the spread between problems, which per-problem advantages never see.
    Population moments (ddof 0) over valid samples; an agent with no sample in
    such a group gets 0.

    ``rewards, agent_ids, mask, group_ids: [N]``. Returns ``[K]``.
    """
    _checks_agents(rewards, agent_ids, num_agents)
    valid = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    groups, G = _groups_or_one(rewards, group_ids, num_groups)
    K = num_agents
    keys = groups * K + agent_ids  # [G * K], key g * K + k
    n_gk, mean_gk, var_gk = _moments(rewards, keys, G * K, valid)
    _, mean_g, var_g = _moments(rewards, groups, G, valid)
    # compared exactly: a float variance of equal rewards need not be 0. The group's rewards vary too
    high = jax.ops.segment_max(jnp.where(valid, rewards, -jnp.inf), keys, num_segments=G * K)
    varies = high > jax.ops.segment_min(jnp.where(valid, rewards, jnp.inf), keys, num_segments=G * K)
    f = (var_gk + (mean_gk - jnp.repeat(mean_g, K)) ** 2) / jnp.where(varies, jnp.repeat(var_g, K), 1.0)
    weight = jnp.where(varies, n_gk, 0.0).reshape(G, K)
    total = jnp.sum(weight, axis=0)
    return jnp.where(total > 0, jnp.sum(weight * f.reshape(G, K), axis=0) / jnp.maximum(total, 1), 0.0)


def _groups_or_one(rewards, group_ids, num_groups):
    if group_ids is None:
        return jnp.zeros(jnp.shape(rewards), jnp.int32), 1
    if num_groups is None:
        raise ValueError("argument `num_groups` is required when `group_ids` is given")
    _checks.integer(group_ids, "group_ids")
    _checks.same_shape(rewards, group_ids, "rewards", "group_ids")
    num_groups = _checks.static_int(num_groups, "num_groups")
    _checks.ids_in_range(group_ids, num_groups, "group_ids")
    return group_ids, num_groups


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
    singleton: str = "zero",
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
      singleton: "zero" (default) or "raw": what an agent's lone sample in its group gets
        (see :func:`group_advantages`; DrMAS's reference code gives the raw reward).

    Returns:
      ``(advantages [N], metrics)`` where metrics holds ``amplification [K]``
      (see :func:`amplification_factor`), ``agent_mean [K]``, ``agent_std [K]``
      (population) and ``agent_count [K]``.
    """
    _checks_agents(rewards, agent_ids, num_agents)
    groups, G = _groups_or_one(rewards, group_ids, num_groups)
    keys = groups * num_agents + agent_ids
    advantages = group_advantages(
        rewards, keys, G * num_agents, mask, eps=eps, ddof=ddof, singleton=singleton
    )
    valid = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    count, mean_k, var_k = _moments(rewards, agent_ids, num_agents, valid)
    metrics = {
        "amplification": amplification_factor(
            rewards, agent_ids, num_agents, valid, group_ids=groups, num_groups=G
        ),
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
