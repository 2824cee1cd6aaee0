"""Every advantage estimator: jit equals eager, and vmap over a batch equals a Python loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax import kernels

N = 12
RNG = np.random.default_rng(7)
REWARDS = RNG.normal(size=(3, N)).astype(np.float32)
IDS = RNG.integers(0, 3, size=(3, N)).astype(np.int32)
MASK = RNG.random((3, N)) < 0.8

CASES = {
    "grpo": lambda r, i, m: kernels.grpo_advantages(r, i, 3, m),
    "dr_grpo": lambda r, i, m: kernels.dr_grpo_advantages(r, i, 3, m),
    "rloo": lambda r, i, m: kernels.rloo_advantages(r, i, 3, m),
    "at_grpo": lambda r, i, m: kernels.at_grpo_advantages(
        r, i, i % 2, (i + 1) % 2, num_problems=3, num_turns=2, num_agents=2, mask=m
    ),
    "mars2": lambda r, i, m: kernels.mars2_advantages(r, i, 3, m),
    "dr_mas": lambda r, i, m: kernels.dr_mas_advantages(r, i, 3, m)[0],
    "dr_mas_grouped": lambda r, i, m: kernels.dr_mas_advantages(r, i % 2, 2, m, group_ids=i, num_groups=3)[0],
    "amplification": lambda r, i, m: kernels.amplification_factor(r, i, 3, m),
    "tree_returns": lambda r, i, m: kernels.tree_returns(
        r, jnp.arange(N) // 2 - 1, gamma=0.9, max_depth=4, mask=m
    ),
    "magrpo": lambda r, i, m: kernels.magrpo_advantages(
        r, jnp.arange(N) // 2 - 1, jnp.arange(N) % 2, num_agents=2, group_size=2, mask=m
    ),
    "sharp": lambda r, i, m: kernels.sharp_advantages(r.reshape(6, 2), i[:6], 3, m.reshape(6, 2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_and_vmap(name):
    fn = CASES[name]
    eager = [
        np.asarray(fn(jnp.asarray(r), jnp.asarray(i), jnp.asarray(m))) for r, i, m in zip(REWARDS, IDS, MASK)
    ]
    jitted = [np.asarray(jax.jit(fn)(r, i, m)) for r, i, m in zip(REWARDS, IDS, MASK)]
    batched = np.asarray(jax.jit(jax.vmap(fn))(REWARDS, IDS, MASK))
    for b in range(3):
        np.testing.assert_allclose(jitted[b], eager[b], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(batched[b], eager[b], rtol=1e-6, atol=1e-6)
