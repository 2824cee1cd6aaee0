"""The pure per-step token choice: truncation sets equal transformers' warpers, sampled
frequencies match the truncated renormalised distribution (chi-square), determinism."""

from __future__ import annotations

import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marljax.kernels import logprobs_from_logits
from marljax.sampler.sampling import sample_tokens, truncation_mask

# (method, bound): the top-k fast path, the same with a bound so small that the exact
# bisection fallback is taken, bisection only, and the full-sort reference
PATHS = [("auto", 64), ("auto", 2), ("bisect", 64), ("sort", 64)]

# jitted once per shape and path; sampling parameters are traced arguments
_mask_jit = jax.jit(truncation_mask, static_argnames=("bound", "method"))
_sample_jit = jax.jit(sample_tokens, static_argnames=("greedy", "truncate", "bound", "method"))


def _mask(logits, temperature=1.0, top_k=0, top_p=1.0, **static):
    return _mask_jit(
        jnp.asarray(logits),
        temperature=jnp.float32(temperature),
        top_k=jnp.int32(top_k),
        top_p=jnp.float32(top_p),
        **static,
    )[1]


def _sample(logits, keys, temperature=1.0, top_k=0, top_p=1.0, **static):
    return _sample_jit(
        jnp.asarray(logits),
        keys,
        temperature=jnp.asarray(temperature, jnp.float32),
        top_k=jnp.int32(top_k),
        top_p=jnp.float32(top_p),
        **static,
    )


def _hf_keep(logits, temperature, top_k, top_p):
    import torch
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    s = TemperatureLogitsWarper(temperature)(None, torch.tensor(logits))
    if top_k:
        s = TopKLogitsWarper(top_k)(None, s)
    if top_p < 1:
        s = TopPLogitsWarper(top_p)(None, s)
    return np.isfinite(s.numpy())


@pytest.mark.parametrize("method,bound", PATHS)
def test_truncation_equals_transformers_warpers(method, bound):
    rng = np.random.default_rng(0)
    checked = 0
    for V in (7, 64, 300):
        for temperature, top_k, top_p in [
            (1.0, 0, 0.9),
            (0.7, 5, 1.0),
            (1.3, 20, 0.8),
            (0.5, 0, 0.3),
            (2.0, 200, 0.99),
            (1.0, 1, 0.9),
            (1.0, 400, 0.5),
        ]:
            scale = rng.uniform(0.5, 4.0)
            logits = (rng.standard_normal((8, V)) * scale).astype(np.float32)  # no ties
            want = _hf_keep(logits, temperature, top_k, top_p)
            keep = _mask(logits, temperature, top_k, top_p, bound=bound, method=method)
            np.testing.assert_array_equal(
                np.asarray(keep), want, err_msg=f"V={V} T={temperature} k={top_k} p={top_p}"
            )
            checked += int(want.sum() < want.size)
    assert checked >= 15  # the filters really removed tokens in most cases


def _reference_keep(x, top_k, top_p):
    """Documented semantics with ties: top-k keeps ties of the k-th value; top-p keeps
    token i iff the renormalised mass of tokens strictly more likely is < top_p."""
    V = x.shape[-1]
    keep = np.ones_like(x, bool)
    for b, r in enumerate(x):
        if 0 < top_k < V:
            keep[b] &= r >= np.sort(r)[::-1][top_k - 1]
        if top_p < 1:
            p = np.where(keep[b], np.exp(r - r.max()), 0.0)
            p /= p.sum()
            above = np.array([p[r > r[i]].sum() for i in range(V)])
            keep[b] &= above < top_p
    return keep


@pytest.mark.parametrize("method,bound", PATHS)
def test_ties_are_kept_whole(method, bound):
    rng = np.random.default_rng(1)
    for V, top_k, top_p in [(50, 3, 1.0), (50, 0, 0.5), (300, 20, 0.9), (300, 400, 0.99)]:
        logits = np.round(rng.standard_normal((8, V)) * 2).astype(np.float32)  # many ties
        keep = _mask(logits, 1.0, top_k, top_p, bound=bound, method=method)
        np.testing.assert_array_equal(np.asarray(keep), _reference_keep(logits, top_k, top_p))


def _chi2_sf(x: float, df: int) -> float:
    """Exact chi-square survival function for integer df (closed forms of the
    regularised upper incomplete gamma function Q(df/2, x/2))."""
    h = x / 2.0
    if df % 2 == 0:
        return math.exp(-h) * sum(h**i / math.factorial(i) for i in range(df // 2))
    return math.erfc(math.sqrt(h)) + math.exp(-h) * sum(
        h ** (i - 0.5) / math.gamma(i + 0.5) for i in range(1, (df - 1) // 2 + 1)
    )


def _chi2_critical(df: int, alpha: float) -> float:
    """Upper-alpha chi-square quantile: bisection on the exact survival function,
    started from the Wilson-Hilferty approximation's bracket."""
    z = statistics.NormalDist().inv_cdf(1 - alpha)
    a = 2.0 / (9.0 * df)
    lo, hi = 0.0, 2 * df * (1 - a + z * math.sqrt(a)) ** 3 + 10
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _chi2_sf(mid, df) > alpha else (lo, mid)
    return (lo + hi) / 2


LOGITS = np.array(
    [2.0, 1.7, 1.5, 1.2, 1.0, 0.8, 0.5, 0.3, 0.0, -0.3, -0.7, -1.0, -1.5, -2.0, -3.0, -4.0], np.float32
)
ALPHA = 1e-4  # per test; 4 settings x 2 paths -> family-wise false-alarm rate <= 8e-4
DRAWS = 20_000


@pytest.mark.parametrize("method,bound", [("auto", 64), ("auto", 2)])
@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(0.8, 5, 1.0), (1.2, 0, 0.8), (1.0, 6, 0.7), (1.0, 0, 1.0)]
)
def test_sample_frequencies_match_truncated_distribution(temperature, top_k, top_p, method, bound):
    """Chi-square goodness of fit of DRAWS samples against softmax(x) restricted to the
    kept set and renormalised, at false-alarm rate ALPHA (critical value by
    the exact chi-square tail for integer df, no scipy needed; cross-checked against
    scipy when installed). Tokens outside
    the kept set must never appear (exact check)."""
    x = LOGITS / temperature
    keep = _reference_keep(x[None], top_k, top_p)[0]
    p = np.where(keep, np.exp(x - x.max()), 0.0)
    p /= p.sum()
    assert 2 <= keep.sum() < len(LOGITS) or (top_k == 0 and top_p == 1.0)

    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (DRAWS, len(LOGITS)))
    keys = jax.random.split(jax.random.key(1234), DRAWS)
    tok, slp = _sample(logits, keys, temperature, top_k, top_p, bound=bound, method=method)
    tok, slp = np.asarray(tok), np.asarray(slp)
    counts = np.bincount(tok, minlength=len(LOGITS))
    assert counts[~keep].sum() == 0, f"tokens outside the kept set drawn: {np.nonzero(counts * ~keep)}"

    expected = DRAWS * p[keep]
    assert expected.min() >= 5  # the chi-square approximation is valid
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    crit = _chi2_critical(df, ALPHA)
    try:
        from scipy.stats import chi2

        assert abs(crit - chi2.ppf(1 - ALPHA, df)) / chi2.ppf(1 - ALPHA, df) < 1e-6
    except ImportError:
        pass
    assert stat < crit, f"chi2 = {stat:.1f} >= {crit:.1f} (df={df})"
    # the sampling log-prob is log of the renormalised truncated probability
    np.testing.assert_allclose(slp, np.log(p[tok]), atol=1e-5, rtol=0)


def test_greedy_and_zero_temperature_rows_take_the_argmax():
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.standard_normal((6, 40)).astype(np.float32))
    keys = jax.random.split(jax.random.key(0), 6)
    tok, slp = _sample(logits, keys, greedy=True)
    np.testing.assert_array_equal(tok, np.argmax(logits, axis=1))
    np.testing.assert_array_equal(slp, 0.0)
    temps = jnp.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    tok2, slp2 = _sample(logits, keys, temps, top_p=0.9)
    np.testing.assert_array_equal(np.asarray(tok2)[::2], np.argmax(logits, axis=1)[::2])
    assert np.all(np.asarray(slp2)[::2] == 0) and np.all(np.asarray(slp2)[1::2] < 0)
    lp = logprobs_from_logits(logits, tok2)  # the decode loop's raw log-probs of the chosen tokens
    np.testing.assert_allclose(lp, jax.nn.log_softmax(logits)[jnp.arange(6), tok2], atol=1e-6)


def test_each_row_depends_only_on_its_logits_and_key():
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.standard_normal((16, 100)).astype(np.float32) * 2)
    keys = jax.random.split(jax.random.key(7), 16)
    kw = dict(temperature=0.9, top_p=0.95, top_k=50)
    tok, _ = _sample(logits, keys, **kw)
    tok_again, _ = _sample(logits, keys, **kw)
    np.testing.assert_array_equal(tok, tok_again)
    for r in (0, 5, 15):  # one row alone, and the same row next to a row that needs the fallback
        alone, _ = _sample(logits[r : r + 1], keys[r : r + 1], **kw)
        assert int(alone[0]) == int(tok[r])
        flat = jnp.stack([logits[r], jnp.zeros(100)])  # flat row: nucleus larger than the bound
        pair, _ = _sample(flat, jnp.stack([keys[r], keys[0]]), bound=4, **kw)
        assert int(pair[0]) == int(tok[r])
    other, _ = _sample(logits, jax.random.split(jax.random.key(8), 16), **kw)
    assert (np.asarray(other) != np.asarray(tok)).sum() >= 4


def test_sampling_parameters_are_traced_not_static():
    traces = []

    @jax.jit
    def draw(logits, keys, t, k, p):
        traces.append(1)
        return sample_tokens(logits, keys, temperature=t, top_k=k, top_p=p)[0]

    logits = jnp.zeros((4, 32))
    keys = jax.random.split(jax.random.key(0), 4)
    for t, k, p in [(1.0, 0, 1.0), (0.5, 3, 0.9), (2.0, 31, 0.2)]:
        draw(logits, keys, jnp.float32(t), jnp.int32(k), jnp.float32(p))
    assert len(traces) == 1


def test_without_truncation_the_same_tokens_and_logprobs_as_through_it():
    """`truncate=False` (no row has top-k or top-p on, so the engine compiles no truncation search)
    draws what the full path draws with both filters off: the search keeps every token there."""
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.standard_normal((32, 300)).astype(np.float32) * 3)
    keys = jax.random.split(jax.random.key(11), 32)
    temps = jnp.asarray(np.r_[np.zeros(4), np.linspace(0.3, 1.5, 28)].astype(np.float32))
    for bound in (64, 2):  # the list, and a list so short that the bisection fallback runs
        tok, slp = _sample(logits, keys, temps, bound=bound)
        tok_plain, slp_plain = _sample(logits, keys, temps, truncate=False, bound=bound)
        np.testing.assert_array_equal(tok_plain, tok)
        np.testing.assert_allclose(slp_plain, slp, atol=2e-6)  # other fusions: float32 rounding
    # and the draws follow softmax(logits / T): the chosen tokens' log-probs are the rows' own
    expected = jax.nn.log_softmax(logits[4:] / temps[4:, None])[jnp.arange(28), tok[4:]]
    np.testing.assert_allclose(slp[4:], expected, atol=1e-5)
