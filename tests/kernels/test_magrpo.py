"""MAGRPO returns-to-go and joint-mode credit."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marljax import kernels


def build_tree(num_agents, group_size, turns, mode, rng):
    """A full joint rollout tree, built node by node; also returns a recursive reference."""
    width = group_size if mode == "aligned" else group_size**num_agents
    parent, sibling, depth, reward = [], [], [], []

    def expand(node, level):
        if level == turns:
            return
        for s in range(width):
            parent.append(node)
            sibling.append(s)
            depth.append(level)
            reward.append(float(rng.integers(0, 5)))
            expand(len(parent) - 1, level + 1)

    expand(-1, 0)
    return np.array(reward, np.float32), np.array(parent, np.int32), np.array(sibling, np.int32), width


def reference_returns(reward, parent, gamma):
    children = {j: [c for c in range(len(parent)) if parent[c] == j] for j in range(len(parent))}

    def ret(j):
        kids = children[j]
        return reward[j] + (gamma * np.mean([ret(c) for c in kids]) if kids else 0.0)

    return np.array([ret(j) for j in range(len(parent))])


def reference_advantages(returns, parent, sibling, num_agents, group_size, mode):
    out = np.zeros((len(parent), num_agents))
    for p in set(parent.tolist()):
        kids = [j for j in range(len(parent)) if parent[j] == p]
        for i in range(num_agents):

            def choice(s, i=i):
                if mode == "aligned":
                    return s
                digits = np.unravel_index(s, (group_size,) * num_agents)
                return digits[i]

            credit = np.zeros(group_size)
            for j in kids:
                credit[choice(sibling[j])] += returns[j]
            for j in kids:
                out[j, i] = credit[choice(sibling[j])] - credit.mean()
    return out


def test_tree_returns_hand_computed():
    # root children: n0 (r=1) with children n2 (r=2), n3 (r=4); n1 (r=0) leaf.
    r = kernels.tree_returns(
        jnp.array([1.0, 0.0, 2.0, 4.0]), jnp.array([-1, -1, 0, 0]), gamma=0.5, max_depth=2
    )
    np.testing.assert_allclose(r, [1 + 0.5 * 3, 0, 2, 4])


def test_aligned_two_turns_hand_computed():
    # G = 2 aligned, 2 turns: top nodes a, b; a's children c, d.
    rewards = jnp.array([1.0, 0.0, 2.0, 4.0])
    parents = jnp.array([-1, -1, 0, 0])
    returns = kernels.tree_returns(rewards, parents, gamma=0.5, max_depth=2)
    adv = kernels.magrpo_advantages(returns, parents, jnp.array([0, 1, 0, 1]), num_agents=2, group_size=2)
    # top: returns [2.5, 0] -> +-1.25; children [2, 4] -> -+1; identical for both agents.
    np.testing.assert_allclose(adv, [[1.25, 1.25], [-1.25, -1.25], [-1, -1], [1, 1]])


def test_cross_mode_sums_joint_returns():
    # 2 agents, G = 2, one turn: joint returns R[g0, g1] = [[0, 1], [2, 3]].
    joint = jnp.arange(4.0)
    adv = kernels.magrpo_advantages(
        joint, jnp.full(4, -1), jnp.arange(4), num_agents=2, group_size=2, mode="cross"
    )
    # agent 0 credits: g0=0 -> 0+1, g0=1 -> 2+3: advantages -2, +2. agent 1: 0+2, 1+3: -1, +1.
    np.testing.assert_allclose(adv, [[-2, -1], [-2, 1], [2, -1], [2, 1]])
    node = kernels.magrpo_node_advantages(joint.reshape(2, 2), mode="cross")
    np.testing.assert_allclose(node, [[-2, 2], [-1, 1]])


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(["aligned", "cross"]),
    st.integers(2, 3),
    st.integers(1, 2),
    st.integers(1, 3),
    st.floats(0.0, 1.0),
    st.integers(0, 10_000),
)
def test_matches_recursive_reference(mode, group_size, num_agents, turns, gamma, seed):
    if mode == "cross" and group_size**num_agents > 4 and turns > 2:
        turns = 2  # keep the tree small
    rng = np.random.default_rng(seed)
    reward, parent, sibling, _ = build_tree(num_agents, group_size, turns, mode, rng)
    returns = kernels.tree_returns(jnp.asarray(reward), jnp.asarray(parent), gamma=gamma, max_depth=turns)
    want_returns = reference_returns(reward, parent, gamma)
    np.testing.assert_allclose(returns, want_returns, rtol=1e-5, atol=1e-5)
    adv = kernels.magrpo_advantages(
        returns,
        jnp.asarray(parent),
        jnp.asarray(sibling),
        num_agents=num_agents,
        group_size=group_size,
        mode=mode,
    )
    want = reference_advantages(want_returns, parent, sibling, num_agents, group_size, mode)
    np.testing.assert_allclose(adv, want, rtol=1e-4, atol=1e-4)


def test_ragged_equals_dense_node_kernel_and_vmap():
    rng = np.random.default_rng(4)
    joint = rng.normal(size=(6, 3, 3)).astype(np.float32)  # 6 nodes, 2 agents, G=3 crossed
    dense = jax.vmap(lambda j: kernels.magrpo_node_advantages(j, mode="cross"))(
        jnp.asarray(joint)
    )  # [6, 2, 3]
    flat = joint.reshape(6, 9)
    # Ragged: 6 top-level... use them as children of 6 distinct parents in a forest of leaves.
    returns = jnp.asarray(np.concatenate([np.zeros(6, np.float32), flat.reshape(-1)]))
    parents = jnp.asarray(np.concatenate([np.full(6, -1), np.repeat(np.arange(6), 9)]).astype(np.int32))
    siblings = jnp.asarray(np.concatenate([np.arange(6) % 9, np.tile(np.arange(9), 6)]).astype(np.int32))
    mask = jnp.asarray(np.concatenate([np.ones(6, bool), np.ones(54, bool)]))
    # top-level nodes are distinct joint actions of a 9-way cross of their own; ignore their rows.
    adv = np.asarray(
        kernels.magrpo_advantages(
            returns, parents, siblings, num_agents=2, group_size=3, mode="cross", mask=mask
        )
    )
    for node in range(6):
        rows = adv[6 + 9 * node : 6 + 9 * (node + 1)]
        for j, (g0, g1) in enumerate(itertools.product(range(3), range(3))):
            np.testing.assert_allclose(
                rows[j], [dense[node, 0, g0], dense[node, 1, g1]], rtol=1e-5, atol=1e-5
            )


def test_masked_nodes_change_nothing():
    rewards = jnp.array([1.0, 0.0, 2.0, 4.0, 99.0])
    parents = jnp.array([-1, -1, 0, 0, 0])
    mask = jnp.array([True, True, True, True, False])
    returns = kernels.tree_returns(rewards, parents, gamma=0.5, max_depth=2, mask=mask)
    np.testing.assert_allclose(returns, [2.5, 0, 2, 4, 0])
    adv = kernels.magrpo_advantages(
        returns, parents, jnp.array([0, 1, 0, 1, 1]), num_agents=1, group_size=2, mask=mask
    )
    np.testing.assert_allclose(adv[:, 0], [1.25, -1.25, -1, 1, 0])


def test_bad_input():
    with pytest.raises(ValueError, match="mode"):
        kernels.magrpo_advantages(
            jnp.ones(2), jnp.full(2, -1), jnp.arange(2), num_agents=2, group_size=2, mode="tree"
        )
    with pytest.raises(ValueError, match="sibling_ids"):
        kernels.magrpo_advantages(jnp.ones(2), jnp.full(2, -1), jnp.array([0, 2]), num_agents=2, group_size=2)
    with pytest.raises(ValueError, match="parent_ids"):
        kernels.tree_returns(jnp.ones(2), jnp.array([-1, 5]), gamma=1.0, max_depth=2)
    with pytest.raises(TypeError, match="gamma"):
        jax.jit(lambda g: kernels.tree_returns(jnp.ones(2), jnp.array([-1, 0]), gamma=g, max_depth=2))(0.5)


def ragged_tree(num_agents, group_size, turns, mode, rng):
    """A joint rollout tree where each node either expands all its joint actions or none (a node
    that stopped early, as the workflow stops them)."""
    width = group_size if mode == "aligned" else group_size**num_agents
    parent, sibling, reward = [], [], []

    def expand(node, level):
        first = len(parent)
        for s in range(width):
            parent.append(node)
            sibling.append(s)
            reward.append(float(rng.integers(0, 5)) / 4)
        if level + 1 < turns and rng.random() < 0.6:
            for k in range(first, first + width):
                expand(k, level + 1)

    expand(-1, 0)
    return np.array(reward, np.float32), np.array(parent, np.int32), np.array(sibling, np.int32)


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from(["aligned", "cross"]),
    scale=st.sampled_from(["none", "std"]),
    num_agents=st.integers(1, 3),
    turns=st.integers(1, 3),
    seed=st.integers(0, 10_000),
)
def test_raising_a_joint_actions_reward_never_lowers_its_advantage(mode, scale, num_agents, turns, seed):
    """On any tree of the shape the workflow grows (a node expands all its joint actions or none),
    a higher reward raises the joint action's return and leaves its siblings' alone. (The workflow
    keeps siblings together: tests/workflows/test_magrpo_workflow.py.)"""
    rng = np.random.default_rng(seed)
    reward, parent, sibling = ragged_tree(num_agents, 2, turns, mode, rng)

    def advantages(r):
        returns = kernels.tree_returns(jnp.asarray(r), parent, gamma=0.9, max_depth=turns)
        kw = dict(num_agents=num_agents, group_size=2, mode=mode, scale=scale)
        return np.asarray(kernels.magrpo_advantages(returns, parent, sibling, **kw))

    before = advantages(reward)
    for k in rng.choice(len(reward), size=min(4, len(reward)), replace=False):
        raised = reward.copy()
        raised[k] += float(rng.uniform(0.05, 1.0))
        after = advantages(raised)
        assert np.all(after[k] >= before[k] - 1e-5), (k, before[k], after[k])
