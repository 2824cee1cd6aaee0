"""Generation with continuous batching over KV-cache slots under `jit`: tokens and log-probs.

    from marljax.sampler import SamplingParams, generate, generate_text
    out = generate(model, [[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=64, top_p=0.9), n=4, seed=0)
    out.tokens, out.lengths, out.finish_reason, out.logprobs   # [B*n, 64], [B*n], ...

Knows nothing about RL: `logprobs` are under `softmax(logits / temperature)` without
top-k/top-p truncation, the distribution a trainer recomputes for the same tokens.
`marljax.sampler.sampling` holds the pure per-step token choice;
`marljax.sampler.engine` the slots, the compiled insert / decode steps and counters;
`marljax.sampler.schedule` the requests, the host loop that shares the slots, and the buckets.
The model maths (prefill, the one-token decode step, log-probs) lives in `marljax.models`.
"""

from marljax.sampler.api import SamplerOutput, TextOutput, generate, generate_stream, generate_text
from marljax.sampler.engine import Engine, EngineStats, get_engine
from marljax.sampler.sampling import argmax_first, sample_tokens, truncation_mask
from marljax.sampler.schedule import (
    REASONS,
    Buckets,
    Completion,
    Request,
    SamplingParams,
    Schedule,
    next_bucket,
)

__all__ = [
    "SamplerOutput",
    "TextOutput",
    "generate",
    "generate_stream",
    "generate_text",
    "REASONS",
    "Buckets",
    "Completion",
    "Engine",
    "EngineStats",
    "Request",
    "SamplingParams",
    "Schedule",
    "get_engine",
    "next_bucket",
    "argmax_first",
    "sample_tokens",
    "truncation_mask",
]
