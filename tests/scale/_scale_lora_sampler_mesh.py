"""Run by test_scale_lora_sampler_mesh.py with 8 simulated CPU devices: two adapter policies on one
base, trained FSDP-split over 4 devices and sampling data x tensor on the same devices. The base is
copied into the sampler's layout once, shared by both; the team's one-call samples equal those of
one device; an update of an adapter reaches the sampler."""

from __future__ import annotations

import os

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _scale_common import MIN_CHANGE, host, max_diff, samples  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marljax.models.lora import stack_adapters  # noqa: E402
from marljax.sampler import SamplingParams, generate  # noqa: E402
from marljax.train.config import PolicyConfig, SamplerConfig  # noqa: E402
from marljax.train.policy import BaseStore, Policy  # noqa: E402

PROMPTS = [[5, 9, 11, 40], [7, 8, 9], [100, 3, 4, 5, 6, 7], [12, 13]]
ADAPTER = [0, 1, 0, 1]


def config(seed: int) -> PolicyConfig:
    devices = [0, 1, 2, 3]
    return PolicyConfig.model_validate(
        {
            "model": {"preset": "tiny-qwen3", "seed": 3},
            "lora": {"rank": 4, "alpha": 8, "seed": seed},
            "micro_batch_size": 4,
            "optimizer": {"lr": 3e-3, "eps": 1e-4},
            "mesh": {"fsdp": 4, "devices": devices},
            "sampler_mesh": {"data": 2, "tensor": 2, "devices": devices},
        }
    )


def main():
    assert jax.device_count() == 8, jax.devices()
    bases = BaseStore()
    pols = [Policy(f"a{i}", config(i), bases=bases) for i in range(2)]
    for i, pol in enumerate(pols):  # non-zero updates, as after training, different per adapter
        pol.state = pol.state.replace(params=jax.tree.map(lambda x, i=i: x + 0.05 * (i + 1), pol.params))

    # one copy of the base in the sampler's layout, beside the trainer's, shared by the adapters
    base = pols[0].sampler.base()
    assert base is pols[1].sampler.base() and len(bases) == 1
    assert base["layers"]["wq"].sharding.spec == P(None, None, "tensor"), base["layers"]["wq"].sharding
    assert pols[0].learner.frozen["layers"]["wq"].sharding.spec != base["layers"]["wq"].sharding.spec
    assert max_diff(host(base), host(pols[0].learner.frozen)) == 0.0

    greedy = SamplerConfig(max_new_tokens=6, temperature=0.0)
    got = pols[0].sampler.generate(
        PROMPTS, n=1, seed=0, sampler=greedy, team=[p.sampler for p in pols], adapter=ADAPTER
    )
    one_device = jax.device_put(
        {
            **host(pols[0].learner.frozen),
            "lora": stack_adapters([(p.learner.lora, host(p.params)) for p in pols]),
        },
        jax.devices()[0],
    )
    want = generate(
        pols[0].config,
        PROMPTS,
        SamplingParams(6, temperature=0.0),
        params=one_device,
        eos_ids=pols[0].turns.eos_ids,
        pad_id=pols[0].turns.pad_id,
        adapter=ADAPTER,
    )
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5, rtol=0)
    # each row used its own adapter: adapter 1 alone gives its rows of the team call, and other
    # log-probs on adapter 0's prompts
    alone = pols[1].sampler.generate(PROMPTS, n=1, seed=0, sampler=greedy)
    for row in (1, 3):
        np.testing.assert_array_equal(alone.tokens[row], got.tokens[row])
        np.testing.assert_allclose(alone.logprobs[row], got.logprobs[row], atol=1e-5, rtol=0)
    for row in (0, 2):
        assert np.abs(alone.logprobs[row][:1] - got.logprobs[row][:1]).max() > 1e-3, "one adapter for both"

    # an update moves the adapter, and the sampler samples with the moved one
    before = host(pols[0].sampler.params()["lora"])
    metrics = pols[0].update(samples(8))
    assert metrics["skipped"] == 0 and np.isfinite(metrics["loss"]), metrics
    after = host(pols[0].sampler.params()["lora"])
    assert max_diff(before, after) > MIN_CHANGE
    assert max_diff(after, host(stack_adapters([(pols[0].learner.lora, pols[0].params)]))) == 0.0
    print("adapter policies sampling on their own mesh: OK")


if __name__ == "__main__":
    main()
