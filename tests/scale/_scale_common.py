"""Shared by the tests/scale subprocess scripts: a tiny policy config and deterministic samples."""

from __future__ import annotations

import numpy as np

TOL = 1e-5  # float32 parity of sharded / multi-process updates with the single-device one
MIN_CHANGE = 1e-3  # an update must move some parameter by much more than TOL


def policy_config(
    mesh: dict | None = None,
    sampler_mesh: dict | None = None,
    *,
    preset: str = "tiny-qwen3",
    micro_batch_size: int = 4,
    mini_batches: int = 2,
    lr: float = 3e-3,
    lora: dict | None = None,
):
    from marljax.train.config import PolicyConfig

    data = {
        "model": {"preset": preset, "seed": 3},
        "micro_batch_size": micro_batch_size,
        # eps well above float32 noise: Adam's g / sqrt(v) would amplify the sign of near-zero gradients
        "mini_batches": mini_batches,
        "optimizer": {"name": "adamw", "lr": lr, "eps": 1e-4, "weight_decay": 0.01},
        "mesh": mesh or {},
    }
    if sampler_mesh is not None:
        data["sampler_mesh"] = sampler_mesh
    if lora is not None:
        data["lora"] = lora
    return PolicyConfig.model_validate(data)


def samples(n: int, seed: int = 0, vocab: int = 300):
    """`n` training rows of mixed prompt / completion lengths with random advantages."""
    from marljax.workflows.types import Rows

    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(n):
        prompt = rng.integers(3, vocab, rng.integers(2, 9))
        completion = rng.integers(3, vocab, rng.integers(1, 12))
        logp = -rng.random(len(completion)).astype(np.float32) - 4.0
        drawn.append((prompt, completion, logp, float(rng.normal())))
    return Rows(*([d[k] for d in drawn] for k in range(3)), advantage=[d[3] for d in drawn], policy="p")


def host(tree):
    """numpy copy of a pytree of (possibly sharded) arrays."""
    import jax

    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def max_diff(a, b) -> float:
    import jax

    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )
