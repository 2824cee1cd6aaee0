"""The sampler's weights are a compute-dtype copy made once per parameter change (issue 40):
with float32 master weights and bfloat16 compute no decode step reads or casts float32 weights,
and the copy changes no token or log-prob against sampling from the master weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from marljax.sampler import generate
from marljax.train.config import PolicyConfig, SamplerConfig
from marljax.train.policy import BaseStore, Policy
from marljax.workflows.types import Rows

MODEL = {"preset": "tiny-qwen3", "seed": 3, "dtype": "bfloat16", "param_dtype": "float32"}
SAMPLED = SamplerConfig(max_new_tokens=6, temperature=1.0)
PROMPTS = [[5, 9, 11], [7, 8, 9, 10]]


def rows() -> Rows:
    rng = np.random.default_rng(0)
    return Rows(
        [rng.integers(3, 200, 6) for _ in range(4)],
        [rng.integers(3, 200, 5) for _ in range(4)],
        [np.full(5, -4.0, np.float32)] * 4,
        advantage=[1.0, -1.0, 0.5, -0.5],
        policy="p",
    )


def dtypes(tree) -> set:
    return {x.dtype for x in jax.tree.leaves(tree)}


def test_a_full_weight_policy_samples_from_one_bfloat16_copy_per_update():
    policy = Policy("p", PolicyConfig.model_validate({"model": MODEL, "micro_batch_size": 4}))
    assert dtypes(policy.params) == {jnp.dtype("float32")}
    view = policy.sampler
    copy = view.params()
    assert dtypes(copy) == {jnp.dtype("bfloat16")}
    assert view.params() is copy  # the calls between two updates share it

    ours = view.generate(PROMPTS, n=2, seed=7, sampler=SAMPLED)
    # sampling from the float32 masters, which the model maths casts where it uses them, in the
    # view's slot batch (another batch size can move a log-prob by its last bit)
    masters = generate(
        policy.config,
        PROMPTS,
        SAMPLED.sampling(),
        params=policy.params,
        n=2,
        seed=7,
        eos_ids=policy.turns.eos_ids,
        pad_id=policy.turns.pad_id,
        schedule=SAMPLED.schedule(jax.devices()[0].platform),
    )
    np.testing.assert_array_equal(ours.tokens, masters.tokens)
    np.testing.assert_array_equal(ours.logprobs, masters.logprobs)

    policy.update(rows())
    again = view.params()
    assert again is not copy and dtypes(again) == {jnp.dtype("bfloat16")}
    moved = max(
        float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
        for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(copy))
    )
    assert moved > 0  # the copy is of the updated parameters


def test_adapters_share_one_bfloat16_copy_of_their_base_and_keep_their_own_dtype():
    bases = BaseStore()
    lora = {"rank": 4, "alpha": 8, "targets": ["q", "v", "down"]}
    team = [
        Policy(f"a{i}", PolicyConfig.model_validate({"model": MODEL, "lora": lora}), bases=bases)
        for i in range(2)
    ]
    first, second = (p.sampler.base() for p in team)
    assert first is second and dtypes(first) == {jnp.dtype("bfloat16")}
    assert dtypes(team[0].learner.frozen) == {jnp.dtype("float32")}  # the trainer's base is untouched
    # an adapter is stacked (and scaled) in its own dtype, as the trainer's maths does
    assert dtypes(team[0].sampler.own()) == {jnp.dtype("float32")}


def test_no_copy_when_the_weights_are_stored_in_the_compute_dtype():
    model = {**MODEL, "param_dtype": "bfloat16"}
    policy = Policy("p", PolicyConfig.model_validate({"model": model}))
    assert policy.sampler.params() is policy.params
