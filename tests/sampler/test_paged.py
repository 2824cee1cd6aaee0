"""The paged KV cache (`Engine(cache_layout="paged")`, `marljax.sampler.pages`): the dense
engine's tokens and log-probs whatever the page size, schedule or pool size; a shared prompt
prefix referenced by page, not copied; rows that do not fit the pool wait; pages in use follow
the rows' lengths."""

from __future__ import annotations

import numpy as np
import pytest

from marljax.sampler import SamplingParams, Schedule, generate, get_engine
from marljax.sampler.pages import PagePool


def _prompts(seed, lengths):
    rng = np.random.RandomState(seed)
    return [rng.randint(3, 512, size=n).tolist() for n in lengths]


def _same(out, ref, sampling_lp=False):
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.finish_reason, ref.finish_reason)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
    if sampling_lp:
        np.testing.assert_allclose(out.sampling_logprobs, ref.sampling_logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_completions_equal_the_dense_cache(qwen3, page_size, temperature):
    """Mixed prompt lengths and budgets, 3 samples of each prompt, two prompts on one 24-token
    problem (a prefix shared across prompts and with finished rows' caches), 4 slots with
    queueing and short chunks: the paged layout gives the dense ("split") layout's tokens, ends,
    log-probs and sampling log-probs, and its shared prefixes are referenced by page."""
    model, config, _ = qwen3
    problem = _prompts(5, (24,))[0]
    prompts = _prompts(0, (5, 2, 9, 12, 1, 7)) + [problem + [3, 4], problem + [5]]
    budgets = [3, 17, 9, 1, 24, 6, 12, 20]
    sampling = [SamplingParams(b, temperature=temperature, top_p=0.9) for b in budgets]
    kw = dict(n=3, seed=7, eos_ids=[5, 9], return_sampling_logprobs=True)
    schedule = Schedule(slots=4, chunk=5)
    ref = generate(model, prompts, sampling, **kw, schedule=schedule, cache_layout="split")
    assert len(set(ref.lengths.tolist())) > 5
    engine = get_engine(config, cache_layout="paged", page_size=page_size)
    before = engine.stats.shared_pages
    out = generate(
        model, prompts, sampling, **kw, schedule=schedule, cache_layout="paged", page_size=page_size
    )
    _same(out, ref, sampling_lp=True)
    assert engine.stats.pool_pages == 4 * -(-(32 + 32) // page_size)  # default: slots x capacity
    if page_size < 24:
        assert engine.stats.shared_pages > before


@pytest.mark.parametrize("page_size", [1, 4])
def test_paged_tokens_do_not_depend_on_slots_queueing_or_chunks(qwen3, page_size):
    """As `test_continuous`'s check for the dense cache: 2 or 4 slots, chunks of 1 or 5 steps,
    with or without prefix sharing, with the tail's compaction: each request's tokens and
    log-probs are those of the dense cache with 32 slots."""
    model, _, _ = qwen3
    prompts = _prompts(0, (5, 2, 9, 12, 1, 7, 3, 16, 4, 8))
    budgets = [3, 17, 9, 1, 24, 6, 12, 2, 20, 11]
    sampling = [SamplingParams(b, temperature=1.0, top_p=0.9) for b in budgets]
    kw = dict(n=2, seed=7, eos_ids=[5, 9])
    ref = generate(model, prompts, sampling, **kw, schedule=Schedule(slots=32), cache_layout="split")
    for schedule in (
        Schedule(slots=2, chunk=5),
        Schedule(slots=4, chunk=1, idle_chunk=1, share_prefixes=False),
    ):
        out = generate(
            model, prompts, sampling, **kw, schedule=schedule, cache_layout="paged", page_size=page_size
        )
        _same(out, ref)


def test_shared_prefix_pages_are_referenced_not_copied(qwen3):
    """4 samples of one 40-token prompt, pages of 4, 2 new tokens each: the first sample
    prefills the prompt (10 pages); the other three reference its first 9 pages (the 36
    positions before the one they run themselves) and copy only the 10th (the page their
    own position 39 is written to); each row then takes one page for position 40. Pages in use:
    10 + 3 x 1 + 4 x 1 = 17 (a copied prefix would take 4 x 11 = 44)."""
    model, config, _ = qwen3
    prompt = _prompts(2, (40,))[0]
    kw = dict(n=4, seed=5, eos_ids=(), return_sampling_logprobs=True)
    ref = generate(model, [prompt], SamplingParams(2), **kw, cache_layout="split")
    engine = get_engine(config, cache_layout="paged", page_size=4)
    before = (engine.stats.shared_pages, engine.stats.cow_pages, engine.stats.shared_tokens)
    out = generate(model, [prompt], SamplingParams(2), **kw, cache_layout="paged", page_size=4)
    _same(out, ref, sampling_lp=True)
    assert engine.stats.shared_tokens - before[2] == 3 * 39
    assert engine.stats.shared_pages - before[0] == 3 * 9
    assert engine.stats.cow_pages - before[1] == 3
    assert engine.stats.peak_pages == 17


def test_a_pool_too_small_for_every_row_makes_rows_wait(qwen3):
    """A pool of 12 pages of 4 (48 positions; the largest request needs 10 pages) for 4 slots
    and 20 requests: requests wait for pages instead of failing, every one completes with the
    dense cache's tokens, and no more than 12 pages are ever in use. A request larger than the
    whole pool is refused up front."""
    model, config, _ = qwen3
    prompts = _prompts(0, (5, 2, 9, 12, 1, 7, 3, 16, 4, 8))
    budgets = [3, 17, 9, 1, 24, 6, 12, 2, 20, 11]
    sampling = [SamplingParams(b, temperature=1.0, top_p=0.9) for b in budgets]
    kw = dict(n=2, seed=7, eos_ids=(), schedule=Schedule(slots=4, chunk=4))
    ref = generate(model, prompts, sampling, **kw, cache_layout="split")
    engine = get_engine(config, cache_layout="paged", page_size=4, num_pages=12)
    before = engine.stats.page_waits
    out = generate(model, prompts, sampling, **kw, cache_layout="paged", page_size=4, num_pages=12)
    _same(out, ref)
    assert (out.lengths == np.repeat(budgets, 2)).all()
    assert engine.stats.page_waits > before
    assert engine.stats.pool_pages == 12 and engine.stats.peak_pages <= 12
    assert engine.cache_bytes(4, 48) == 12 * engine.page_bytes()
    by_budget = get_engine(
        config, cache_layout="paged", page_size=4, cache_budget=12 * engine.page_bytes() + 5
    )
    assert by_budget.num_pages == 12  # a memory budget in bytes: the whole pages it holds
    with pytest.raises(ValueError, match="cannot hold one request"):
        generate(
            model, prompts[:1], SamplingParams(60), **kw, cache_layout="paged", page_size=4, num_pages=12
        )


def test_pages_in_use_follow_the_rows_lengths(qwen3):
    """4 rows of 3 prompt tokens with budgets 2, 5, 30 and 3, pages of 4, 4 steps per decode
    call, no prefix cache: pages are taken as the rows grow (4 steps ahead) and given back
    when a row ends. While the short rows live the rows hold 1 + 2 + 2 + 2 = 7 pages (each
    its positions up to 4 steps ahead, at most prompt + budget - 1); then the long row alone
    grows to (3 + 30 - 1) / 4 = 8 pages. The dense cache holds 4 slots x 48 positions (48
    pages' worth) throughout."""
    model, config, _ = qwen3
    prompts = _prompts(7, (3, 3, 3, 3))
    sampling = [SamplingParams(b, temperature=0.0) for b in (2, 5, 30, 3)]
    schedule = Schedule(slots=4, chunk=4, idle_chunk=4, shrink=False, share_prefixes=False)
    kw = dict(seed=1, eos_ids=(), schedule=schedule)
    ref = generate(model, prompts, sampling, **kw, cache_layout="split")
    engine = get_engine(config, cache_layout="paged", page_size=4)
    out = generate(model, prompts, sampling, **kw, cache_layout="paged", page_size=4)
    _same(out, ref)
    assert engine.stats.pool_pages == 4 * 12
    assert engine.stats.peak_pages == 8


def test_page_pool_bookkeeping():
    """`PagePool` alone: references, copy-free sharing, eviction of idle caches (least recently
    finished first) and reservations."""
    pool = PagePool(num_pages=6, page_size=2, slots=3, max_pages=4)
    pool.grow(0, 5)  # 3 pages
    assert pool.count[0] == 3 and pool.in_use == 3 and list(pool.table[0, :3]) == [0, 1, 2]
    pool.worst[0] = 4
    assert pool.outstanding() == 1
    pool.ref[pool.table[0, :2]] += 1  # slot 1 references slot 0's first two pages
    pool.table[1, :2], pool.count[1] = pool.table[0, :2], 2
    pool.finish(0)
    pool.finish(1)
    none = np.zeros(6, bool)
    # slot 0's last page is only its own; the first two are held by both idle slots
    assert pool.reclaimable(none) == 3 and pool.available(none) == 3 + 3
    pool.release(0)
    assert pool.in_use == 2 and pool.ref[0] == pool.ref[1] == 1
    pool.grow(2, 8)  # 4 pages: the 4 free ones
    assert pool.in_use == 6 and not pool.evicted
    pool.release(2)
    pool.grow(2, 8)  # 4 pages again: still enough free
    pool.finish(2)
    pool.alloc(2)  # none free: the least recently finished idle slot (1) is evicted first
    assert pool.evicted == [1] and pool.count[1] == 0


def test_paged_rows_of_different_adapters_equal_the_dense_cache(qwen3):
    """Rows of two LoRA adapters in one call, two of them on one prompt (its pages must not be
    shared across adapters) and n=2 samples each (shared within an adapter): the paged layout
    gives the dense layout's tokens and log-probs."""
    import jax

    from marljax.models import get_params
    from marljax.models.lora import LoraSpec, init_adapter, stack_adapters

    model, config, _ = qwen3
    spec = LoraSpec(rank=4, alpha=8.0)
    adapters = []
    for i in range(2):
        ad = init_adapter(config, spec, jax.random.key(i))
        keys = iter(jax.random.split(jax.random.key(i + 100), len(ad)))
        adapters.append(
            (
                spec,
                {
                    n: {"a": w["a"], "b": 0.3 * jax.random.normal(next(keys), w["b"].shape)}
                    for n, w in ad.items()
                },
            )
        )
    params = {**get_params(model), "lora": stack_adapters(adapters)}
    shared = _prompts(11, (21,))[0]
    prompts = [shared, shared] + _prompts(12, (3, 9))
    kw = dict(n=2, seed=5, params=params, adapter=[0, 1, 1, 0], schedule=Schedule(slots=4, chunk=4))
    sampling = SamplingParams(8, temperature=1.0)
    ref = generate(config, prompts, sampling, **kw, cache_layout="split")
    engine = get_engine(config, cache_layout="paged", page_size=4)
    before = engine.stats.shared_pages
    out = generate(config, prompts, sampling, **kw, cache_layout="paged", page_size=4)
    _same(out, ref)
    assert engine.stats.shared_pages > before
