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
from marljax.models.testing import random_model  # noqa: E402
from marljax.sampler import Buckets, generate, get_engine  # noqa: E402

assert jax.device_count() == 8, jax.devices()


def main():
    cfg = ModelConfig.preset("tiny-qwen3", tie_word_embeddings=False)  # lm_head: vocab over tensor
    rng = np.random.RandomState(0)
    prompts = [rng.randint(3, 512, size=n).tolist() for n in (5, 2, 9, 12, 1)]
    kw = dict(max_new_tokens=12, eos_ids=[7])

    single = random_model(cfg, seed=1)
    g1 = generate(single, prompts, temperature=0.0, **kw)
    s1 = generate(single, prompts, temperature=1.0, top_p=0.9, n=2, seed=3, **kw)

    mesh = make_mesh(data=4, tensor=2)
    sharded = shard_model(random_model(cfg, seed=1), mesh)
    params = get_params(sharded)
    assert params["layers"]["wq"].sharding.spec == P(None, None, "tensor"), params["layers"]["wq"].sharding
    g2 = generate(sharded, prompts, temperature=0.0, **kw)  # mesh taken from the parameters
    s2 = generate(sharded, prompts, temperature=1.0, top_p=0.9, n=2, seed=3, **kw)
    engine = get_engine(cfg, mesh)
    assert engine.stats.prefill_calls == 2 and engine.batch_bucket(5) == 8
    # decode phases over growing cache windows on the mesh (the default uses them from 128 tokens)
    s3 = generate(
        sharded, prompts, temperature=1.0, top_p=0.9, n=2, seed=3, buckets=Buckets(kv_phases=3), **kw
    )

    # the cache really is split: batch over data, kv heads over tensor
    ids = np.zeros((8, 16), np.int32)
    mask = np.ones((8, 16), bool)
    cache, logits = engine.prefill(params, ids, mask, cache_len=32)
    assert cache.k.sharding.spec == P(None, "data", None, "tensor"), cache.k.sharding
    assert len(cache.k.sharding.device_set) == 8 and logits.sharding.spec[0] == "data"

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
