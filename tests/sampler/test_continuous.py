"""Continuous batching (`marljax.sampler.engine`): requests queue for a fixed number of slots,
a finished slot takes the next request at once, completions stream out as they end, shared
prompt prefixes are prefilled once, and no request's tokens depend on where it ran."""

from __future__ import annotations

import numpy as np
import pytest

from marljax.models import get_params
from marljax.sampler import SamplingParams, Schedule, generate, generate_stream, get_engine


def _prompts(seed, lengths):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, 512, size=n).tolist() for n in lengths]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tokens_do_not_depend_on_slots_queueing_or_chunks(qwen3, temperature):
    """20 requests of mixed prompt lengths and budgets: 2, 4 or 32 slots, chunks of 1 to 32
    steps, with or without prefix sharing, give each request the same tokens and ends (its
    key is its own) and the same log-probs."""
    model, config, _ = qwen3
    prompts = _prompts(0, (5, 2, 9, 12, 1, 7, 3, 16, 4, 8))
    budgets = [3, 17, 9, 1, 24, 6, 12, 2, 20, 11]
    sampling = [SamplingParams(b, temperature=temperature, top_p=0.9) for b in budgets]
    kw = dict(n=2, seed=7, eos_ids=[5, 9])
    ref = generate(model, prompts, sampling, **kw, schedule=Schedule(slots=32))
    assert (ref.lengths <= np.repeat(budgets, 2)).all() and len(set(ref.lengths.tolist())) > 5
    engine = get_engine(config)
    schedules = [
        Schedule(slots=2, chunk=5),
        Schedule(slots=4, chunk=1, idle_chunk=1, share_prefixes=False),
        Schedule(slots=4, chunk=32, refill_fraction=1.0, shrink=False),
    ]
    for schedule in schedules if temperature else schedules[:1]:  # greedy: the key-free path once
        out = generate(model, prompts, sampling, **kw, schedule=schedule)
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=str(schedule))
        np.testing.assert_array_equal(out.lengths, ref.lengths)
        np.testing.assert_array_equal(out.finish_reason, ref.finish_reason)
        np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
        # the cache is allocated for the slots, not for the 20 requests
        assert engine.stats.cache_bytes == engine.cache_bytes(schedule.slots, 16 + 32)
    c = config
    assert engine.cache_bytes(4, 48) == 2 * c.num_layers * 4 * c.num_kv_heads * c.head_dim * 48 * 4


def test_a_free_slot_takes_the_next_request_without_waiting(qwen3):
    """2 slots, one request of 40 tokens and four of 4: the short ones pass through the second
    slot while the long one decodes, stream out first, and the call takes exactly the long
    request's 39 decode steps (its first token comes from the prefill)."""
    model, config, _ = qwen3
    stats = get_engine(config).stats
    prompts = _prompts(1, (6, 3, 8, 5, 2))
    before = (stats.decode_steps, stats.slot_steps, stats.useful_tokens)
    sampling = [SamplingParams(b) for b in (40, 4, 4, 4, 4)]
    stream = generate_stream(
        model,
        prompts,
        sampling,
        seed=3,
        eos_ids=(),
        schedule=Schedule(slots=2, min_slots=1),
    )
    done = list(stream)
    assert [c.index for c in done] == [1, 2, 3, 4, 0]
    assert [len(c.tokens) for c in done] == [4, 4, 4, 4, 40]
    assert stats.decode_steps - before[0] == 39
    # 4 short requests x 3 steps beside the long one, then it alone in one slot (shrunk)
    assert stats.slot_steps - before[1] == 2 * 12 + (39 - 12)
    assert stats.useful_tokens - before[2] == 56
    # the same completions as one batch of 5 slots
    batch = generate(model, prompts, sampling, seed=3, eos_ids=())
    for c in done:
        np.testing.assert_array_equal(c.tokens, batch.tokens[c.index, : len(c.tokens)])


def test_without_shrinking_every_step_decodes_all_the_slots(qwen3):
    """shrink=False (the trainer's default on GPU and TPU): 5 requests on 16 slots keep all 16
    rows for each of the long request's 39 decode steps (one slot count, so one compiled shape,
    whatever a call's size), with the completions of the shrinking schedule (8 slots for 5
    requests, then fewer)."""
    model, config, _ = qwen3
    engine = get_engine(config)
    prompts = _prompts(1, (6, 3, 8, 5, 2))
    sampling = [SamplingParams(b) for b in (40, 4, 4, 4, 4)]
    fitted = generate(model, prompts, sampling, seed=3, eos_ids=(), schedule=Schedule(slots=16))
    assert engine.stats.cache_bytes == engine.cache_bytes(8, 16 + 64)  # 5 requests -> 8 slots
    before = (engine.stats.decode_steps, engine.stats.slot_steps)
    fixed = generate(model, prompts, sampling, seed=3, eos_ids=(), schedule=Schedule(slots=16, shrink=False))
    assert engine.stats.decode_steps - before[0] == 39
    assert engine.stats.slot_steps - before[1] == 16 * 39
    assert engine.stats.cache_bytes == engine.cache_bytes(16, 16 + 64)
    np.testing.assert_array_equal(fixed.tokens, fitted.tokens)
    np.testing.assert_array_equal(fixed.lengths, fitted.lengths)


@pytest.mark.parametrize("slots", [1, 8])
def test_shared_prefixes_are_prefilled_once_and_change_nothing(qwen3, slots):
    """Three prompts on one 40-token problem: the first prefills it, the others copy it from
    its slot (at the same time with 8 slots, after it finished with 1) and run only their own
    5 tokens; tokens and log-probs equal prefilling everything."""
    model, config, _ = qwen3
    stats = get_engine(config).stats
    problem = _prompts(2, (40,))[0]
    prompts = [problem + [3 + i] + _prompts(10 + i, (4,))[0] for i in range(3)]  # differ at token 40
    kw = dict(n=1, seed=5, eos_ids=(), return_sampling_logprobs=True)
    plain = generate(
        model, prompts, SamplingParams(12), **kw, schedule=Schedule(slots=slots, share_prefixes=False)
    )
    before = (stats.prefill_tokens, stats.shared_tokens)
    shared = generate(model, prompts, SamplingParams(12), **kw, schedule=Schedule(slots=slots))
    assert stats.shared_tokens - before[1] == 2 * 40
    assert stats.prefill_tokens - before[0] == 45 + 2 * 5
    np.testing.assert_array_equal(shared.tokens, plain.tokens)
    np.testing.assert_allclose(shared.logprobs, plain.logprobs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(shared.sampling_logprobs, plain.sampling_logprobs, atol=1e-5, rtol=0)


def test_a_prompt_continuing_an_earlier_answer_reuses_its_cache(qwen3):
    """With one slot, a request whose prompt is an earlier request's prompt + its answer (a
    refinement turn) copies every cached token of that answer but the last."""
    model, config, _ = qwen3
    params = get_params(model)
    stats = get_engine(config).stats
    first = _prompts(3, (20,))[0]
    greedy, kw = SamplingParams(10, temperature=0.0), dict(eos_ids=())
    answer = generate(model, [first], greedy, **kw).completions()[0]
    follow_up = first + answer + [7, 8, 9]
    before = stats.shared_tokens
    out = generate(config, [first, follow_up], greedy, params=params, **kw, schedule=Schedule(slots=1))
    assert stats.shared_tokens - before == 20 + 10 - 1  # the last answer token was never fed back
    alone = generate(model, [follow_up], greedy, **kw)
    np.testing.assert_array_equal(out.tokens[1], alone.tokens[0])
    np.testing.assert_allclose(out.logprobs[1], alone.logprobs[0], atol=1e-5, rtol=0)


def test_the_accelerator_cache_layout_gives_the_same_completions(qwen3):
    """The "bskh" cache (keys and values [B, S, K, H], attention through
    `jax.nn.dot_product_attention` with each row's cache length) run on CPU: queueing, slot
    refill and a shared prefix give the "split" layout's tokens, ends and log-probs."""
    from marljax.sampler import Request

    model, config, _ = qwen3
    params = get_params(model)
    prompts = _prompts(4, (5, 2, 9, 12, 1, 7)) + [_prompts(4, (9,))[0] + [11, 12]]  # the last shares 9
    budgets = [3, 11, 9, 1, 12, 6, 12]
    requests = [
        Request(np.asarray(p, np.int32), SamplingParams(b, top_p=0.9)) for p, b in zip(prompts, budgets)
    ]
    kw = dict(seed=3, eos=[5, 9], stop=[[7, 7]], schedule=Schedule(slots=4, chunk=4, shrink=False))
    runs = {}
    for layout in ("split", "bskh"):
        engine = get_engine(config, cache_layout=layout)
        assert engine.layout == layout
        runs[layout] = sorted(engine.run(params, requests, **kw), key=lambda c: c.index)
    assert len({len(c.tokens) for c in runs["split"]}) > 3  # ends at different steps
    for a, b in zip(runs["split"], runs["bskh"]):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
