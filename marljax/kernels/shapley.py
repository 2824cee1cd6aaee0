"""SHARP (arXiv 2602.08335): Shapley credit for each agent, and the three-level reward.

The value of a coalition S of agents is the task outcome re-evaluated with
the outputs of the agents outside S masked out. A value table holds
``v(S)`` for all ``2^K`` coalitions, indexed by bitmask: bit ``i`` of the
index is set when agent ``i`` is in the coalition (``v[0]`` is the empty
team, ``v[2^K - 1]`` the full one).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from marljax.kernels import _checks
from marljax.kernels.groups import group_advantages

MAX_EXACT_AGENTS = 20  # 2^20 table entries; beyond, use sampled_shapley_values.


def _num_agents_of_table(values) -> int:
    size = jnp.shape(values)[-1] if jnp.ndim(values) else 0
    num_agents = size.bit_length() - 1
    if size < 2 or size != 1 << num_agents:
        raise ValueError(
            f"argument `values` must have a last axis of size 2^K (one entry per coalition), got {size}"
        )
    if num_agents > MAX_EXACT_AGENTS:
        raise ValueError(
            f"argument `values` has K={num_agents} agents; use sampled_shapley_values beyond {MAX_EXACT_AGENTS}"
        )
    return num_agents


def _shapley_terms(num_agents: int):
    """Per agent i: coalitions S without i, S + {i}, and weight |S|! (K - |S| - 1)! / K!."""
    coalitions = np.arange(1 << num_agents)
    sizes = np.array([bin(s).count("1") for s in coalitions])
    without, joined, weights = [], [], []
    for i in range(num_agents):
        s = coalitions[(coalitions >> i) & 1 == 0]
        without.append(s)
        joined.append(s | (1 << i))
        k = sizes[s]
        weights.append(
            [math.factorial(n) * math.factorial(num_agents - n - 1) / math.factorial(num_agents) for n in k]
        )
    return np.stack(without), np.stack(joined), np.array(weights)


def shapley_values(values: chex.Array) -> jax.Array:
    """Exact Shapley values from a full coalition value table (Shapley 1953).

    ``phi_i = sum_{S not containing i} |S|! (K - |S| - 1)! / K! * (v(S + i) - v(S))``.
    Costs ``K * 2^(K-1)`` differences: fine up to K of about 12-16.

    Args:
      values: ``[..., 2^K]`` coalition values, bitmask-indexed (module docstring).

    Returns:
      ``[..., K]`` Shapley value of each agent; they sum to ``v(all) - v(empty)``.
    """
    _checks.floating(values, "values")
    num_agents = _num_agents_of_table(values)
    without, joined, weights = _shapley_terms(num_agents)
    marginal = values[..., joined] - values[..., without]
    return jnp.sum(marginal * weights.astype(values.dtype), axis=-1)


def leave_one_out_credit(values: chex.Array) -> jax.Array:
    """Counterfactual credit ``v(all) - v(all without i)`` from a value table.

    ``[..., 2^K] -> [..., K]``: each agent's marginal contribution to the full
    team (mask one agent's output, re-evaluate the outcome).
    """
    _checks.floating(values, "values")
    num_agents = _num_agents_of_table(values)
    full = (1 << num_agents) - 1
    others = np.array([full ^ (1 << i) for i in range(num_agents)])
    return values[..., full : full + 1] - values[..., others]


def coalition_index(members: chex.Array) -> jax.Array:
    """Bitmask index of a coalition: ``members [..., K]`` bool -> ``[...]`` int."""
    num_agents = jnp.shape(members)[-1]
    return jnp.sum(jnp.asarray(members, jnp.int32) << jnp.arange(num_agents), axis=-1)


def sampled_shapley_values(
    value_fn: Callable[[jax.Array], jax.Array],
    num_agents: int,
    key: chex.PRNGKey,
    num_permutations: int,
    *,
    antithetic: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Monte Carlo Shapley values by permutation sampling (Castro et al. 2009).

    For each random order of the agents, an agent's marginal contribution is
    ``v(predecessors + i) - v(predecessors)``; the Shapley value is its mean
    over uniformly random orders. With ``antithetic=True`` each order is
    paired with its reverse (still unbiased, usually lower variance).
    Every estimate satisfies efficiency exactly.

    Args:
      value_fn: maps a coalition ``[K]`` bool to a scalar value; ``vmap``ped.
      num_agents: static K.
      key: PRNG key.
      num_permutations: static number of orders (doubled by antithetic pairs).

    Returns:
      ``(estimate [K], standard_error [K])``; the standard error is over
      independent (pairs of) orders.
    """
    num_agents = _checks.static_int(num_agents, "num_agents")
    num_permutations = _checks.static_int(num_permutations, "num_permutations")
    keys = jax.random.split(key, num_permutations)
    orders = jax.vmap(lambda k: jax.random.permutation(k, num_agents))(keys)  # [P, K]
    if antithetic:
        orders = jnp.concatenate([orders, orders[:, ::-1]], axis=0)
    # rank[p, i] = position of agent i in order p; coalition t holds agents ranked < t.
    ranks = jnp.argsort(orders, axis=1)
    steps = jnp.arange(num_agents + 1)
    coalitions = ranks[:, None, :] < steps[None, :, None]  # [P', K + 1, K]
    values = jax.vmap(jax.vmap(value_fn))(coalitions)  # [P', K + 1]
    gains = values[:, 1:] - values[:, :-1]  # gain of the agent added at step t
    marginal = jnp.take_along_axis(gains, ranks, axis=1)  # [P', K] per agent
    if antithetic:
        marginal = 0.5 * (marginal[:num_permutations] + marginal[num_permutations:])
    estimate = jnp.mean(marginal, axis=0)
    stderr = (
        jnp.std(marginal, axis=0, ddof=1) / jnp.sqrt(num_permutations)
        if num_permutations > 1
        else jnp.full_like(estimate, jnp.inf)
    )
    return estimate, stderr


def sharp_rewards(
    global_reward: chex.Array,
    shapley_credit: chex.Array,
    process_reward: chex.Array | None = None,
    *,
    global_weight: float = 1.0,
    shapley_weight: float = 1.0,
    process_weight: float = 0.0,
) -> jax.Array:
    """SHARP's three-level reward of each agent.

    ``r_k = w_g * R_global + w_s * phi_k + w_p * R_process_k``: the team's
    broadcast outcome, the agent's Shapley (or counterfactual) credit and its
    own process reward (e.g. tool-call success).

    Args:
      global_reward: ``[...]`` outcome of each trajectory.
      shapley_credit: ``[..., K]`` credit of each agent.
      process_reward: optional ``[..., K]``.

    Returns:
      ``[..., K]`` per-agent rewards.
    """
    _checks.floating(global_reward, "global_reward")
    _checks.floating(shapley_credit, "shapley_credit")
    if jnp.shape(shapley_credit)[:-1] != jnp.shape(global_reward):
        raise ValueError(
            f"argument `shapley_credit` has shape {jnp.shape(shapley_credit)}; expected "
            f"{jnp.shape(global_reward)} + (K,) to match `global_reward`"
        )
    reward = global_weight * global_reward[..., None] + shapley_weight * shapley_credit
    if process_reward is not None:
        _checks.same_shape(shapley_credit, process_reward, "shapley_credit", "process_reward")
        reward = reward + process_weight * process_reward
    return reward


def sharp_advantages(agent_rewards, group_ids, num_groups: int, mask=None, *, eps: float = 1e-6):
    """SHARP advantages: each agent's rewards normalised among that agent's own trajectory group.

    Args:
      agent_rewards: ``[N, K]`` per-agent rewards of N trajectories (:func:`sharp_rewards`).
      group_ids: ``[N]`` trajectory group (problem) of each trajectory.
      mask: optional ``[N, K]`` bool, True where agent k acted in trajectory n.

    Returns:
      ``[N, K]``: ``(r_nk - mean_{g,k}) / (std_{g,k} + eps)``.
    """
    _checks.rank(agent_rewards, 2, "agent_rewards")
    _checks.rank(group_ids, 1, "group_ids")
    num_traj, num_agents = jnp.shape(agent_rewards)
    if jnp.shape(group_ids)[0] != num_traj:
        raise ValueError(
            f"argument `group_ids` has {jnp.shape(group_ids)[0]} entries but `agent_rewards` has {num_traj} rows"
        )
    mask = _checks.mask_or_ones(mask, agent_rewards, "mask", "agent_rewards")
    _checks.integer(group_ids, "group_ids")
    num_groups = _checks.static_int(num_groups, "num_groups")
    _checks.ids_in_range(group_ids, num_groups, "group_ids")
    keys = group_ids[:, None] * num_agents + jnp.arange(num_agents)[None, :]
    flat = group_advantages(
        agent_rewards.reshape(-1), keys.reshape(-1), num_groups * num_agents, mask.reshape(-1), eps=eps
    )
    return flat.reshape(num_traj, num_agents)
