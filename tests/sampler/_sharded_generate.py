"""Run by test_generate_sharded.py in a fresh process with 8 simulated CPU devices:
generation on a (data=4, tensor=2) mesh must equal single-device generation."""

from __future__ import annotations

import os
import sys

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from marljax.models import ModelConfig, get_params, make_mesh, shard_model  # noqa: E402
from marljax.sampler import Buckets, SamplingParams, Schedule, generate, get_engine  # noqa: E402
from marljax.testing import random_model  # noqa: E402

assert jax.device_count() == 8, jax.devices()


def main():
    cfg = ModelConfig.preset("tiny-qwen3", tie_word_embeddings=False)  # lm_head: vocab over tensor
    rng = np.random.RandomState(0)
    prompts = [rng.randint(3, 512, size=n).tolist() for n in (5, 2, 9, 12, 1)]
    kw = dict(eos_ids=[7])
    greedy, nucleus = SamplingParams(12, temperature=0.0), SamplingParams(12, top_p=0.9)

    single = random_model(cfg, seed=1)
    g1 = generate(single, prompts, greedy, **kw)
    s1 = generate(single, prompts, nucleus, n=2, seed=3, **kw)

    mesh = make_mesh(data=4, tensor=2)
    sharded = shard_model(random_model(cfg, seed=1), mesh)
    params = get_params(sharded)
    assert params["layers"]["wq"].sharding.spec == P(None, None, "tensor"), params["layers"]["wq"].sharding
    g2 = generate(sharded, prompts, greedy, **kw)  # mesh taken from the parameters
    s2 = generate(  # the second sample of each short prompt copies its prefill (a second call)
        sharded,
        prompts,
        nucleus,
        n=2,
        seed=3,
        schedule=Schedule(min_shared_prefix=1),
        **kw,
    )
    engine = get_engine(cfg, mesh)
    assert engine.stats.insert_calls == 3 and engine.batch_bucket(5) == 8  # greedy 1, sampled 2
    # growing cache windows, queued requests (4 slots for 10), refills and shrinking on the mesh
    s3 = generate(
        sharded,
        prompts,
        nucleus,
        n=2,
        seed=3,
        buckets=Buckets(min_window=16),
        schedule=Schedule(slots=4, chunk=3),
        **kw,
    )

    # the cache really is split: slots over data, kv heads over tensor
    state = engine.empty_state(8, 32, 4)
    assert state.kv[0].sharding.spec == P("data", "tensor"), state.kv[0].sharding
    assert len(state.kv[0].sharding.device_set) == 8 and state.pos.sharding.spec[0] == "data"

    for a, b in ((g1, g2), (s1, s2), (s1, s3)):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.lengths, b.lengths)
        np.testing.assert_array_equal(a.finish_reason, b.finish_reason)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert len({tuple(c) for c in g1.completions()}) == len(prompts)
    print("sharded generate data=4 tensor=2: OK")


if __name__ == "__main__":
    main()
    sys.exit(0)
