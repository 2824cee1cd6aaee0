"""The pieces of the policy loss on their own: registered ratio kinds, the clipped surrogate, its metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax import kernels
from marljax.kernels.losses_registry import Registry
from marljax.kernels.losses_surrogate import gspo_log_ratio, gspo_token_log_ratio, ppo_log_ratio


def arrays(seed: int = 0, n: int = 4, length: int = 6):
    rng = np.random.default_rng(seed)
    logp = jnp.asarray(-rng.random((n, length)) * 2, jnp.float32)
    logp_old = jnp.asarray(logp + rng.normal(size=(n, length)) * 0.4, jnp.float32)
    mask = jnp.asarray(rng.random((n, length)) > 0.25).at[0].set(False)  # response 0 is empty
    adv = jnp.asarray(rng.normal(size=n), jnp.float32)
    return logp, logp_old, mask, adv


@pytest.fixture
def scratch_ratios(monkeypatch):
    """POLICY_RATIOS as it is, with anything a test registers dropped afterwards."""
    monkeypatch.setattr(kernels.POLICY_RATIOS, "_functions", dict(kernels.POLICY_RATIOS._functions))
    return kernels.POLICY_RATIOS


def test_loss_types_are_the_registered_ratio_kinds():
    assert kernels.LOSS_TYPES == kernels.POLICY_RATIOS.names() == ("ppo", "gspo", "gspo-token")
    assert kernels.POLICY_RATIOS.get("ppo") is ppo_log_ratio
    assert kernels.POLICY_RATIOS.get("gspo") is gspo_log_ratio
    assert kernels.POLICY_RATIOS.get("gspo-token") is gspo_token_log_ratio


def test_a_registry_takes_a_name_once_and_names_its_option_for_an_unknown_one():
    surrogates = Registry("surrogate")

    @surrogates.register("clip")
    def clip(r):
        return r

    assert surrogates.get("clip") is clip and surrogates.names() == ("clip",)
    with pytest.raises(ValueError, match="already registered"):
        surrogates.register("clip")(lambda r: r)
    with pytest.raises(ValueError, match="`surrogate` must be one of \\('clip',\\), got 'cispo'"):
        surrogates.get("cispo")


def test_a_new_loss_type_is_one_registered_function(scratch_ratios):
    @scratch_ratios.register("half-ppo")
    def half_ppo_log_ratio(logp, logp_old, mask):
        return 0.5 * (logp - logp_old)

    logp, logp_old, mask, adv = arrays(1)
    tokens, metrics = kernels.policy_loss_per_token(logp, logp_old, adv, mask, loss_type="half-ppo")
    ratio = jnp.exp(0.5 * (logp - logp_old))
    want = jnp.where(mask, kernels.clipped_surrogate(ratio, jnp.broadcast_to(adv[:, None], ratio.shape)), 0.0)
    np.testing.assert_allclose(tokens, want, rtol=1e-6)
    assert float(metrics["ratio_max"]) == pytest.approx(float(jnp.max(jnp.where(mask, ratio, 0.0))), rel=1e-6)
    loss, _ = kernels.policy_loss(logp, logp_old, adv, mask, loss_type="half-ppo", agg_mode="token-mean")
    assert float(loss) == pytest.approx(float(jnp.sum(want) / jnp.sum(mask)), rel=1e-6)


def test_clipped_surrogate_is_rlax_clipped_surrogate_pg_loss_per_token():
    rng = np.random.default_rng(2)
    ratio = jnp.asarray(np.exp(rng.normal(size=64) * 0.5), jnp.float32)
    adv = jnp.asarray(rng.normal(size=64), jnp.float32)
    eps = 0.2
    # rlax: -fmin(r A, clip(r, 1 - eps, 1 + eps) A), before its mean over time
    rlax_form = -jnp.fmin(ratio * adv, jnp.clip(ratio, 1 - eps, 1 + eps) * adv)
    np.testing.assert_allclose(kernels.clipped_surrogate(ratio, adv, eps, eps), rlax_form, rtol=1e-6)
    # dual clip: a negative advantage costs at most -c A
    dual = kernels.clipped_surrogate(ratio, adv, eps, eps, dual_clip=1.5)
    np.testing.assert_allclose(
        dual, jnp.where(adv < 0, jnp.minimum(rlax_form, -1.5 * adv), rlax_form), rtol=1e-6
    )
    # clip-higher: the upper bound moves alone
    high = kernels.clipped_surrogate(ratio, adv, eps, 0.5)
    np.testing.assert_allclose(high, -jnp.fmin(ratio * adv, jnp.clip(ratio, 1 - eps, 1.5) * adv), rtol=1e-6)


@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "gspo-token"])
def test_policy_loss_per_token_is_the_composition_of_the_pieces(loss_type):
    logp, logp_old, mask, adv = arrays(3)
    weights = jnp.asarray(np.random.default_rng(4).random(mask.shape) * 2, jnp.float32)
    options = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    tokens, metrics = jax.jit(
        lambda *a: kernels.policy_loss_per_token(
            *a, loss_type=loss_type, importance_weights=weights, **options
        )
    )(logp, logp_old, adv, mask)

    ratio = jnp.exp(kernels.log_ratio(logp, logp_old, mask, loss_type=loss_type))
    per_token_adv = jnp.where(mask, adv[:, None], 0.0)
    want = jnp.where(mask, kernels.clipped_surrogate(ratio, per_token_adv, **options) * weights, 0.0)
    np.testing.assert_allclose(tokens, want, rtol=1e-6, atol=1e-7)
    token_lr = kernels.log_ratio(logp, logp_old, mask, loss_type="ppo")
    want_metrics = kernels.surrogate_metrics(ratio, per_token_adv, token_lr, mask, **options)
    assert sorted(metrics) == sorted(want_metrics)
    for key, value in want_metrics.items():
        np.testing.assert_allclose(metrics[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


def test_log_ratio_kinds_by_hand():
    logp_old = jnp.zeros((1, 3))
    logp = jnp.array([[0.1, 0.3, jnp.nan]])  # the third token is padding and holds garbage
    mask = jnp.array([[True, True, False]])
    np.testing.assert_allclose(kernels.log_ratio(logp, logp_old, mask)[0, :2], [0.1, 0.3], rtol=1e-6)
    for kind in ("gspo", "gspo-token"):
        np.testing.assert_allclose(
            kernels.log_ratio(logp, logp_old, mask, loss_type=kind)[0, :2], [0.2, 0.2], rtol=1e-6
        )
    assert float(kernels.log_ratio(jnp.full((1, 2), 30.0), jnp.zeros((1, 2)), None, clamp=5.0)[0, 0]) == 5.0
    # gspo-token: the sequence ratio's value, each token's own gradient
    grad = jax.grad(lambda x: kernels.log_ratio(x, logp_old, mask, loss_type="gspo-token")[0, 0])(logp)
    np.testing.assert_array_equal(grad, [[1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "call, name",
    [
        (
            lambda: kernels.log_ratio(jnp.zeros((2, 3)), jnp.zeros((2, 3)), None, loss_type="grpo"),
            "loss_type",
        ),
        (lambda: kernels.log_ratio(jnp.zeros((2, 3)), jnp.zeros((2, 2)), None), "logp_old"),
        (lambda: kernels.log_ratio(jnp.zeros((2, 3)), jnp.zeros((2, 3)), None, clamp=0.0), "clamp"),
        (lambda: kernels.clipped_surrogate(jnp.ones(3), jnp.ones(2)), "advantages"),
        (lambda: kernels.clipped_surrogate(jnp.ones(3), jnp.ones(3), clip_low=1.0), "clip_low"),
        (lambda: kernels.clipped_surrogate(jnp.ones(3), jnp.ones(3), dual_clip=0.5), "dual_clip"),
        (lambda: kernels.surrogate_metrics(jnp.ones(3), jnp.ones(3), jnp.ones(2), None), "token_log_ratio"),
    ],
)
def test_the_pieces_reject_bad_input_naming_the_argument(call, name):
    with pytest.raises((ValueError, TypeError, AssertionError), match=f"`{name}`"):
        call()
