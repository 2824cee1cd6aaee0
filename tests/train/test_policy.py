"""Compiled steps: shared by policies of one architecture and settings, not by others; a shape compiles once."""

from __future__ import annotations

import jax
import jax.monitoring
import numpy as np
import pytest

from marljax.train.config import PolicyConfig
from marljax.train.learner import step_functions
from marljax.train.policy import Policy
from marljax.workflows.types import Rows


def config(seed: int, lr: float = 1e-3) -> PolicyConfig:
    # no clipping or weight decay: Adam's first step then moves each weight by lr (up to eps)
    return PolicyConfig.model_validate(
        {
            "model": {"preset": "tiny-qwen3", "seed": seed},
            "micro_batch_size": 4,
            "optimizer": {"lr": lr, "weight_decay": 0.0, "max_grad_norm": None},
        }
    )


def samples(n: int = 4) -> Rows:
    rng = np.random.default_rng(0)
    drawn = [(rng.integers(3, 200, 6), rng.integers(3, 200, 5), float(rng.normal())) for _ in range(n)]
    return Rows(
        [p for p, _, _ in drawn],
        [c for _, c, _ in drawn],
        [np.full(5, -4.0, np.float32)] * n,
        advantage=[a for _, _, a in drawn],
        policy="p",
    )


LOWERINGS: list[float] = []  # every jit cache miss lowers its function to StableHLO first
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: (
        LOWERINGS.append(secs) if event.endswith("jaxpr_to_mlir_module_duration") else None
    )
)


def moved(policy: Policy, before) -> float:
    return max(
        float(np.max(np.abs(np.asarray(a) - b)))
        for a, b in zip(jax.tree.leaves(policy.params), jax.tree.leaves(before))
    )


def test_a_second_agent_of_the_same_model_compiles_nothing():
    a, b = Policy("a", config(seed=1)), Policy("b", config(seed=2))  # same shapes, other weights
    a.update(samples())
    before = jax.tree.map(np.array, b.params)
    lowered = len(LOWERINGS)
    b.update(samples())
    assert len(LOWERINGS) == lowered  # b ran a's compiled step
    assert 0.9e-3 < moved(b, before) < 1.1e-3  # ... on its own weights, with its own optimiser


def test_other_optimiser_settings_get_their_own_step():
    slow, fast = Policy("slow", config(seed=1, lr=1e-3)), Policy("fast", config(seed=1, lr=3e-3))
    before = jax.tree.map(np.array, slow.params)
    slow.update(samples())
    fast.update(samples())
    np.testing.assert_allclose(moved(fast, before) / moved(slow, before), 3.0, rtol=1e-3)


@pytest.mark.parametrize("source", ["preset", "checkpoint"])
def test_the_first_shape_compiles_once(source, checkpoint):
    # Loaded weights are committed to their device while optax makes its step counter uncommitted:
    # the update's second call then saw other input shardings and compiled the same shapes again.
    model = (
        {"preset": "tiny-qwen3", "seed": 1}
        if source == "preset"
        else {"path": str(checkpoint("qwen3-tied-gqa2"))}
    )
    step_functions.cache_clear()  # the other case's model config may equal this one's
    policy = Policy("p", PolicyConfig.model_validate({"model": model, "micro_batch_size": 4}))
    lowered = []
    for _ in range(3):
        n = len(LOWERINGS)
        policy.update(samples())
        lowered.append(len(LOWERINGS) - n)
    assert lowered[0] > 0 and lowered[1:] == [0, 0]


def test_a_non_finite_update_is_skipped_reported_and_not_counted():
    policy = Policy("p", config(seed=1))
    before = jax.tree.map(np.array, policy.params)
    bad = samples()
    bad.advantage[1] = float("nan")
    metrics = policy.update(bad)
    assert metrics["skipped"] == 1.0 and metrics["lr"] == pytest.approx(1e-3)
    assert moved(policy, before) == 0.0 and policy.state.step == 0 and policy.version == 1
    metrics = policy.update(samples())
    assert metrics["skipped"] == 0.0 and moved(policy, before) > 0 and policy.state.step == 1
    assert int(policy.state.checkpoint()["step"]) == 1
    policy.reset_optimizer()  # e.g. after SFT: RL starts its schedule afresh
    assert policy.state.step == 0


def test_sft_takes_its_own_learning_rate():
    """`train.sft_lr`: an SFT step at another peak learning rate. Without clipping or weight decay
    Adam's first step moves each weight by about the learning rate (its largest move equals it up
    to eps), so the largest move tells the rate the step ran at."""
    for lr in (None, 1e-5):
        policy = Policy("p", config(seed=1, lr=1e-3))
        before = jax.tree.map(np.array, policy.params)
        own = policy.learner.optimizer_cfg
        policy.sft_update(samples(), None if lr is None else own.model_copy(update={"lr": lr}))
        expected = 1e-3 if lr is None else lr
        assert moved(policy, before) == pytest.approx(expected, rel=1e-2), lr
        assert policy.learner.optimizer_cfg.lr == 1e-3  # the policy's own rate is unchanged
