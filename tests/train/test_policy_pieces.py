"""The pieces a policy is made of, alone: its checkpointed state, the learner's one path for
full-weight and adapter training, and the sampling settings that travel from the config to the
sampler."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax.models.config import ModelConfig
from marljax.models.decoder import get_params, init_model
from marljax.models.lora import LoraSpec, init_adapter, stack_adapters
from marljax.sampler import SamplingParams
from marljax.sampler.sampling import logprob_temperature
from marljax.train.config import OptimizerConfig, SamplerConfig, SamplingConfig
from marljax.train.learner import combine
from marljax.train.optim import make_optimizer
from marljax.train.state import PolicyState


def test_the_state_is_a_pytree_and_its_checkpoint_round_trips():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    opt_state = make_optimizer(OptimizerConfig()).init(params)
    state = PolicyState(params, opt_state, ref_params=None, version=4)
    leaves, tree = jax.tree.flatten(state)
    assert len(leaves) == 2 + len(jax.tree.leaves(opt_state))  # version is static, not a leaf
    assert jax.tree.unflatten(tree, leaves).version == 4 and state.step == 0
    tree = state.checkpoint()
    assert set(tree) == {"params", "opt_state", "step", "version"}  # no reference: no key
    assert tree["version"].dtype == np.int64 and int(tree["version"]) == 4
    back = PolicyState.from_checkpoint(tree)
    assert back.version == 4 and back.ref_params is None and back.params is params
    target = state.replace(ref_params=params).restore_target()
    assert isinstance(target["ref_params"]["w"], jax.ShapeDtypeStruct)
    assert target["ref_params"]["w"].sharding == params["w"].sharding
    assert target["version"].dtype == np.int64  # counters stay int64 host arrays (not eval_shape's int32)


def test_full_weight_and_adapter_training_are_one_combine():
    config = ModelConfig.preset("tiny-qwen3")
    base = get_params(init_model(config, seed=0))
    assert combine(base, None, lora=None) is base  # nothing frozen: the trainable part is the model
    spec = LoraSpec(rank=2, alpha=4.0)
    adapter = init_adapter(config, spec, jax.random.key(0))
    model = combine(adapter, base, lora=spec)
    assert {k: v for k, v in model.items() if k != "lora"} == base
    want = stack_adapters([(spec, adapter)])
    for x, y in zip(jax.tree.leaves(model["lora"]), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_an_agents_sampling_reaches_the_sampler_whole():
    run = SamplerConfig(max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=5, stop=("\n\n",))
    assert run.sampling() == SamplingParams(32, temperature=0.7, top_p=0.9, top_k=5, stop=("\n\n",))
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8).over(run).sampling()
    assert greedy == SamplingParams(8, temperature=0.0, top_p=0.9, top_k=5, stop=("\n\n",))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(4, top_p=1.5)


def test_greedy_rows_take_their_logprobs_at_temperature_one_on_host_and_device():
    assert logprob_temperature(0.0) == 1.0 and logprob_temperature(0.7) == 0.7
    rows = logprob_temperature(jnp.asarray([0.0, 0.7, 1.3], jnp.float32))
    np.testing.assert_array_equal(np.asarray(rows), np.asarray([1.0, 0.7, 1.3], np.float32))
