"""AT-GRPO, MARS2 and Dr. MAS estimators."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marljax import kernels


def test_at_grpo_compares_only_same_problem_turn_agent():
    # Two problems x two turns x two agents, three candidates each, rewards chosen so that
    # the correct grouping gives +-1 patterns and any merged grouping would not.
    rng = np.random.default_rng(1)
    p, t, a = np.meshgrid(np.arange(2), np.arange(2), np.arange(2), indexing="ij")
    p, t, a = (np.repeat(x.reshape(-1), 3) for x in (p, t, a))
    offsets = 100.0 * rng.normal(size=8)  # very different level for each (p, t, k) group
    base = np.tile([-1.0, 0.0, 1.0], 8)
    rewards = (base + np.repeat(offsets, 3)).astype(np.float32)
    adv = kernels.at_grpo_advantages(
        jnp.asarray(rewards),
        jnp.asarray(p),
        jnp.asarray(t),
        jnp.asarray(a),
        num_problems=2,
        num_turns=2,
        num_agents=2,
    )
    np.testing.assert_allclose(adv, base, atol=1e-4)


def test_at_grpo_group_ids_layout():
    ids = kernels.at_grpo_group_ids(
        jnp.array([0, 1, 2]), jnp.array([1, 0, 2]), jnp.array([0, 1, 1]), num_turns=3, num_agents=2
    )
    np.testing.assert_array_equal(ids, [(0 * 3 + 1) * 2 + 0, (1 * 3 + 0) * 2 + 1, (2 * 3 + 2) * 2 + 1])
    with pytest.raises(ValueError, match="turn_ids"):
        kernels.at_grpo_group_ids(jnp.array([0]), jnp.array([3]), jnp.array([0]), num_turns=3, num_agents=2)


def test_at_grpo_grouping_keys_group_as_stated():
    # 4 problems x 2 turns x 2 agents, one sample each; the groups written out by hand.
    p = np.repeat(np.arange(4), 4)
    t = np.tile([0, 0, 1, 1], 4)
    a = np.tile([0, 1], 8)
    args = (jnp.asarray(p), jnp.asarray(t), jnp.asarray(a))

    def partition(ids):  # the groups as sets of sample indices, whatever the id values
        ids = np.asarray(ids)
        return sorted(tuple(np.flatnonzero(ids == g)) for g in np.unique(ids))

    own = kernels.at_grpo_group_ids(*args, num_turns=2, num_agents=2)
    assert partition(own) == [(i,) for i in range(16)]  # every (problem, turn, agent) alone
    pooled = kernels.at_grpo_group_ids(*args, num_turns=2, num_agents=2, key="pooled", pool_size=2)
    # problems {0, 1} and {2, 3} pooled, turn and agent still apart
    assert partition(pooled) == sorted([(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15)])
    per_problem = kernels.at_grpo_group_ids(*args, num_turns=2, num_agents=2, key="problem")
    assert partition(per_problem) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    for ids in (own, pooled, per_problem):  # all inside the P * T * K ids the estimator sizes for
        assert int(np.min(ids)) >= 0 and int(np.max(ids)) < 4 * 2 * 2
    with pytest.raises(ValueError, match="key"):
        kernels.at_grpo_group_ids(*args, num_turns=2, num_agents=2, key="turn")


def test_at_grpo_advantages_follow_the_key():
    # 2 problems, 1 turn, 1 agent, 2 candidates: rewards [0, 1] and [1, 3].
    r = jnp.array([0.0, 1.0, 1.0, 3.0])
    p, zero = jnp.array([0, 0, 1, 1]), jnp.zeros(4, jnp.int32)
    kw = dict(num_problems=2, num_turns=1, num_agents=1, eps=0.0)
    own = kernels.at_grpo_advantages(r, p, zero, zero, **kw)
    s = 1 / np.sqrt(2)  # (x - mean) / std_ddof1 of any two distinct values: -+1/sqrt(2)
    np.testing.assert_allclose(own, [-s, s, -s, s], rtol=1e-6)
    pooled = kernels.at_grpo_advantages(r, p, zero, zero, key="pooled", pool_size=2, **kw)
    mean, std = 1.25, np.std([0.0, 1.0, 1.0, 3.0], ddof=1)  # one group of all four
    np.testing.assert_allclose(pooled, (np.array([0, 1, 1, 3]) - mean) / std, rtol=1e-6)


def test_mars2_one_group_per_ragged_tree_across_agents_and_depths():
    # Tree 0: 5 nodes by agents 0/1 at depths 0..2; tree 1: 2 nodes.
    rewards = jnp.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.2, 0.8])
    trees = jnp.array([0, 0, 0, 0, 0, 1, 1])
    adv = np.asarray(kernels.mars2_advantages(rewards, trees, 2))
    t0 = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    np.testing.assert_allclose(adv[:5], (t0 - t0.mean()) / (t0.std(ddof=1) + 1e-6), rtol=1e-5)
    t1 = np.array([0.2, 0.8])
    np.testing.assert_allclose(adv[5:], (t1 - t1.mean()) / (t1.std(ddof=1) + 1e-6), rtol=1e-5)


def test_dr_mas_hand_computed():
    rewards = jnp.array([1.0, 2.0, 3.0, 10.0, 10.0, 4.0])
    agents = jnp.array([0, 0, 0, 1, 1, 1])
    adv, metrics = kernels.dr_mas_advantages(rewards, agents, 2)
    np.testing.assert_allclose(adv[:3], np.array([-1, 0, 1]) / (1 + 1e-6), rtol=1e-6)
    r1 = np.array([10.0, 10.0, 4.0])
    np.testing.assert_allclose(adv[3:], (r1 - 8) / (r1.std(ddof=1) + 1e-6), rtol=1e-6)
    # Amplification: mu = 5, sigma^2 = 12.333..; agent 0: (2/3 + 9) / sigma^2, agent 1: (8 + 9) / sigma^2.
    allr = np.array([1, 2, 3, 10, 10, 4.0])
    var = allr.var()
    np.testing.assert_allclose(metrics["amplification"], [(2 / 3 + 9) / var, (8 + 9) / var], rtol=1e-5)
    np.testing.assert_allclose(metrics["agent_mean"], [2, 8], rtol=1e-6)
    np.testing.assert_allclose(metrics["agent_count"], [3, 3])


def test_amplification_leaves_out_groups_where_the_agents_own_rewards_are_constant():
    # Problem 0: agent 0 scores [1, 1] (constant), agent 1 [0, 2]; problem 1: agent 0 [0, 1], agent 1
    # [1, 1] (constant). Agent-wise normalisation gives a constant agent zero advantage while the
    # shared one does not: Lemma 4.2's sigma_k > 0 fails there, so only the other problem counts.
    # Problem 0: mu = 1, sigma^2 = 0.5; agent 1: (1 + 0) / 0.5 = 2.
    # Problem 1: mu = 0.75, sigma^2 = 0.1875; agent 0: (0.25 + 0.25^2) / 0.1875 = 5/3.
    rewards = jnp.array([1.0, 1.0, 0.0, 2.0, 0.0, 1.0, 1.0, 1.0])
    agents = jnp.array([0, 0, 1, 1, 0, 0, 1, 1])
    problems = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
    factor = kernels.amplification_factor(rewards, agents, 3, group_ids=problems, num_groups=2)
    # agent 2 never acts: 0; counting the constant groups would give agent 0 (0 + 5/3) / 2 and
    # agent 1 (2 + 1/3) / 2
    np.testing.assert_allclose(factor, [5 / 3, 2.0, 0.0], rtol=1e-6)
    # equal rewards whose float32 variance is not exactly 0 (seven times 0.1: 5.6e-17) still count
    # as constant
    tenths = jnp.array([0.1] * 7 + [0.0, 1.0], jnp.float32)
    assert float(kernels.amplification_factor(tenths, jnp.array([0] * 7 + [1, 1]), 2)[0]) == 0.0


def test_dr_mas_per_agent_within_problem_groups():
    rng = np.random.default_rng(2)
    n = 48
    agents = rng.integers(0, 3, n)
    groups = rng.integers(0, 4, n)
    rewards = rng.normal(size=n).astype(np.float32) + agents * 5
    adv, _ = kernels.dr_mas_advantages(
        jnp.asarray(rewards), jnp.asarray(agents), 3, group_ids=jnp.asarray(groups), num_groups=4
    )
    expected = kernels.group_advantages(jnp.asarray(rewards), jnp.asarray(groups * 3 + agents), 12)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="num_groups"):
        kernels.dr_mas_advantages(jnp.asarray(rewards), jnp.asarray(agents), 3, group_ids=jnp.asarray(groups))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-5, 5), st.floats(0.1, 3), st.integers(2, 30)), min_size=1, max_size=4),
    st.integers(0, 1000),
)
def test_amplification_count_weighted_mean_is_one(specs, seed):
    # Law of total variance: sum_k n_k (sigma_k^2 + (mu_k - mu)^2) = n sigma^2.
    rng = np.random.default_rng(seed)
    rewards = np.concatenate([rng.normal(m, s, n) for m, s, n in specs]).astype(np.float32)
    agents = np.concatenate([np.full(n, k) for k, (_, _, n) in enumerate(specs)])
    if rewards.std() < 1e-3:
        return
    factor = np.asarray(kernels.amplification_factor(jnp.asarray(rewards), jnp.asarray(agents), len(specs)))
    counts = np.bincount(agents, minlength=len(specs))
    assert abs((counts * factor).sum() / counts.sum() - 1.0) < 1e-3


def test_dr_mas_gradient_second_moment_ratio_matches_amplification():
    """Synthetic score-function model (Dr. MAS, arXiv 2602.08847, Sec. on gradient variance).

    Agent k has a softmax policy over 4 actions; its score vector s = onehot(a) - pi.
    Rewards have agent-specific mean and spread and are independent of the
    action, so E[A^2 |s|^2] = E[A^2] E[|s|^2] and the ratio of gradient second
    moments under global vs agent-wise normalisation must equal
    (sigma_k^2 + (mu_k - mu)^2) / sigma^2 within sampling error.
    """
    rng = np.random.default_rng(0)
    num_agents, n_per_agent, num_actions = 3, 20000, 4
    mus, sigmas = np.array([0.0, 2.0, -1.0]), np.array([0.5, 2.0, 1.0])
    logits = rng.normal(size=(num_agents, num_actions))
    pi = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    agents = np.repeat(np.arange(num_agents), n_per_agent)
    actions = np.array([rng.choice(num_actions, p=pi[k]) for k in agents])
    score_sq = ((np.eye(num_actions)[actions] - pi[agents]) ** 2).sum(1)
    rewards = (mus[agents] + sigmas[agents] * rng.normal(size=agents.size)).astype(np.float32)

    a_global = np.asarray(kernels.global_advantages(jnp.asarray(rewards)), np.float64)
    a_agent, metrics = kernels.dr_mas_advantages(jnp.asarray(rewards), jnp.asarray(agents), num_agents)
    a_agent = np.asarray(a_agent, np.float64)
    for k in range(num_agents):
        sel = agents == k
        g2_global = a_global[sel] ** 2 * score_sq[sel]
        g2_agent = a_agent[sel] ** 2 * score_sq[sel]
        ratio = g2_global.mean() / g2_agent.mean()
        # Delta-method standard error of a ratio of means.
        cov = np.cov(g2_global, g2_agent) / sel.sum()
        grad = np.array([1 / g2_agent.mean(), -g2_global.mean() / g2_agent.mean() ** 2])
        se = np.sqrt(grad @ cov @ grad)
        assert abs(ratio - float(metrics["amplification"][k])) < 4 * se + 1e-3, (k, ratio, se)
    # The factors really differ between agents here, so the test can tell them apart.
    assert np.ptp(np.asarray(metrics["amplification"])) > 1.0


def test_estimators_work_under_jit_and_vmap():
    rng = np.random.default_rng(3)
    rewards = jnp.asarray(rng.normal(size=(5, 12)).astype(np.float32))
    agents = jnp.asarray(rng.integers(0, 2, size=(5, 12)).astype(np.int32))
    fn = jax.jit(jax.vmap(lambda r, a: kernels.dr_mas_advantages(r, a, 2)[0]))
    batched = fn(rewards, agents)
    for b in range(5):
        np.testing.assert_allclose(
            batched[b], kernels.dr_mas_advantages(rewards[b], agents[b], 2)[0], rtol=1e-6
        )


def test_amplification_per_problem_group_matches_the_measured_gradient_ratio():
    """Dr. MAS's Lemma 4.2 where advantages are normalised per problem: 20 problems of different
    difficulty, three agents with their own mean and spread in each. The factor averaged over the
    problem groups equals the measured ratio of gradient second moments (global-per-problem vs
    agent-wise-per-problem advantages); a batch-wide factor would count the spread between problems."""
    rng = np.random.default_rng(1)
    num_agents, num_problems, n, num_actions = 3, 20, 600, 4
    difficulty = rng.normal(0, 3, num_problems)  # the problems' reward levels differ a lot
    # agent 0 answers steadily near each problem's level, agent 1 noisily, agent 2 above it
    offset = np.array([0.0, 0.0, 1.5]) + rng.normal(0, 0.3, (num_problems, num_agents))
    spread = np.array([0.3, 2.0, 1.0]) * rng.uniform(0.8, 1.2, (num_problems, num_agents))
    problem = np.repeat(np.arange(num_problems), num_agents * n)
    agents = np.tile(np.repeat(np.arange(num_agents), n), num_problems)
    rewards = (
        difficulty[problem]
        + offset[problem, agents]
        + spread[problem, agents] * rng.normal(size=problem.size)
    )
    logits = rng.normal(size=(num_agents, num_actions))
    pi = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    actions = np.array([rng.choice(num_actions, p=pi[k]) for k in agents])
    score_sq = ((np.eye(num_actions)[actions] - pi[agents]) ** 2).sum(1)

    r, a, g = jnp.asarray(rewards, jnp.float32), jnp.asarray(agents), jnp.asarray(problem)
    a_global = np.asarray(kernels.group_advantages(r, g, num_problems), np.float64)
    a_agent, metrics = kernels.dr_mas_advantages(r, a, num_agents, group_ids=g, num_groups=num_problems)
    a_agent = np.asarray(a_agent, np.float64)
    batch_wide = np.asarray(kernels.amplification_factor(r, a, num_agents))
    for k in range(num_agents):
        sel = agents == k
        g2_global, g2_agent = a_global[sel] ** 2 * score_sq[sel], a_agent[sel] ** 2 * score_sq[sel]
        ratio = g2_global.mean() / g2_agent.mean()
        cov = np.cov(g2_global, g2_agent) / sel.sum()
        grad = np.array([1 / g2_agent.mean(), -g2_global.mean() / g2_agent.mean() ** 2])
        se = np.sqrt(grad @ cov @ grad)
        assert abs(ratio - float(metrics["amplification"][k])) < 4 * se + 2e-3, (k, ratio, se)
    # the steady agent: a small factor per problem, but the batch-wide one sees the problems' spread
    assert float(metrics["amplification"][0]) < 0.3 and batch_wide[0] > 0.5, (metrics, batch_wide)


def test_a_lone_sample_gets_zero_or_its_raw_reward():
    rewards = jnp.array([1.0, 2.0, 3.0, 5.0, 7.0, 4.0])
    agents = jnp.array([0, 0, 0, 1, 1, 1])
    groups = jnp.array([0, 0, 0, 0, 1, 1])  # agent 1 acts once in group 0: a group of one
    mask = jnp.array([True, True, True, True, True, False])  # ... and once (valid) in group 1
    zero, _ = kernels.dr_mas_advantages(rewards, agents, 2, mask, group_ids=groups, num_groups=2)
    raw, _ = kernels.dr_mas_advantages(
        rewards, agents, 2, mask, group_ids=groups, num_groups=2, singleton="raw"
    )
    np.testing.assert_allclose(zero, [-1, 0, 1, 0, 0, 0], atol=1e-5)
    np.testing.assert_allclose(raw, [-1, 0, 1, 5, 7, 0], atol=1e-5)  # the masked sample stays 0
    with pytest.raises(ValueError, match="singleton"):
        kernels.group_advantages(rewards, groups, 2, singleton="mean")
