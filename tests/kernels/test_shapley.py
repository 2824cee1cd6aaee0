"""SHARP: exact and sampled Shapley values, counterfactual credit, three-level reward."""

import itertools
import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marljax import kernels

SETTINGS = settings(max_examples=25, deadline=None)


def tables(num_agents_range=(1, 6)):
    return st.integers(*num_agents_range).flatmap(
        lambda k: hnp.arrays(np.float64, 1 << k, elements=st.floats(-10, 10)).map(
            lambda v: v.astype(np.float32)
        )
    )


def by_permutations(values):
    """Shapley value as the average marginal contribution over all K! orders."""
    k = int(np.log2(len(values)))
    phi = np.zeros(k)
    for order in itertools.permutations(range(k)):
        members = 0
        for agent in order:
            phi[agent] += values[members | (1 << agent)] - values[members]
            members |= 1 << agent
    return phi / math.factorial(k)


def test_hand_computed_two_agents():
    v = jnp.array([0.0, 1.0, 2.0, 4.0])  # v({}), v({0}), v({1}), v({0,1})
    np.testing.assert_allclose(kernels.shapley_values(v), [0.5 * (1 + 2), 0.5 * (2 + 3)])
    np.testing.assert_allclose(kernels.leave_one_out_credit(v), [4 - 2, 4 - 1])


def test_glove_game():
    # Agent 0 holds a left glove, agents 1 and 2 right gloves; a pair is worth 1.
    def value(s):
        left = s & 1
        right = (s >> 1) & 3
        return float(bool(left) and bool(right))

    v = jnp.array([value(s) for s in range(8)], jnp.float32)
    np.testing.assert_allclose(kernels.shapley_values(v), [4 / 6, 1 / 6, 1 / 6], rtol=1e-6)


@SETTINGS
@given(tables())
def test_matches_permutation_definition(values):
    np.testing.assert_allclose(
        kernels.shapley_values(jnp.asarray(values)),
        by_permutations(values.astype(np.float64)),
        rtol=1e-4,
        atol=1e-4,
    )


@SETTINGS
@given(tables())
def test_efficiency(values):
    phi = np.asarray(kernels.shapley_values(jnp.asarray(values)), np.float64)
    assert abs(phi.sum() - (values[-1] - values[0])) < 1e-3


@SETTINGS
@given(tables((2, 6)), st.data())
def test_symmetry_and_null_player(values, data):
    k = int(np.log2(len(values)))
    i, j = data.draw(st.permutations(range(k)))[:2]
    # Make i and j interchangeable: v(S + i) = v(S + j) for S without both.
    sym = values.copy()
    for s in range(1 << k):
        if (s >> i) & 1 and not (s >> j) & 1:
            sym[s] = sym[s ^ (1 << i) | (1 << j)]
    phi = np.asarray(kernels.shapley_values(jnp.asarray(sym)))
    assert abs(phi[i] - phi[j]) < 1e-4
    # Make agent i a null player: v(S + i) = v(S).
    null = values.copy()
    for s in range(1 << k):
        if (s >> i) & 1:
            null[s] = null[s ^ (1 << i)]
    assert abs(float(kernels.shapley_values(jnp.asarray(null))[i])) < 1e-5


@SETTINGS
@given(
    tables((1, 5)).flatmap(
        lambda v: st.tuples(
            st.just(v), hnp.arrays(np.float32, v.shape, elements=st.floats(-10, 10, width=32))
        )
    )
)
def test_additivity(pair):
    v, w = pair
    np.testing.assert_allclose(
        kernels.shapley_values(jnp.asarray(v + w)),
        kernels.shapley_values(jnp.asarray(v)) + kernels.shapley_values(jnp.asarray(w)),
        rtol=1e-4,
        atol=1e-4,
    )


def test_batched_tables_vmap_jit_and_twelve_agents():
    rng = np.random.default_rng(0)
    batch = rng.normal(size=(3, 1 << 12)).astype(np.float32)
    got = jax.jit(kernels.shapley_values)(jnp.asarray(batch))
    assert got.shape == (3, 12)
    vm = jax.vmap(kernels.shapley_values)(jnp.asarray(batch))
    np.testing.assert_allclose(got, vm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got).sum(-1), batch[:, -1] - batch[:, 0], rtol=1e-3, atol=1e-3)


def test_sampled_estimator_converges_to_exact_within_error():
    rng = np.random.default_rng(1)
    values = jnp.asarray(rng.normal(size=1 << 8).astype(np.float32))
    exact = np.asarray(kernels.shapley_values(values))

    def value_fn(members):
        return values[kernels.coalition_index(members)]

    for antithetic in (False, True):
        est, se = kernels.sampled_shapley_values(value_fn, 8, jax.random.key(0), 4000, antithetic=antithetic)
        assert np.all(np.abs(np.asarray(est) - exact) < 4.5 * np.asarray(se) + 1e-4)
        # Every permutation estimate is efficient, so the mean is too.
        assert abs(float(est.sum()) - float(values[-1] - values[0])) < 1e-3


def test_sampled_estimator_for_many_agents_additive_game():
    # For an additive game v(S) = sum_{i in S} w_i every order gives phi_i = w_i exactly.
    w = jnp.linspace(-1.0, 2.0, 40)
    est, se = kernels.sampled_shapley_values(
        lambda m: jnp.sum(jnp.where(m, w, 0.0)), 40, jax.random.key(2), 8
    )
    np.testing.assert_allclose(est, w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(se, 0, atol=1e-5)


def test_sharp_rewards_and_advantages():
    g = jnp.array([1.0, 0.0])
    phi = jnp.array([[0.6, 0.4], [0.1, -0.1]])
    proc = jnp.array([[1.0, 0.0], [0.5, 0.5]])
    r = kernels.sharp_rewards(g, phi, proc, global_weight=1.0, shapley_weight=0.5, process_weight=0.1)
    np.testing.assert_allclose(r, [[1 + 0.3 + 0.1, 1 + 0.2], [0.05 + 0.05, -0.05 + 0.05]], rtol=1e-6)
    rewards = jnp.array([[1.0, 10.0], [3.0, 30.0], [5.0, 0.0], [7.0, 2.0]])
    adv = kernels.sharp_advantages(rewards, jnp.array([0, 0, 1, 1]), 2)
    s = np.sqrt(2.0)
    np.testing.assert_allclose(
        adv,
        [[-1 / s, -10 / np.sqrt(200)], [1 / s, 10 / np.sqrt(200)], [-1 / s, -1 / s], [1 / s, 1 / s]],
        rtol=1e-5,
    )


def test_bad_input():
    with pytest.raises(ValueError, match="values"):
        kernels.shapley_values(jnp.ones(6))
    with pytest.raises(TypeError, match="values"):
        kernels.shapley_values(jnp.ones(4, jnp.int32))
    with pytest.raises(ValueError, match="shapley_credit"):
        kernels.sharp_rewards(jnp.ones(3), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="group_ids"):
        kernels.sharp_advantages(jnp.ones((3, 2)), jnp.array([0, 1]), 2)
