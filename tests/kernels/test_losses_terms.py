"""Tests for logprobs_from_logits, entropy_from_logits, kl_penalty and overlong_penalty.

References are plain NumPy in float64 (log-softmax, -sum p log p, the KL estimators
written out, DAPO's piecewise overlong reward) and central finite differences.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _numeric import np_fd_grad
from hypothesis import given, settings

from marljax.kernels.losses import entropy_from_logits, kl_penalty, logprobs_from_logits, overlong_penalty

PROPS = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**31 - 1)
LOGIT_SHAPE = (2, 3, 7)


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def np_kl(logp, ref, kind):
    d = np.asarray(ref, np.float64) - np.asarray(logp, np.float64)
    return {"k1": -d, "k2": d**2 / 2, "k3": np.exp(d) - d - 1}[kind]


jitted_logprobs = jax.jit(logprobs_from_logits, static_argnames=("temperature",))
jitted_kl = jax.jit(kl_penalty, static_argnames=("kind", "clamp"))


# ----------------------------------------------------------------------------- logprobs_from_logits


def test_logprobs_hand_case():
    logits = jnp.array([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    labels = jnp.array([[1, 0]])
    np.testing.assert_allclose(
        logprobs_from_logits(logits, labels), [[math.log(0.75), math.log(0.25)]], rtol=1e-6
    )
    # Temperature 2: z = [0, log(3) / 2], p(1) = sqrt(3) / (1 + sqrt(3)).
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    np.testing.assert_allclose(
        logprobs_from_logits(logits, labels, temperature=2.0), [[math.log(p1), math.log(1 - p1)]], rtol=1e-6
    )


def test_logprobs_are_stable_for_huge_logits():
    logits = jnp.array([[[1e4, 1e4 - 1.0, -1e4]]])
    out = logprobs_from_logits(logits, jnp.array([[1]]))
    np.testing.assert_allclose(out, [[-1.0 - math.log1p(math.exp(-1.0))]], rtol=1e-5)


@PROPS
@given(seed=seeds, temperature=st.sampled_from([0.5, 1.0, 1.7]))
def test_logprobs_match_numpy_log_softmax(seed, temperature):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=LOGIT_SHAPE)
    labels = rng.integers(0, LOGIT_SHAPE[-1], size=LOGIT_SHAPE[:-1])
    expected = np.take_along_axis(np_log_softmax(logits / temperature), labels[..., None], -1)[..., 0]
    out = jitted_logprobs(jnp.asarray(logits, jnp.float32), jnp.asarray(labels), temperature=temperature)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_logprobs_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 2, 4))
    labels = np.array([[0, 3], [2, 2]])
    weights = rng.normal(size=(2, 2))

    def reference(z):
        return float(
            (np.take_along_axis(np_log_softmax(z / 0.7), labels[..., None], -1)[..., 0] * weights).sum()
        )

    with jax.enable_x64(True):
        g = jax.grad(lambda z: jnp.sum(logprobs_from_logits(z, jnp.asarray(labels), 0.7) * weights))(
            jnp.asarray(logits)
        )
    np.testing.assert_allclose(g, np_fd_grad(reference, logits), rtol=1e-6, atol=1e-8)


def test_logprobs_out_of_range_labels():
    logits = jnp.zeros((1, 2, 3))
    with pytest.raises(ValueError, match="`labels`"):
        logprobs_from_logits(logits, jnp.array([[0, 3]]))
    out = jax.jit(logprobs_from_logits)(logits, jnp.array([[0, 3]]))  # under jit: NaN marks the bad id
    assert np.isfinite(out[0, 0]) and np.isnan(out[0, 1])


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: logprobs_from_logits(jnp.zeros((2, 3, 4)), jnp.zeros((2, 4), jnp.int32)), "labels"),
        (lambda: logprobs_from_logits(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3))), "labels"),
        (
            lambda: logprobs_from_logits(jnp.zeros((2, 3, 4), jnp.int32), jnp.zeros((2, 3), jnp.int32)),
            "logits",
        ),
        (
            lambda: logprobs_from_logits(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3), jnp.int32), 0.0),
            "temperature",
        ),
        (
            lambda: logprobs_from_logits(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3), jnp.int32), "1"),
            "temperature",
        ),
        (lambda: entropy_from_logits(jnp.zeros((2, 3), jnp.int32)), "logits"),
        (lambda: entropy_from_logits(jnp.zeros(())), "logits"),
        (lambda: kl_penalty(jnp.zeros((2, 3)), jnp.zeros((2, 3)), "k4"), "kind"),
        (lambda: kl_penalty(jnp.zeros((2, 3)), jnp.zeros((3, 2))), "ref_logp"),
        (lambda: kl_penalty(jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3))), "logp"),
        (lambda: kl_penalty(jnp.zeros((2, 3)), jnp.zeros((2, 3)), "k3", clamp=0.0), "clamp"),
        (lambda: overlong_penalty(jnp.zeros(3), 10, 11), "buffer_len"),
        (lambda: overlong_penalty(jnp.zeros(3), 10, 0), "buffer_len"),
        (lambda: overlong_penalty(jnp.zeros(3), 10.0, 2), "max_len"),
        (lambda: overlong_penalty(jnp.zeros(3, bool), 10, 2), "lengths"),
        (lambda: overlong_penalty(jnp.zeros(3), 10, 2, factor=-1.0), "factor"),
    ],
)
def test_terms_reject_bad_input(call, name):
    with pytest.raises((ValueError, TypeError, AssertionError), match=f"`{name}`"):
        call()


def test_traced_static_arguments_are_rejected():
    with pytest.raises(TypeError, match="`temperature`"):
        jax.jit(lambda t: logprobs_from_logits(jnp.zeros((1, 2)), jnp.zeros(1, jnp.int32), t))(1.0)
    with pytest.raises(TypeError, match="`max_len`"):
        jax.jit(lambda m: overlong_penalty(jnp.zeros(2), m, 2))(10)


# ----------------------------------------------------------------------------- entropy_from_logits


def test_entropy_hand_cases():
    np.testing.assert_allclose(entropy_from_logits(jnp.zeros((2, 5))), [math.log(5)] * 2, rtol=1e-6)
    np.testing.assert_allclose(entropy_from_logits(jnp.array([1e4, 1e4, -1e4])), math.log(2), rtol=1e-6)
    # p = (1/4, 3/4): H = -(1/4 log 1/4 + 3/4 log 3/4).
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(entropy_from_logits(jnp.array([0.0, math.log(3.0), -jnp.inf])), h, rtol=1e-6)
    np.testing.assert_allclose(entropy_from_logits(jnp.array([2.0, -jnp.inf, -jnp.inf])), 0.0, atol=1e-7)


def test_entropy_gradient_with_banned_tokens_is_finite_and_correct():
    z = np.array([0.3, -1.2, 2.0])

    def reference(x):
        p = np.exp(np_log_softmax(x))
        return float(-(p * np.log(p)).sum())

    with jax.enable_x64(True):
        g = jax.grad(lambda x: entropy_from_logits(x))(jnp.asarray(np.append(z, -np.inf)))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g[:3], np_fd_grad(reference, z), rtol=1e-6, atol=1e-9)
    assert g[3] == 0.0


@PROPS
@given(seed=seeds, scale=st.sampled_from([0.1, 3.0, 30.0]))
def test_entropy_matches_numpy_and_bounds(seed, scale):
    logits = np.random.default_rng(seed).normal(scale=scale, size=LOGIT_SHAPE)
    log_p = np_log_softmax(logits)
    expected = -(np.exp(log_p) * log_p).sum(-1)
    out = jax.jit(entropy_from_logits)(jnp.asarray(logits, jnp.float32))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(out) >= -1e-6) and np.all(np.asarray(out) <= math.log(LOGIT_SHAPE[-1]) + 1e-5)


# ----------------------------------------------------------------------------- kl_penalty


def test_kl_hand_case():
    logp, ref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))
    d = math.log(0.5)  # ref - logp
    np.testing.assert_allclose(kl_penalty(logp, ref, "k1"), [-d], rtol=1e-6)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k2"), [d * d / 2], rtol=1e-6)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k3"), [0.5 - d - 1], rtol=1e-5)
    np.testing.assert_allclose(kl_penalty(logp, ref, "k1", clamp=0.5), [0.5], rtol=1e-6)
    np.testing.assert_allclose(kl_penalty(ref, logp, "k1", clamp=0.5), [-0.5], rtol=1e-6)


@PROPS
@given(seed=seeds, kind=st.sampled_from(["k1", "k3"]))
def test_k1_and_k3_are_unbiased_estimators_of_kl(seed, kind):
    # Exact expectation under pi over a small vocabulary: sum_v pi_v k(v) = KL(pi || ref).
    rng = np.random.default_rng(seed)
    log_pi = np_log_softmax(rng.normal(size=(3, 6)))
    log_ref = np_log_softmax(rng.normal(size=(3, 6)))
    per_token = np.asarray(jitted_kl(*(jnp.asarray(x, jnp.float32) for x in (log_pi, log_ref)), kind=kind))
    exact = (np.exp(log_pi) * (log_pi - log_ref)).sum(-1)
    np.testing.assert_allclose((np.exp(log_pi) * per_token).sum(-1), exact, rtol=1e-4, atol=1e-5)


@PROPS
@given(seed=seeds, kind=st.sampled_from(["k1", "k2", "k3"]), clamp=st.sampled_from([None, 0.5, 10.0]))
def test_kl_matches_numpy_and_signs(seed, kind, clamp):
    rng = np.random.default_rng(seed)
    logp, ref = rng.normal(scale=2.0, size=(2, 2, 5))
    out = np.asarray(
        jitted_kl(jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32), kind=kind, clamp=clamp)
    )
    expected = np_kl(logp, ref, kind)
    if clamp is not None:
        expected = np.clip(expected, -clamp, clamp)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    if kind != "k1":
        assert np.all(out >= 0)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_gradient_matches_finite_differences(kind):
    rng = np.random.default_rng(1)
    logp, ref = rng.normal(size=(2, 2, 3))
    weights = rng.normal(size=(2, 3))
    with jax.enable_x64(True):
        g = jax.grad(lambda x: jnp.sum(kl_penalty(x, jnp.asarray(ref), kind) * weights))(jnp.asarray(logp))
    np.testing.assert_allclose(
        g, np_fd_grad(lambda x: float((np_kl(x, ref, kind) * weights).sum()), logp), rtol=1e-6, atol=1e-8
    )


def test_k3_stays_finite_for_extreme_log_ratios():
    logp = jnp.array([-200.0, 0.0, 200.0])
    ref = jnp.zeros(3)
    out = kl_penalty(logp, ref, "k3")
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out[1], 0.0, atol=1e-7)
    np.testing.assert_allclose(out[2], math.exp(-200.0) + 200.0 - 1, rtol=1e-6)
    clamped = kl_penalty(logp, ref, "k3", clamp=10.0)
    np.testing.assert_allclose(clamped, [10.0, 0.0, 10.0], rtol=1e-6)
    g = jax.grad(lambda x: jnp.sum(kl_penalty(x, ref, "k3", clamp=10.0)))(logp)
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.0])


# ----------------------------------------------------------------------------- overlong_penalty


def test_overlong_penalty_hand_case():
    # DAPO with L_max = 20, L_cache = 4, factor 0.5: free up to 16, linear to -0.5 at 20, -0.5 beyond.
    lengths = jnp.array([0, 16, 17, 18, 20, 21, 100])
    np.testing.assert_allclose(
        overlong_penalty(lengths, 20, 4, 0.5), [0, 0, -0.125, -0.25, -0.5, -0.5, -0.5], rtol=1e-6
    )
    np.testing.assert_allclose(overlong_penalty(jnp.array([17.0, 19.0]), 20, 4), [-0.25, -0.75], rtol=1e-6)
    assert overlong_penalty(jnp.array([3]), 4, 4)[0] == pytest.approx(-0.75)


@PROPS
@given(
    seed=seeds, max_len=st.integers(1, 50), frac=st.floats(0.01, 1.0), factor=st.sampled_from([0.0, 0.5, 1.0])
)
def test_overlong_penalty_matches_dapo_piecewise_formula(seed, max_len, frac, factor):
    buffer_len = max(1, int(frac * max_len))
    lengths = np.random.default_rng(seed).integers(0, 2 * max_len + 2, size=16)
    expected = []
    for y in lengths:
        if y <= max_len - buffer_len:
            expected.append(0.0)
        elif y <= max_len:
            expected.append(factor * ((max_len - buffer_len) - y) / buffer_len)
        else:
            expected.append(-factor)
    out = overlong_penalty(jnp.asarray(lengths), max_len, buffer_len, factor)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    order = np.argsort(lengths)
    assert np.all(np.diff(np.asarray(out)[order]) <= 1e-7)  # longer is never rewarded more


def test_terms_under_vmap_equal_loop():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, *LOGIT_SHAPE)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, LOGIT_SHAPE[-1], size=(3, *LOGIT_SHAPE[:-1])))
    lp = jax.vmap(lambda z, y: logprobs_from_logits(z, y, 0.9))(logits, labels)
    ent = jax.vmap(entropy_from_logits)(logits)
    kl = jax.vmap(lambda a, b: kl_penalty(a, b, "k3"))(lp, lp[::-1])
    pen = jax.vmap(lambda n: overlong_penalty(n, 10, 3))(jnp.arange(30).reshape(3, 10))
    for k in range(3):
        np.testing.assert_allclose(lp[k], logprobs_from_logits(logits[k], labels[k], 0.9), rtol=1e-6)
        np.testing.assert_allclose(ent[k], entropy_from_logits(logits[k]), rtol=1e-6)
        np.testing.assert_allclose(kl[k], kl_penalty(lp[k], lp[::-1][k], "k3"), rtol=1e-6)
        np.testing.assert_allclose(
            pen[k], overlong_penalty(jnp.arange(30).reshape(3, 10)[k], 10, 3), rtol=1e-6
        )


def test_terms_under_jit_equal_eager():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=LOGIT_SHAPE), jnp.float32)
    labels = jnp.asarray(rng.integers(0, LOGIT_SHAPE[-1], size=LOGIT_SHAPE[:-1]))
    np.testing.assert_allclose(
        jitted_logprobs(logits, labels, temperature=0.6), logprobs_from_logits(logits, labels, 0.6), rtol=1e-6
    )
    a, b = logits[..., 0], logits[..., 1]
    np.testing.assert_allclose(jitted_kl(a, b, kind="k2", clamp=1.0), kl_penalty(a, b, "k2", 1.0), rtol=1e-6)
    pen = jax.jit(overlong_penalty, static_argnames=("max_len", "buffer_len", "factor"))
    np.testing.assert_allclose(
        pen(jnp.arange(12), max_len=10, buffer_len=4, factor=2.0),
        overlong_penalty(jnp.arange(12), 10, 4, 2.0),
        rtol=1e-6,
    )
