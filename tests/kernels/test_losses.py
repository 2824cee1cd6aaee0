"""Tests for the policy-loss kernels: policy_loss(_per_token), aggregate_loss, tis_weights.

References are written independently of the kernels: plain NumPy loops with the
piecewise form of the clipped objective, NumPy central finite differences in
float64, and torch autograd for the stop-gradient (GSPO-token) variant.
"""

from __future__ import annotations

import functools
import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _numeric import np_fd_grad
from hypothesis import given, settings

from marljax.kernels.losses import AGG_MODES, aggregate_loss, policy_loss, policy_loss_per_token, tis_weights

PROPS = settings(max_examples=20, deadline=None)
STATIC = ("loss_type", "clip_low", "clip_high", "dual_clip", "log_ratio_clamp", "agg_mode", "norm_constant")


# ----------------------------------------------------------------------------- NumPy references


def np_token_losses(logp, logp_old, adv, mask, loss_type="ppo", eps_lo=0.2, eps_hi=0.2, c=None, w=None):
    """Per-token loss by explicit cases: A >= 0: obj = A min(r, 1+eh); A < 0: obj = A max(r, 1-el)."""
    logp, logp_old, mask = np.asarray(logp, np.float64), np.asarray(logp_old, np.float64), np.asarray(mask)
    n, length = logp.shape
    adv = np.asarray(adv, np.float64)
    adv = np.repeat(adv[:, None], length, axis=1) if adv.ndim == 1 else adv
    out = np.zeros((n, length))
    for i in range(n):
        valid = mask[i]
        log_ratio = logp[i] - logp_old[i]
        if loss_type == "ppo":
            ratios = np.exp(np.where(valid, log_ratio, 0.0))
        else:  # GSPO: geometric mean of the valid token ratios
            s = math.exp(log_ratio[valid].mean()) if valid.any() else 1.0
            ratios = np.full(length, s)
        for t in range(length):
            if not valid[t]:
                continue
            a, r = adv[i, t], ratios[t]
            if a >= 0:
                obj = a * min(r, 1 + eps_hi)
            else:
                obj = a * max(r, 1 - eps_lo)
                if c is not None:
                    obj = max(obj, c * a)
            weight = 1.0 if w is None else np.broadcast_to(np.asarray(w).reshape(n, -1), (n, length))[i, t]
            out[i, t] = -obj * weight
    return out


def np_aggregate(loss, mask, mode, norm=None):
    loss, mask = np.asarray(loss, np.float64), np.asarray(mask)
    if mode == "token-mean":
        return loss[mask].sum() / max(mask.sum(), 1)
    per_seq = []
    for row, m in zip(loss, mask):
        if not m.any():
            continue
        vals = row[m]
        if mode == "seq-mean-token-mean":
            per_seq.append(vals.mean())
        elif mode == "seq-mean-token-sum":
            per_seq.append(vals.sum())
        else:
            per_seq.append(vals.sum() / (loss.shape[1] if norm is None else norm))
    return float(np.mean(per_seq)) if per_seq else 0.0


def random_batch(seed, n, length, scale=0.3, per_token_adv=False, empty_row=False):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.1, 3.0, size=(n, length))
    logp_old = logp + rng.normal(scale=scale, size=(n, length))
    adv = rng.normal(size=(n, length) if per_token_adv else (n,))
    lengths = rng.integers(1, length + 1, size=n)
    mask = np.arange(length)[None, :] < lengths[:, None]
    if empty_row:
        mask[0] = False
    return logp, logp_old, adv, mask


@functools.cache
def jk(fn, **opts):
    """`fn` jitted with static options `opts` (one compile per option set; faster than eager here)."""
    return jax.jit(functools.partial(fn, **opts))


# ----------------------------------------------------------------------------- hand-computed cases


def test_ppo_hand_case_clip_and_dual_clip():
    # Four tokens: ratio 1.5 (A=+1, clipped high), 0.5 (A=-1, clipped low), 1.1 (A=+2, inside), 5 (A=-1, dual clip).
    logp_old = jnp.zeros((1, 4))
    logp = jnp.log(jnp.array([[1.5, 0.5, 1.1, 5.0]]))
    adv = jnp.array([[1.0, -1.0, 2.0, -1.0]])
    mask = jnp.ones((1, 4), bool)
    # losses: -1.2 ; +0.8 ; -2.2 ; PPO: +5.0, dual clip c=3: min(5, 3) = 3.
    tokens, metrics = jk(policy_loss_per_token, dual_clip=3.0)(logp, logp_old, adv, mask)
    np.testing.assert_allclose(tokens, [[-1.2, 0.8, -2.2, 3.0]], rtol=1e-6)
    loss, _ = jk(policy_loss, dual_clip=3.0)(logp, logp_old, adv, mask)
    np.testing.assert_allclose(loss, (-1.2 + 0.8 - 2.2 + 3.0) / 4, rtol=1e-6)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["clip_frac_low"] == pytest.approx(0.25)
    assert metrics["clip_frac_high"] == pytest.approx(0.25)
    assert metrics["dual_clip_frac"] == pytest.approx(0.25)
    assert metrics["ratio_max"] == pytest.approx(5.0, rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 5.0) / 4, rel=1e-6)
    assert metrics["approx_kl"] == pytest.approx(-np.log([1.5, 0.5, 1.1, 5.0]).mean(), rel=1e-6)
    k3 = np.array([1.5, 0.5, 1.1, 5.0]) - 1 - np.log([1.5, 0.5, 1.1, 5.0])
    assert metrics["approx_kl_k3"] == pytest.approx(k3.mean(), rel=1e-5)
    # Without dual clip the last token costs 5.
    tokens, metrics = jk(policy_loss_per_token)(logp, logp_old, adv, mask)
    assert tokens[0, 3] == pytest.approx(5.0, rel=1e-6)
    assert metrics["dual_clip_frac"] == 0.0


def test_dapo_clip_higher_is_asymmetric():
    logp_old = jnp.zeros((1, 2))
    logp = jnp.log(jnp.array([[1.25, 0.75]]))
    adv = jnp.array([[1.0, -1.0]])
    tokens, _ = jk(policy_loss_per_token, clip_low=0.2, clip_high=0.28)(logp, logp_old, adv, None)
    # 1.25 < 1.28: not clipped; 0.75 < 0.8: clipped to 0.8.
    np.testing.assert_allclose(tokens, [[-1.25, 0.8]], rtol=1e-6)


def test_gspo_hand_case():
    # One response, valid log-ratios 0.1 and 0.3 (third token padding): s = exp(0.2).
    logp_old = jnp.zeros((1, 3))
    logp = jnp.array([[0.1, 0.3, 7.0]])
    mask = jnp.array([[True, True, False]])
    adv = jnp.array([1.0])
    for loss_type in ("gspo", "gspo-token"):
        loss, metrics = jk(policy_loss, loss_type=loss_type, clip_low=0.5, clip_high=0.5)(
            logp, logp_old, adv, mask
        )
        assert loss == pytest.approx(-math.exp(0.2), rel=1e-6)
        assert metrics["ratio_mean"] == pytest.approx(math.exp(0.2), rel=1e-6)
        loss, metrics = jk(policy_loss, loss_type=loss_type, clip_low=0.1, clip_high=0.1)(
            logp, logp_old, adv, mask
        )
        assert loss == pytest.approx(-1.1, rel=1e-6)
        assert metrics["clip_frac"] == 1.0
    # Gradient of -s w.r.t. each valid logp_t is -s / 2; padding gets 0.
    gspo = functools.partial(policy_loss, loss_type="gspo", clip_low=0.5, clip_high=0.5)
    g = jax.jit(jax.grad(lambda x: gspo(x, logp_old, adv, mask)[0]))(logp)
    np.testing.assert_allclose(g, [[-math.exp(0.2) / 2, -math.exp(0.2) / 2, 0.0]], rtol=1e-6)


def test_importance_weights_scale_tokens_without_gradient():
    logp_old = jnp.zeros((1, 2))
    logp = jnp.log(jnp.array([[1.1, 0.9]]))
    adv = jnp.array([1.0])
    w = jnp.array([[0.5, 2.0]])
    tokens, _ = jk(policy_loss_per_token)(logp, logp_old, adv, None, importance_weights=w)
    np.testing.assert_allclose(tokens, [[-0.55, -1.8]], rtol=1e-6)
    gw = jax.jit(jax.grad(lambda w_: policy_loss(logp, logp_old, adv, None, importance_weights=w_)[0]))(w)
    np.testing.assert_array_equal(gw, 0.0)
    # Sequence-level weights [N] broadcast over tokens.
    tokens, _ = jk(policy_loss_per_token)(logp, logp_old, adv, None, importance_weights=jnp.array([3.0]))
    np.testing.assert_allclose(tokens, [[-3.3, -2.7]], rtol=1e-6)


def test_aggregate_hand_case_and_empty_rows():
    loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [jnp.nan, jnp.inf, 9.0]])
    mask = jnp.array([[True, True, False], [True, False, False], [False, False, False]])
    assert aggregate_loss(loss, mask, "token-mean") == pytest.approx(7 / 3)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean") == pytest.approx((1.5 + 4.0) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum") == pytest.approx((3.0 + 4.0) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm") == pytest.approx(3.5 / 3)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_constant=7) == pytest.approx(0.5)
    nothing = jnp.zeros((2, 3), bool)
    for mode in AGG_MODES:
        assert aggregate_loss(loss[:2], nothing, mode) == 0.0
        g = jax.jit(jax.grad(functools.partial(aggregate_loss, mask=nothing, mode=mode)))(loss[:2])
        assert np.all(np.isfinite(g))


def test_tis_hand_cases():
    trainer = jnp.log(jnp.array([[3.0, 0.4, 1.0, 5.0]]))
    sampler = jnp.zeros((1, 4))
    mask = jnp.array([[True, True, True, False]])
    w, m = tis_weights(trainer, sampler, mask, level="token", cap=2.0)
    np.testing.assert_allclose(w, [[2.0, 0.4, 1.0, 0.0]], rtol=1e-6)
    assert m["frac_truncated"] == pytest.approx(1 / 3)
    assert m["frac_masked"] == 0.0
    assert m["weight_mean"] == pytest.approx(3.4 / 3, rel=1e-6)
    assert m["mismatch_kl"] == pytest.approx(-np.log([3.0, 0.4, 1.0]).mean(), rel=1e-6)
    # Sequence level: 3 * 0.4 * 1 = 1.2 on every valid token.
    w, m = tis_weights(trainer, sampler, mask, level="sequence", cap=2.0)
    np.testing.assert_allclose(w, [[1.2, 1.2, 1.2, 0.0]], rtol=1e-6)
    assert m["frac_truncated"] == 0.0
    w, _ = tis_weights(trainer, sampler, mask, level="sequence", cap=1.1)
    np.testing.assert_allclose(w, [[1.1, 1.1, 1.1, 0.0]], rtol=1e-6)
    # Mask mode, [lo, hi] = [0.5, 2]: 3 and 0.4 are rejected, 1 is kept.
    w, m = tis_weights(trainer, sampler, mask, mode="mask", cap=2.0)
    np.testing.assert_allclose(w, [[0.0, 0.0, 1.0, 0.0]], rtol=1e-6)
    assert m["frac_masked"] == pytest.approx(2 / 3)
    w, _ = tis_weights(trainer, sampler, mask, mode="mask", lo=0.3, hi=4.0)
    np.testing.assert_allclose(w, [[3.0, 0.4, 1.0, 0.0]], rtol=1e-6)
    w, _ = tis_weights(trainer, sampler, mask, level="sequence", mode="mask", lo=0.3, hi=1.1)
    np.testing.assert_array_equal(w, 0.0)


def test_tis_veto_drops_a_sequence_with_one_far_off_token():
    # row 0 has a valid token at ratio 0.05 (< veto 0.1); row 1's 0.05 sits in padding; row 2 is empty
    trainer = jnp.log(jnp.array([[1.5, 0.05, 1.0], [0.8, 1.2, 0.05], [0.01, 1.0, 1.0]]))
    sampler = jnp.zeros((3, 3))
    mask = jnp.array([[True, True, True], [True, True, False], [False, False, False]])
    w, m = tis_weights(trainer, sampler, mask, cap=2.0, veto=0.1)
    np.testing.assert_allclose(w, [[0.0, 0.0, 0.0], [0.8, 1.2, 0.0], [0.0, 0.0, 0.0]], rtol=1e-6)
    assert m["frac_vetoed"] == pytest.approx(0.5)  # of the two sequences with valid tokens
    w, m = tis_weights(trainer, sampler, mask, cap=2.0)
    np.testing.assert_allclose(w[0], [1.5, 0.05, 1.0], rtol=1e-6)
    assert m["frac_vetoed"] == 0.0
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="veto"):
            tis_weights(trainer, sampler, mask, veto=bad)


def test_tis_sequence_level_does_not_overflow():
    trainer = jnp.full((2, 50), 40.0)  # sequence log-ratio 2000: exp overflows any float.
    sampler = jnp.zeros((2, 50))
    mask = jnp.ones((2, 50), bool)
    w, m = tis_weights(trainer, sampler, mask, level="sequence", cap=3.0)
    np.testing.assert_allclose(w, 3.0, rtol=1e-6)
    assert m["frac_truncated"] == 1.0
    w, _ = tis_weights(-trainer, sampler, mask, level="sequence", cap=3.0)
    np.testing.assert_array_equal(w, 0.0)  # underflows to 0, never NaN
    w, m = tis_weights(trainer, sampler, mask, level="sequence", mode="mask")
    np.testing.assert_array_equal(w, 0.0)
    assert all(np.isfinite(v) for v in m.values())


def test_tis_weights_have_no_gradient():
    trainer = jnp.array([[0.2, -0.3]])
    sampler = jnp.zeros((1, 2))
    g = jax.grad(lambda x: jnp.sum(tis_weights(x, sampler, None)[0]))(trainer)
    np.testing.assert_array_equal(g, 0.0)


# ----------------------------------------------------------------------------- gradients vs references


@pytest.mark.parametrize("loss_type", ["ppo", "gspo"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_value_and_grad_match_numpy_finite_differences(loss_type, mode):
    seed = 10 * AGG_MODES.index(mode) + len(loss_type)
    logp, logp_old, adv, mask = random_batch(seed, n=3, length=4, empty_row=True)
    adv_tok = np.random.default_rng(1).normal(size=logp.shape)
    weights = np.random.default_rng(2).uniform(0.5, 1.5, size=logp.shape)
    opts = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)

    def reference(x):
        tokens = np_token_losses(x, logp_old, adv_tok, mask, loss_type, 0.2, 0.28, 3.0, weights)
        return np_aggregate(tokens, mask, mode)

    with jax.enable_x64(True):

        def f(x):
            return policy_loss(
                x,
                jnp.asarray(logp_old),
                jnp.asarray(adv_tok),
                jnp.asarray(mask),
                loss_type=loss_type,
                agg_mode=mode,
                importance_weights=jnp.asarray(weights),
                **opts,
            )[0]

        value, grad = jax.value_and_grad(f)(jnp.asarray(logp))
        assert value.dtype == jnp.float64
    np.testing.assert_allclose(value, reference(logp), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad, np_fd_grad(reference, logp), rtol=1e-5, atol=1e-8)


def _torch_policy_loss(torch, logp, logp_old, adv, mask, loss_type, eps_lo, eps_hi, c):
    """Independent torch version (verl-style, with detach for GSPO-token), seq-mean-token-mean."""
    m = mask.double()
    log_ratio = (logp - logp_old) * m
    seq = log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
    if loss_type == "ppo":
        lr = log_ratio
    elif loss_type == "gspo":
        lr = seq.expand_as(log_ratio)
    else:
        lr = seq.detach() + logp - logp.detach()
    ratio = torch.exp(lr)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi)
    loss = torch.maximum(l1, l2)
    loss = torch.where(adv < 0, torch.minimum(loss, -c * adv), loss)
    per_seq = (loss * m).sum(-1) / m.sum(-1).clamp(min=1)
    return per_seq[m.sum(-1) > 0].mean()


@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "gspo-token"])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_policy_loss_grad_matches_torch_autograd(loss_type, per_token_adv):
    torch = pytest.importorskip("torch")
    logp, logp_old, adv, mask = random_batch(seed=7, n=4, length=5, scale=0.15, per_token_adv=per_token_adv)
    adv_full = adv if per_token_adv else np.repeat(adv[:, None], 5, axis=1)
    t_logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    t_loss = _torch_policy_loss(
        torch,
        t_logp,
        torch.tensor(logp_old),
        torch.tensor(adv_full),
        torch.tensor(mask),
        loss_type,
        0.1,
        0.15,
        2.0,
    )
    t_loss.backward()
    with jax.enable_x64(True):
        value, grad = jax.value_and_grad(
            lambda x: policy_loss(
                x,
                jnp.asarray(logp_old),
                jnp.asarray(adv),
                jnp.asarray(mask),
                loss_type=loss_type,
                clip_low=0.1,
                clip_high=0.15,
                dual_clip=2.0,
                agg_mode="seq-mean-token-mean",
            )[0]
        )(jnp.asarray(logp))
    np.testing.assert_allclose(value, t_loss.item(), rtol=1e-10)
    np.testing.assert_allclose(grad, t_logp.grad.numpy(), rtol=1e-8, atol=1e-12)


# ----------------------------------------------------------------------------- properties

SHAPE = (4, 6)  # one shape for all property examples, so each jitted kernel compiles once
seeds = st.integers(0, 2**31 - 1)


def f32(*xs):
    return [jnp.asarray(x, jnp.float32) for x in xs]


@functools.cache
def jitted_loss(grad=False, **opts):
    """Jitted policy_loss (optionally value_and_grad w.r.t. logp) with static options."""

    def f(logp, logp_old, adv, mask, weights):
        return policy_loss(logp, logp_old, adv, mask, importance_weights=weights, **opts)

    return jax.jit(jax.value_and_grad(f, has_aux=True) if grad else f)


@functools.cache
def jitted_tokens(**opts):
    return jax.jit(lambda lp, lo, a, m: policy_loss_per_token(lp, lo, a, m, **opts)[0])


jitted_aggregate = jax.jit(aggregate_loss, static_argnames=("mode", "norm_constant"))
jitted_tis = jax.jit(tis_weights, static_argnames=("level", "cap", "mode", "lo", "hi"))


def property_batch(seed, scale=0.3, per_token_adv=False):
    """A `SHAPE` batch with random lengths; every third seed has an empty response."""
    return random_batch(seed, *SHAPE, scale=scale, per_token_adv=per_token_adv, empty_row=seed % 3 == 0)


@PROPS
@given(seed=seeds, clips=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.3)]))
def test_inside_clip_range_ppo_is_plain_importance_weighted_pg(seed, clips):
    eps_lo, eps_hi = clips
    rng = np.random.default_rng(seed)
    logp_old = rng.normal(size=SHAPE)
    log_ratio = rng.uniform(math.log(1 - eps_lo) * 0.99, math.log(1 + eps_hi) * 0.99, size=SHAPE)
    adv = rng.normal(size=SHAPE)
    mask = rng.random(SHAPE) < 0.7
    loss, metrics = jitted_loss(clip_low=eps_lo, clip_high=eps_hi, dual_clip=3.0)(
        *f32(logp_old + log_ratio, logp_old, adv), jnp.asarray(mask), None
    )
    expected = (-adv * np.exp(log_ratio))[mask].sum() / max(mask.sum(), 1)
    np.testing.assert_allclose(loss, expected, rtol=1e-4, atol=1e-5)
    assert metrics["clip_frac"] == 0.0 and metrics["dual_clip_frac"] == 0.0


@PROPS
@given(seed=seeds, loss_type=st.sampled_from(["ppo", "gspo", "gspo-token"]))
def test_clipping_never_increases_the_objective(seed, loss_type):
    logp, logp_old, adv, mask = property_batch(seed, scale=1.0, per_token_adv=True)
    clipped = jitted_tokens(loss_type=loss_type, clip_low=0.2, clip_high=0.28)(
        *f32(logp, logp_old, adv), jnp.asarray(mask)
    )
    kind = "ppo" if loss_type == "ppo" else "gspo"
    unclipped = np_token_losses(logp, logp_old, adv, mask, kind, eps_lo=1.0, eps_hi=np.inf)  # -A r, no clip
    # loss = -objective: clipping can only raise the loss (lower the objective), token by token.
    assert np.all(np.asarray(clipped) >= unclipped - 1e-5)
    np.testing.assert_allclose(
        clipped, np_token_losses(logp, logp_old, adv, mask, kind, 0.2, 0.28), rtol=1e-4, atol=1e-5
    )


@PROPS
@given(seed=seeds)
def test_gspo_ratio_is_invariant_to_token_order(seed):
    logp, logp_old, adv, mask = property_batch(seed)
    rng = np.random.default_rng(seed + 1)
    perm_logp, perm_old = logp.copy(), logp_old.copy()
    for i in range(SHAPE[0]):
        valid = np.flatnonzero(mask[i])
        order = rng.permutation(valid)
        perm_logp[i, valid], perm_old[i, valid] = logp[i, order], logp_old[i, order]
    f = jitted_loss(loss_type="gspo", clip_low=0.05, clip_high=0.05)
    a, ma = f(*f32(logp, logp_old, adv), jnp.asarray(mask), None)
    b, mb = f(*f32(perm_logp, perm_old, adv), jnp.asarray(mask), None)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ma["ratio_mean"], mb["ratio_mean"], rtol=1e-5)


@PROPS
@given(seed=seeds)
def test_gspo_token_equals_gspo_for_sequence_advantages(seed):
    logp, logp_old, adv, mask = property_batch(seed, scale=0.1)
    args = (*f32(logp, logp_old, adv), jnp.asarray(mask), None)
    (va, _), ga = jitted_loss(True, loss_type="gspo", clip_low=0.05, clip_high=0.08)(*args)
    (vb, _), gb = jitted_loss(True, loss_type="gspo-token", clip_low=0.05, clip_high=0.08)(*args)
    np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ga, gb, rtol=1e-4, atol=1e-6)


GARBAGE = st.sampled_from([0.0, 1e30, -1e30, np.inf, -np.inf, np.nan])


@PROPS
@given(seed=seeds, garbage=GARBAGE, loss_type=st.sampled_from(["ppo", "gspo", "gspo-token"]))
def test_masked_tokens_change_nothing(seed, garbage, loss_type):
    # One aggregation per loss type keeps compiles few; aggregate_loss is checked in every mode below.
    mode = {"ppo": "token-mean", "gspo": "seq-mean-token-mean", "gspo-token": "seq-mean-token-sum-norm"}[
        loss_type
    ]
    logp, logp_old, adv, mask = property_batch(seed, per_token_adv=True)
    w = np.random.default_rng(seed).uniform(0.5, 2.0, size=SHAPE)
    f = jitted_loss(True, loss_type=loss_type, agg_mode=mode, dual_clip=3.0)
    dirty = [np.where(mask, x, garbage) for x in (logp, logp_old, adv, w)]
    m = jnp.asarray(mask)
    (v1, m1), g1 = f(*f32(logp, logp_old, adv), m, *f32(w))
    (v2, m2), g2 = f(*f32(*dirty[:3]), m, *f32(dirty[3]))
    np.testing.assert_array_equal(v1, v2)
    np.testing.assert_array_equal(g1, g2)
    assert np.all(np.asarray(g2)[~mask] == 0)
    for key in m1:
        np.testing.assert_array_equal(m1[key], m2[key], err_msg=key)
    for agg in AGG_MODES:
        assert jitted_aggregate(*f32(dirty[0]), m, mode=agg) == jitted_aggregate(
            *f32(np.where(mask, logp, 0.0)), m, mode=agg
        )
    wt, mt = jitted_tis(*f32(*dirty[:2]), m, level="sequence")
    wc, mc = jitted_tis(*f32(logp, logp_old), m, level="sequence")
    np.testing.assert_array_equal(wt, wc)
    for key in mt:
        np.testing.assert_array_equal(mt[key], mc[key], err_msg=key)


@PROPS
@given(seed=seeds, valid=st.integers(1, SHAPE[1]))
def test_aggregation_modes_agree_for_equal_lengths(seed, valid):
    loss = jnp.asarray(np.random.default_rng(seed).normal(size=SHAPE), jnp.float32)
    mask = jnp.asarray(np.arange(SHAPE[1])[None, :].repeat(SHAPE[0], 0) < valid)
    token_mean = jitted_aggregate(loss, mask, mode="token-mean")
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
    close(jitted_aggregate(loss, mask, mode="seq-mean-token-mean"), token_mean)
    close(jitted_aggregate(loss, mask, mode="seq-mean-token-sum") / valid, token_mean)
    close(
        jitted_aggregate(loss, mask, mode="seq-mean-token-sum-norm", norm_constant=float(valid)), token_mean
    )
    full = jnp.ones(SHAPE, bool)
    close(
        jitted_aggregate(loss, full, mode="seq-mean-token-sum-norm"),
        jitted_aggregate(loss, full, mode="token-mean"),
    )


@PROPS
@given(seed=seeds, mode=st.sampled_from(AGG_MODES))
def test_aggregate_matches_numpy_reference(seed, mode):
    rng = np.random.default_rng(seed)
    loss = rng.normal(size=SHAPE)
    mask = rng.random(SHAPE) < 0.5
    np.testing.assert_allclose(
        jitted_aggregate(*f32(loss), jnp.asarray(mask), mode=mode),
        np_aggregate(loss, mask, mode),
        rtol=1e-5,
        atol=1e-6,
    )


@PROPS
@given(
    seed=seeds,
    level=st.sampled_from(["token", "sequence"]),
    mode=st.sampled_from(["truncate", "mask"]),
    cap=st.sampled_from([1.5, 2.0, 5.0]),
)
def test_tis_matches_numpy_reference(seed, level, mode, cap):
    rng = np.random.default_rng(seed)
    trainer = -rng.uniform(0.1, 2.0, size=SHAPE)
    sampler = trainer + rng.normal(scale=0.5, size=SHAPE)
    mask = rng.random(SHAPE) < 0.7
    expected = np.zeros(SHAPE)
    for i in range(SHAPE[0]):
        raw = np.exp(trainer[i] - sampler[i])
        if level == "sequence":
            raw = np.full(SHAPE[1], np.prod(raw[mask[i]]))
        for t in np.flatnonzero(mask[i]):
            if mode == "truncate":
                expected[i, t] = min(raw[t], cap)
            else:
                expected[i, t] = raw[t] if 1 / cap <= raw[t] <= cap else 0.0
    w, m = jitted_tis(*f32(trainer, sampler), jnp.asarray(mask), level=level, mode=mode, cap=cap)
    np.testing.assert_allclose(w, expected, rtol=1e-4, atol=1e-6)
    assert m["weight_mean"] == pytest.approx(expected[mask].mean() if mask.any() else 0.0, rel=1e-4, abs=1e-6)


def test_jit_with_static_options_equals_eager():
    logp, logp_old, adv, mask = [jnp.asarray(x) for x in random_batch(3, 3, 5, scale=0.5)]
    logp, logp_old, adv = (x.astype(jnp.float32) for x in (logp, logp_old, adv))
    opts = dict(
        loss_type="gspo-token",
        clip_low=0.1,
        clip_high=0.2,
        dual_clip=3.0,
        agg_mode="seq-mean-token-sum-norm",
        norm_constant=8.0,
    )
    jitted = jax.jit(policy_loss, static_argnames=STATIC)
    for o in (opts, dict(loss_type="ppo")):
        e, me = policy_loss(logp, logp_old, adv, mask, **o)
        j, mj = jitted(logp, logp_old, adv, mask, **o)
        np.testing.assert_allclose(e, j, rtol=1e-6)
        for key in me:
            np.testing.assert_allclose(me[key], mj[key], rtol=1e-6, err_msg=key)
    agg = jax.jit(aggregate_loss, static_argnames=("mode", "norm_constant"))
    np.testing.assert_allclose(
        agg(logp, mask, mode="seq-mean-token-mean"),
        aggregate_loss(logp, mask, "seq-mean-token-mean"),
        rtol=1e-6,
    )
    tis = jax.jit(tis_weights, static_argnames=("level", "cap", "mode", "lo", "hi"))
    np.testing.assert_allclose(
        tis(logp, logp_old, mask, level="sequence", cap=3.0)[0],
        tis_weights(logp, logp_old, mask, level="sequence", cap=3.0)[0],
        rtol=1e-6,
    )


def test_vmap_equals_loop():
    batches = [random_batch(s, 3, 4, per_token_adv=True) for s in range(3)]
    stack = [jnp.asarray(np.stack([b[k] for b in batches])) for k in range(4)]
    stack[:3] = [x.astype(jnp.float32) for x in stack[:3]]
    f = functools.partial(policy_loss, loss_type="gspo", clip_low=0.1, clip_high=0.1, agg_mode="token-mean")
    losses, metrics = jax.vmap(f)(*stack)
    for k in range(3):
        loss_k, metrics_k = f(*(x[k] for x in stack))
        np.testing.assert_allclose(losses[k], loss_k, rtol=1e-6)
        np.testing.assert_allclose(metrics["clip_frac"][k], metrics_k["clip_frac"], rtol=1e-6)
        np.testing.assert_allclose(
            jax.vmap(lambda x, m: aggregate_loss(x, m, "seq-mean-token-mean"))(stack[0], stack[3])[k],
            aggregate_loss(stack[0][k], stack[3][k], "seq-mean-token-mean"),
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            jax.vmap(lambda a, b, m: tis_weights(a, b, m, level="sequence")[0])(stack[0], stack[1], stack[3])[
                k
            ],
            tis_weights(stack[0][k], stack[1][k], stack[3][k], level="sequence")[0],
            rtol=1e-6,
        )


def test_bfloat16_inputs_are_computed_in_float32():
    logp, logp_old, adv, mask = random_batch(0, 2, 3)
    loss, _ = policy_loss(
        jnp.asarray(logp, jnp.bfloat16),
        jnp.asarray(logp_old, jnp.bfloat16),
        jnp.asarray(adv, jnp.bfloat16),
        jnp.asarray(mask),
    )
    assert loss.dtype == jnp.float32


# ----------------------------------------------------------------------------- bad input


def _good():
    logp = jnp.zeros((2, 3))
    return logp, logp, jnp.zeros(2), jnp.ones((2, 3), bool)


@pytest.mark.parametrize(
    "change, name",
    [
        (lambda a: (a[0], jnp.zeros((2, 4)), a[2], a[3]), "logp_old"),
        (lambda a: (jnp.zeros((2, 3), jnp.int32), a[1], a[2], a[3]), "logp"),
        (lambda a: (jnp.zeros(3), a[1], a[2], a[3]), "logp"),
        (lambda a: (a[0], a[1], jnp.zeros(3), a[3]), "advantages"),
        (lambda a: (a[0], a[1], jnp.zeros((2, 4)), a[3]), "advantages"),
        (lambda a: (a[0], a[1], jnp.zeros((2, 3, 1)), a[3]), "advantages"),
        (lambda a: (a[0], a[1], jnp.zeros(2, jnp.int32), a[3]), "advantages"),
        (lambda a: (a[0], a[1], a[2], jnp.ones((2, 3))), "response_mask"),
        (lambda a: (a[0], a[1], a[2], jnp.ones((2, 2), bool)), "response_mask"),
    ],
)
def test_policy_loss_rejects_bad_arrays(change, name):
    with pytest.raises((ValueError, TypeError, AssertionError), match=f"`{name}`"):
        policy_loss(*change(_good()))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(loss_type="grpo"), "loss_type"),
        (dict(agg_mode="seq-mean"), "agg_mode"),
        (dict(clip_low=1.0), "clip_low"),
        (dict(clip_low=-0.1), "clip_low"),
        (dict(clip_high=-0.1), "clip_high"),
        (dict(dual_clip=1.0), "dual_clip"),
        (dict(log_ratio_clamp=0.0), "log_ratio_clamp"),
        (dict(norm_constant=10.0), "norm_constant"),
        (dict(agg_mode="seq-mean-token-sum-norm", norm_constant=-1.0), "norm_constant"),
        (dict(importance_weights=jnp.ones((2, 4))), "importance_weights"),
        (dict(importance_weights=jnp.ones((2, 3), jnp.int32)), "importance_weights"),
    ],
)
def test_policy_loss_rejects_bad_options(kwargs, name):
    with pytest.raises((ValueError, TypeError, AssertionError), match=f"`{name}`"):
        policy_loss(*_good(), **kwargs)


def test_traced_option_is_rejected_with_its_name():
    with pytest.raises(TypeError, match="`clip_high`"):
        jax.jit(lambda c: policy_loss(*_good(), clip_high=c)[0])(0.2)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: aggregate_loss(jnp.zeros((2, 3)), jnp.ones((2, 3), bool), "mean"), "mode"),
        (lambda: aggregate_loss(jnp.zeros((2, 3)), jnp.ones((3, 2), bool), "token-mean"), "mask"),
        (lambda: aggregate_loss(jnp.zeros(3), jnp.ones(3, bool), "token-mean"), "loss"),
        (lambda: aggregate_loss(jnp.zeros((2, 3), jnp.int32), None, "token-mean"), "loss"),
        (lambda: tis_weights(jnp.zeros((2, 3)), jnp.zeros((2, 2)), None), "logp_sampler"),
        (lambda: tis_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones((2, 3), jnp.int32)), "mask"),
        (lambda: tis_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), None, level="geometric"), "level"),
        (lambda: tis_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), None, mode="clip"), "mode"),
        (lambda: tis_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), None, cap=0.0), "cap"),
        (lambda: tis_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), None, lo=0.5), "lo"),
        (lambda: tis_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), None, mode="mask", lo=3.0, hi=2.0), "lo"),
        (lambda: tis_weights(jnp.zeros(3), jnp.zeros(3), None), "logp_trainer"),
    ],
)
def test_other_kernels_reject_bad_input(call, name):
    with pytest.raises((ValueError, TypeError, AssertionError), match=f"`{name}`"):
        call()
