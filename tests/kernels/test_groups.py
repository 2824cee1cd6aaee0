"""group_advantages, normalize_group, dense_group_advantages and the GRPO baselines."""

import functools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marljax import kernels

SETTINGS = settings(max_examples=40, deadline=None)


def reference(rewards, group_ids, mask, center="mean", scale="std", eps=1e-6, ddof=1):
    """Plain per-group loop in float64: the independent expectation."""
    rewards = np.asarray(rewards, np.float64)
    out = np.zeros_like(rewards)
    for g in np.unique(group_ids):
        idx = np.where((group_ids == g) & mask)[0]
        if len(idx) == 0:
            continue
        r = rewards[idx]
        if center == "none" and scale == "none":
            out[idx] = r
            continue
        if len(idx) < 2:
            continue
        if center == "mean":
            c = r - r.mean()
        elif center == "loo":
            c = np.array([r[i] - np.delete(r, i).mean() for i in range(len(r))])
        else:
            c = r
        if scale == "std":
            c = c / (r.std(ddof=ddof) + eps)
        out[idx] = c
    return out


@st.composite
def ragged_batches(draw, max_groups=5, max_n=24):
    num_groups = draw(st.integers(1, max_groups))
    n = draw(st.integers(1, max_n))
    group_ids = draw(hnp.arrays(np.int32, n, elements=st.integers(0, num_groups - 1)))
    rewards = draw(hnp.arrays(np.float32, n, elements=st.floats(-10, 10, width=32)))
    mask = draw(hnp.arrays(np.bool_, n))
    return rewards, group_ids, mask, num_groups


def test_hand_computed_grpo():
    # group 0: [1, 2, 3] mean 2, unbiased std 1; group 1: [10, 10] std 0; group 2 singleton.
    r = jnp.array([1.0, 2.0, 3.0, 10.0, 10.0, 5.0])
    g = jnp.array([0, 0, 0, 1, 1, 2])
    np.testing.assert_allclose(
        kernels.grpo_advantages(r, g, 3), [-1 / (1 + 1e-6), 0, 1 / (1 + 1e-6), 0, 0, 0], atol=1e-7
    )
    np.testing.assert_allclose(kernels.dr_grpo_advantages(r, g, 3), [-1, 0, 1, 0, 0, 0])
    # RLOO: 1 - (2+3)/2 = -1.5, 2 - 2 = 0, 3 - 1.5 = 1.5.
    np.testing.assert_allclose(kernels.rloo_advantages(r, g, 3), [-1.5, 0, 1.5, 0, 0, 0])


def test_hand_computed_with_mask_and_ddof0():
    r = jnp.array([0.0, 4.0, 100.0, 2.0])
    m = jnp.array([True, True, False, True])
    g = jnp.zeros(4, jnp.int32)
    # valid [0, 4, 2]: mean 2, population std sqrt(8/3).
    s = np.sqrt(8 / 3)
    expected = [-2 / s, 2 / s, 0.0, 0.0]
    np.testing.assert_allclose(kernels.group_advantages(r, g, 1, m, ddof=0, eps=0.0), expected, rtol=1e-6)


@SETTINGS
@given(ragged_batches(), st.sampled_from(["mean", "loo", "none"]), st.sampled_from(["std", "none"]))
def test_matches_reference(batch, center, scale):
    rewards, group_ids, mask, num_groups = batch
    got = kernels.group_advantages(
        jnp.asarray(rewards),
        jnp.asarray(group_ids),
        num_groups,
        jnp.asarray(mask),
        center=center,
        scale=scale,
    )
    want = reference(rewards, group_ids, mask, center, scale)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@SETTINGS
@given(ragged_batches())
def test_zero_mean_unit_std_per_group(batch):
    rewards, group_ids, mask, num_groups = batch
    adv = np.asarray(
        kernels.group_advantages(
            jnp.asarray(rewards), jnp.asarray(group_ids), num_groups, jnp.asarray(mask), eps=0.0
        )
    )
    for g in range(num_groups):
        sel = (group_ids == g) & mask
        r = rewards[sel].astype(np.float64)
        if sel.sum() < 2 or r.std() < 1e-2:
            continue  # degenerate groups are covered by the singleton/constant tests
        assert abs(adv[sel].mean()) < 1e-4
        assert abs(adv[sel].std(ddof=1) - 1) < 1e-4


@SETTINGS
@given(ragged_batches(), st.floats(-50, 50), st.floats(0.1, 20))
def test_invariant_to_shift_and_scale(batch, shift, factor):
    rewards, group_ids, mask, num_groups = batch
    base = kernels.group_advantages(
        jnp.asarray(rewards), jnp.asarray(group_ids), num_groups, jnp.asarray(mask), eps=0.0
    )
    moved = kernels.group_advantages(
        jnp.asarray((rewards * factor + shift).astype(np.float32)),
        jnp.asarray(group_ids),
        num_groups,
        jnp.asarray(mask),
        eps=0.0,
    )
    spread = np.array(
        [
            np.ptp(rewards[(group_ids == g) & mask]) if ((group_ids == g) & mask).any() else 1.0
            for g in group_ids
        ]
    )
    ok = spread > 1e-2  # groups of (near-)equal rewards are ill-conditioned under rounding
    np.testing.assert_allclose(np.asarray(moved)[ok], np.asarray(base)[ok], rtol=1e-3, atol=1e-3)


@SETTINGS
@given(
    ragged_batches(), st.one_of(st.floats(-1e6, 1e6, width=32), st.just(float("nan")), st.just(float("inf")))
)
def test_masked_entries_change_nothing(batch, garbage):
    rewards, group_ids, mask, num_groups = batch
    dirty = np.where(mask, rewards, np.float32(garbage))
    a = kernels.group_advantages(jnp.asarray(rewards), jnp.asarray(group_ids), num_groups, jnp.asarray(mask))
    b = kernels.group_advantages(jnp.asarray(dirty), jnp.asarray(group_ids), num_groups, jnp.asarray(mask))
    np.testing.assert_array_equal(a, b)
    assert np.all(np.asarray(b)[~mask] == 0)


@SETTINGS
@given(ragged_batches(), st.randoms(use_true_random=False))
def test_permutation_equivariant(batch, rnd):
    rewards, group_ids, mask, num_groups = batch
    perm = np.arange(len(rewards))
    rnd.shuffle(perm)
    a = kernels.group_advantages(jnp.asarray(rewards), jnp.asarray(group_ids), num_groups, jnp.asarray(mask))
    b = kernels.group_advantages(
        jnp.asarray(rewards[perm]), jnp.asarray(group_ids[perm]), num_groups, jnp.asarray(mask[perm])
    )
    np.testing.assert_allclose(np.asarray(a)[perm], b, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(ragged_batches())
def test_jit_equals_eager(batch):
    rewards, group_ids, mask, num_groups = batch
    fn = jax.jit(
        kernels.group_advantages, static_argnums=2, static_argnames=("center", "scale", "eps", "ddof")
    )
    args = (jnp.asarray(rewards), jnp.asarray(group_ids), num_groups, jnp.asarray(mask))
    np.testing.assert_allclose(
        fn(*args, center="loo"), kernels.group_advantages(*args, center="loo"), rtol=1e-6, atol=1e-6
    )


@SETTINGS
@given(
    hnp.arrays(np.float32, (3, 4, 5), elements=st.floats(-5, 5, width=32)),
    hnp.arrays(np.bool_, (3, 4, 5)),
    st.sampled_from(["mean", "loo"]),
)
def test_dense_equals_ragged_and_vmap_equals_loop(rewards, mask, center):
    dense = kernels.dense_group_advantages(jnp.asarray(rewards), jnp.asarray(mask), center=center)
    num_agents, num_turns, size = rewards.shape
    ids = (np.arange(num_agents)[:, None, None] * num_turns + np.arange(num_turns)[None, :, None]) * np.ones(
        size, int
    )
    ragged = kernels.group_advantages(
        jnp.asarray(rewards.reshape(-1)),
        jnp.asarray(ids.reshape(-1), jnp.int32),
        num_agents * num_turns,
        jnp.asarray(mask.reshape(-1)),
        center=center,
    )
    np.testing.assert_allclose(dense.reshape(-1), ragged, rtol=1e-5, atol=1e-5)
    loop = np.stack(
        [
            np.stack(
                [
                    kernels.normalize_group(
                        jnp.asarray(rewards[a, t]), jnp.asarray(mask[a, t]), center=center
                    )
                    for t in range(num_turns)
                ]
            )
            for a in range(num_agents)
        ]
    )
    np.testing.assert_allclose(dense, loop, rtol=1e-6, atol=1e-6)


def test_vmap_over_batches_equals_loop():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(4, 10)).astype(np.float32)
    ids = rng.integers(0, 3, size=(4, 10)).astype(np.int32)
    fn = jax.vmap(functools.partial(kernels.group_advantages, num_groups=3))
    batched = fn(jnp.asarray(rewards), jnp.asarray(ids))
    for b in range(4):
        np.testing.assert_allclose(
            batched[b], kernels.group_advantages(jnp.asarray(rewards[b]), jnp.asarray(ids[b]), 3), rtol=1e-6
        )


def test_singleton_groups_get_zero_and_identity_passes_rewards():
    r = jnp.array([3.0, -7.0])
    g = jnp.array([0, 1])
    for center, scale in [("mean", "std"), ("loo", "none"), ("mean", "none"), ("none", "std")]:
        np.testing.assert_array_equal(
            kernels.group_advantages(r, g, 2, center=center, scale=scale), [0.0, 0.0]
        )
    np.testing.assert_array_equal(kernels.group_advantages(r, g, 2, center="none", scale="none"), [3.0, -7.0])


def test_nan_reward_poisons_only_its_group():
    r = jnp.array([1.0, jnp.nan, 3.0, 4.0, 6.0])
    g = jnp.array([0, 0, 1, 1, 1])
    adv = np.asarray(kernels.group_advantages(r, g, 2))
    assert np.isnan(adv[:2]).all()
    np.testing.assert_allclose(adv[2:], kernels.group_advantages(r[2:], g[2:] - 1, 1))
    dropped = kernels.group_advantages(r, g, 2, ~jnp.isnan(r))
    np.testing.assert_array_equal(np.isnan(dropped), False)


def test_out_of_range_ids_raise_eagerly_and_are_nan_under_jit():
    r = jnp.array([1.0, 2.0, 3.0, 4.0])
    bad = jnp.array([0, 0, 5, -1])
    with pytest.raises(ValueError, match="group_ids"):
        kernels.group_advantages(r, bad, 2)
    adv = np.asarray(jax.jit(kernels.group_advantages, static_argnums=2)(r, bad, 2))
    assert np.isnan(adv[2:]).all()
    np.testing.assert_allclose(adv[:2], kernels.group_advantages(r[:2], bad[:2], 2))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: kernels.group_advantages(jnp.ones(3), jnp.zeros(4, jnp.int32), 1), "group_ids"),
        (lambda: kernels.group_advantages(jnp.ones((3, 2)), jnp.zeros(3, jnp.int32), 1), "rewards"),
        (lambda: kernels.group_advantages(jnp.ones(3), jnp.zeros(3), 1), "group_ids"),
        (lambda: kernels.group_advantages(jnp.ones(3, jnp.int32), jnp.zeros(3, jnp.int32), 1), "rewards"),
        (lambda: kernels.group_advantages(jnp.ones(3), jnp.zeros(3, jnp.int32), 1, jnp.ones(3)), "mask"),
        (
            lambda: kernels.group_advantages(jnp.ones(3), jnp.zeros(3, jnp.int32), 1, jnp.ones(2, bool)),
            "mask",
        ),
        (lambda: kernels.group_advantages(jnp.ones(3), jnp.zeros(3, jnp.int32), 0), "num_groups"),
        (
            lambda: kernels.group_advantages(jnp.ones(3), jnp.zeros(3, jnp.int32), 1, center="median"),
            "center",
        ),
        (lambda: kernels.group_advantages(jnp.ones(3), jnp.zeros(3, jnp.int32), 1, scale="mad"), "scale"),
        (lambda: jax.jit(kernels.group_advantages)(jnp.ones(3), jnp.zeros(3, jnp.int32), 1), "num_groups"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError, AssertionError), match=match):
        call()


@SETTINGS
@given(
    st.floats(-1e4, 1e4, width=32),
    st.integers(2, 9),
    hnp.arrays(np.bool_, (2, 3, 9)),
    st.sampled_from(["mean", "loo"]),
)
def test_constant_groups_give_exact_zeros(value, size, mask, center):
    # Rounding in the mean must not be blown up by the (near-zero) std division.
    rewards = np.full((2, 3, size), value, np.float32)
    mask = mask[..., :size]
    dense = np.asarray(kernels.dense_group_advantages(jnp.asarray(rewards), jnp.asarray(mask), center=center))
    ids = np.repeat(np.arange(6), size).astype(np.int32)
    ragged = np.asarray(
        kernels.group_advantages(
            jnp.asarray(rewards.reshape(-1)),
            jnp.asarray(ids),
            6,
            jnp.asarray(mask.reshape(-1)),
            center=center,
        )
    )
    assert np.all(dense == 0) and np.all(ragged == 0)
