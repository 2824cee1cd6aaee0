"""Kernels run on inputs sharded over 8 simulated CPU devices and give the single-device numbers."""

import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from marljax import kernels

    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "tensor"))
    rng = np.random.default_rng(0)
    n, length = 64, 16
    rewards = rng.normal(size=n).astype(np.float32)
    groups = rng.integers(0, 8, n).astype(np.int32)
    logp = rng.normal(size=(n, length)).astype(np.float32) * 0.1 - 2
    logp_old = logp + rng.normal(size=(n, length)).astype(np.float32) * 0.05
    mask = rng.random((n, length)) < 0.8

    def pipeline(rewards, groups, logp, logp_old, mask):
        adv = kernels.grpo_advantages(rewards, groups, 8)
        loss, _ = kernels.policy_loss(logp, logp_old, adv, mask)
        return adv, loss, jax.grad(lambda lp: kernels.policy_loss(lp, logp_old, adv, mask)[0])(logp)

    fn = jax.jit(pipeline)
    want = fn(rewards, groups, logp, logp_old, mask)
    row = NamedSharding(mesh, P("data"))
    sharded = [jax.device_put(x, row) for x in (rewards, groups, logp, logp_old, mask)]
    got = fn(*sharded)
    assert len(got[0].sharding.device_set) > 1
    for a, b in zip(got, want):
        # Cross-device reductions sum in another order: float32 rounding only.
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # The dense path with agents on one mesh axis and turns on the other.
    dense = rng.normal(size=(4, 2, 8)).astype(np.float32)
    spread = jax.device_put(dense, NamedSharding(mesh, P("data", "tensor")))
    want = kernels.dense_group_advantages(dense)
    np.testing.assert_allclose(jax.jit(kernels.dense_group_advantages)(spread), want, rtol=1e-6)
    print("SHARDED-OK")
    """
)


@pytest.mark.slow
def test_kernels_on_eight_simulated_devices(run_on_fake_devices):
    result = run_on_fake_devices("-c", SCRIPT)
    assert result.returncode == 0 and "SHARDED-OK" in result.stdout, result.stderr[-3000:]
