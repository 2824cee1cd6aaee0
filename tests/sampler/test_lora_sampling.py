"""Rows of different LoRA adapters of one base sampled in one call (`generate(..., adapter=)`)
give each row what sampling with its adapter alone gives: the same tokens, ends and log-probs;
a prompt shared by rows of two adapters is not served from the other adapter's cache."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from marljax.models import get_params
from marljax.models.lora import LoraSpec, init_adapter, stack_adapters
from marljax.sampler import SamplingParams, Schedule, generate


def _trained(config, spec, seed):
    ad = init_adapter(config, spec, jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 100), len(ad)))
    return {n: {"a": w["a"], "b": 0.3 * jax.random.normal(next(keys), w["b"].shape)} for n, w in ad.items()}


def test_many_adapters_in_one_call_equal_each_adapter_alone(qwen3):
    model, config, _ = qwen3
    base = get_params(model)
    # one shape for both adapters, so the calls with one adapter compile once (stacking adapters
    # of other ranks and targets is tested in tests/models/test_lora.py)
    specs = [LoraSpec(rank=4, alpha=8.0), LoraSpec(rank=4, alpha=2.0)]
    adapters = [(s, _trained(config, s, i)) for i, s in enumerate(specs)]
    rng = np.random.RandomState(0)
    shared = rng.randint(3, 500, 7).tolist()
    # prompts 0 and 1 are equal (rows of adapters 0 and 1): prefix sharing must keep them apart
    prompts = [shared, shared] + [rng.randint(3, 500, n).tolist() for n in (3, 9, 5, 12)]
    ids = [0, 1, 1, 0, 1, 0]
    temperature = [1.0, 1.0, 0.0, 1.0, 0.7, 0.0]  # per prompt; 0 = greedy rows among sampled ones
    sampling = [SamplingParams(10, temperature=t) for t in temperature]
    kw = dict(n=2, seed=5, schedule=Schedule(slots=4, chunk=4))
    together = generate(
        config, prompts, sampling, params={**base, "lora": stack_adapters(adapters)}, adapter=ids, **kw
    )
    changed = 0
    for a, ad in enumerate(adapters):
        # every prompt with adapter a alone: request indices (their sampling keys) match the mixed call's
        alone = generate(config, prompts, sampling, params={**base, "lora": stack_adapters([ad])}, **kw)
        rows = np.repeat(np.asarray(ids) == a, 2)
        np.testing.assert_array_equal(together.tokens[rows], alone.tokens[rows])
        np.testing.assert_array_equal(together.lengths[rows], alone.lengths[rows])
        np.testing.assert_allclose(together.logprobs[rows], alone.logprobs[rows], atol=2e-5, rtol=0)
        changed += int((together.tokens[~rows] != alone.tokens[~rows]).any())
    assert changed  # the adapters do sample differently, so the rows really used their own


def test_adapter_index_out_of_range_is_an_error(qwen3):
    model, config, _ = qwen3
    spec = LoraSpec(rank=2, alpha=2.0)
    params = {
        **get_params(model),
        "lora": stack_adapters([(spec, init_adapter(config, spec, jax.random.key(0)))]),
    }
    with pytest.raises(ValueError, match="adapter"):
        generate(config, [[3, 4, 5]], SamplingParams(2), params=params, adapter=[1])
