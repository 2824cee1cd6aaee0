"""MAGRPO (Liu et al. 2025, arXiv 2508.04652): returns-to-go on the joint rollout tree.

At every node of the rollout tree each of the N agents samples G
completions. The joint actions are the G aligned tuples (``mode="aligned"``:
agent i's g-th completion goes with every other agent's g-th) or all G^N
combinations (``mode="cross"``). Each joint action is a child node with a
joint reward ``r``; its return-to-go is ``R = r + gamma * mean(R of its
children)``. Agent i's completion is credited with the return of the joint
action it made (aligned) or the sum of the returns of all joint actions it
took part in (cross), and compared with its G siblings: the other
completions agent i sampled at the same node.

Flat tree layout (ragged, static shapes): joint-action nodes ``j = 0..M-1``
with ``parent_ids [M]`` (``-1`` for the children of the episode's root) and
``sibling_ids [M]``, the joint action's index among its siblings: ``g`` in
``[0, G)`` when aligned, the row-major index of ``(g_0, ..., g_{N-1})`` in
``[0, G^N)`` (agent 0 slowest) when crossed.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks
from marljax.kernels.groups import group_advantages, normalize_group

MODES = ("aligned", "cross")


def _check_tree(rewards, parent_ids):
    _checks.rank(rewards, 1, "rewards")
    _checks.floating(rewards, "rewards")
    _checks.integer(parent_ids, "parent_ids")
    _checks.same_shape(rewards, parent_ids, "rewards", "parent_ids")
    if _checks.is_concrete(parent_ids):
        _checks.ids_in_range(parent_ids + 1, jnp.shape(rewards)[0] + 1, "parent_ids (plus one)")


def tree_returns(rewards, parent_ids, *, gamma: float, max_depth: int, mask=None) -> jax.Array:
    """Returns-to-go on a tree: ``R_j = r_j + gamma * mean_{c in children(j)} R_c``.

    A leaf's return is its reward; masked nodes are no one's children and
    return 0. ``max_depth`` is the number of levels (turns); the backup runs
    ``max_depth - 1`` sweeps over all nodes, exact for trees no deeper.

    Args:
      rewards: ``[M]`` float joint reward of each node.
      parent_ids: ``[M]`` int parent node, ``-1`` for top-level nodes.
      gamma: static discount. max_depth: static number of levels.
      mask: optional ``[M]`` bool valid nodes.

    Returns:
      ``[M]`` returns-to-go.
    """
    _check_tree(rewards, parent_ids)
    gamma = _checks.static_float(gamma, "gamma", minimum=0.0)
    max_depth = _checks.static_int(max_depth, "max_depth")
    mask = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    num_nodes = jnp.shape(rewards)[0]
    # Segment 0 collects the top-level nodes; segment j + 1 the children of node j.
    segment = parent_ids + 1
    n_children = jax.ops.segment_sum(mask.astype(rewards.dtype), segment, num_nodes + 1)[1:]
    own = jnp.where(mask, rewards, 0.0)

    def backup(_, returns):
        child_sum = jax.ops.segment_sum(jnp.where(mask, returns, 0.0), segment, num_nodes + 1)[1:]
        child_mean = jnp.where(n_children > 0, child_sum / jnp.maximum(n_children, 1), 0.0)
        return jnp.where(mask, own + gamma * child_mean, 0.0)

    return jax.lax.fori_loop(0, max_depth - 1, backup, own)


def _agent_choice(sibling_ids, agent, num_agents, group_size, mode):
    """Index of agent's own completion inside each joint action."""
    if mode == "aligned":
        return sibling_ids
    return (sibling_ids // group_size ** (num_agents - 1 - agent)) % group_size


def magrpo_advantages(
    returns,
    parent_ids,
    sibling_ids,
    *,
    num_agents: int,
    group_size: int,
    mode: str = "aligned",
    mask=None,
    scale: str = "none",
    eps: float = 1e-6,
) -> jax.Array:
    """MAGRPO advantages of every agent's completion, per joint-action node.

    With ``C(p, i, g)`` the credit of agent i's g-th completion at node p
    (aligned: the return of the joint action ``g``; cross: the sum of the
    returns of the ``G^(N-1)`` joint actions that used it), the advantage is
    ``C(p, i, g) - mean_g' C(p, i, g')``: MAGRPO's group-relative baseline
    over siblings, per agent (``scale="std"`` also divides by their std).

    Args:
      returns: ``[M]`` returns-to-go of the joint-action nodes (see :func:`tree_returns`).
      parent_ids: ``[M]`` int, ``-1`` for top-level nodes.
      sibling_ids: ``[M]`` int joint-action index among its siblings (module docstring).
      num_agents, group_size: static N and G.
      mode: ``"aligned"`` or ``"cross"``.
      mask: optional ``[M]`` bool valid nodes.

    Returns:
      ``[M, N]``: entry ``[j, i]`` is the advantage of the completion agent i
      contributed to joint action j (in cross mode it repeats across the
      joint actions sharing that completion).
    """
    _check_tree(returns, parent_ids)
    _checks.integer(sibling_ids, "sibling_ids")
    _checks.same_shape(returns, sibling_ids, "returns", "sibling_ids")
    num_agents = _checks.static_int(num_agents, "num_agents")
    group_size = _checks.static_int(group_size, "group_size")
    _checks.choice(mode, "mode", MODES)
    width = group_size if mode == "aligned" else group_size**num_agents
    _checks.ids_in_range(sibling_ids, width, "sibling_ids")
    mask = _checks.mask_or_ones(mask, returns, "mask", "returns")
    num_nodes = jnp.shape(returns)[0]
    num_completions = (num_nodes + 1) * num_agents * group_size
    columns = []
    for agent in range(num_agents):
        choice = _agent_choice(sibling_ids, agent, num_agents, group_size, mode)
        # Completion (parent slot, agent, g) flattened; slot 0 is the root.
        completion = ((parent_ids + 1) * num_agents + agent) * group_size + choice
        credit = jax.ops.segment_sum(jnp.where(mask, returns, 0.0), completion, num_completions)
        present = jax.ops.segment_sum(mask.astype(jnp.int32), completion, num_completions) > 0
        siblings = jnp.arange(num_completions) // group_size
        adv = group_advantages(credit, siblings, num_completions // group_size, present, scale=scale, eps=eps)
        columns.append(jnp.where(mask, adv[completion], 0.0))
    return jnp.stack(columns, axis=1)


def magrpo_node_advantages(
    joint_returns: chex.Array, *, mode: str = "aligned", scale: str = "none", eps: float = 1e-6
) -> jax.Array:
    """Unbatched dense kernel for one node: ``[N, G]`` advantages of each agent's completions.

    Args:
      joint_returns: aligned mode, ``[G]``: the returns of the G joint actions
        (every agent's g-th completion shares the g-th return); cross mode,
        ``[G] * N`` with one axis per agent: the return of each combination.

    Returns:
      cross: ``[N, G]``, each agent's credit minus its sibling mean; aligned:
      ``[1, G]``, the same row for every agent (broadcast it over N).
    """
    _checks.floating(joint_returns, "joint_returns")
    _checks.choice(mode, "mode", MODES)
    if mode == "aligned":
        _checks.rank(joint_returns, 1, "joint_returns")
        credits = joint_returns[None]
    else:
        num_agents = jnp.ndim(joint_returns)
        all_axes = tuple(range(num_agents))
        credits = jnp.stack([jnp.sum(joint_returns, axis=all_axes[:i] + all_axes[i + 1 :]) for i in all_axes])
    return jax.vmap(lambda c: normalize_group(c, scale=scale, eps=eps))(credits)
