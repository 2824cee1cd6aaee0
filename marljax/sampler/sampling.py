"""Per-step token choice: greedy, temperature, top-k, top-p -- pure functions of logits and keys.

Semantics are those of transformers' `generate(do_sample=True)` warpers, in
their order:

1. temperature: `x = logits / temperature`;
2. top-k (`top_k > 0`): keep every token whose scaled logit is >= the k-th
   largest one (tokens tied with the k-th are all kept, as transformers does);
3. top-p (`top_p < 1`): on the distribution renormalised over the tokens kept
   by top-k, keep token i iff the mass of the tokens strictly more likely than
   i is < `top_p` -- the smallest set of most likely tokens whose mass is
   >= `top_p`, always at least the most likely token. (transformers removes a
   token when the ascending cumulative mass up to and including it is
   <= 1 - top_p, which is the same set; a tie straddling the boundary is kept
   whole here rather than split by sort order.)

`temperature == 0` means greedy (argmax, first index on ties, like `torch.argmax`).

How truncation avoids sorting the vocabulary (both ways are exact, not approximate):

- fast path: `lax.top_k(x, bound)` (partial selection, O(V log bound)) gives the
  `bound` largest logits in order. The k-th value is read off when
  `top_k <= bound`; the nucleus cut is found from the cumulative mass of that
  list, which is decisive as soon as the list's mass reaches `top_p` (the first
  token left out is then inside the list). Normalisation uses a logsumexp over
  the whole vocabulary, so the masses are the true ones.
- fallback, taken for the whole batch through `lax.cond` only when some row is
  not decided by the list (`top_k > bound`, or a flat distribution whose nucleus
  is larger than `bound`): a threshold search. Logits are mapped to uint32 keys
  with the same order (IEEE-754 sign/magnitude trick) and each row's k-th value
  and nucleus cut are found by bisection over the keys: 32 passes of
  count/mass-above-threshold over [B, V] each, no sort.

The token is then drawn by inverse CDF in vocabulary order: one uniform per
row, `token = #{i : cdf_i <= u * cdf_V}` over the kept, unnormalised
probabilities. No sort and one random number per row and step, and the result
depends only on that row's logits and key (not on the rest of the batch or on
which path was taken). Masses are float32: "exact" means up to float32
rounding of cumulative sums, as in every implementation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

DEFAULT_BOUND = 64
METHODS = ("auto", "bisect", "sort")
_BISECT_STEPS = 32  # uint32 keys: 32 halvings pin one value


def _ordered_keys(x: jax.Array) -> jax.Array:
    """uint32 keys with the order of the float32 values `x` (-0.0 folded into +0.0)."""
    x = jnp.where(x == 0, jnp.zeros_like(x), x)
    b = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    neg = (b >> 31) == 1
    return jnp.where(neg, ~b, b | jnp.uint32(0x80000000))


def _largest_true(pred, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Per row, the largest uint32 `c` in [lo, hi] with `pred(c)` True, for `pred`
    monotone (True ... True False ... False) and `pred(lo)` True. lo, hi: [B]."""

    def body(_, lh):
        lo, hi = lh
        d = hi - lo
        mid = lo + d // 2 + (d & 1)  # ceil midpoint without overflow
        ok = pred(mid) & (lo < hi)
        return jnp.where(ok, mid, lo), jnp.where(ok | (lo >= hi), hi, mid - 1)

    lo, _ = lax.fori_loop(0, _BISECT_STEPS, body, (lo, hi))
    return lo


def _cuts_from_list(vals, lse, top_k, top_p, k_active, p_active):
    """Cut values (kept iff x >= cut) from the `K` largest scaled logits `vals` [B, K]
    (descending). Returns (cut [B], decided [B] bool)."""
    B, K = vals.shape
    neg_inf = jnp.float32(-jnp.inf)
    kth = jnp.take_along_axis(vals, jnp.clip(top_k - 1, 0, K - 1)[:, None], axis=1)[:, 0]
    kth = jnp.where(k_active, kth, neg_inf)
    v = jnp.where(vals >= kth[:, None], vals, neg_inf)
    probs = jnp.exp(v - lse[:, None])
    incl = jnp.cumsum(probs, axis=1)
    excl = jnp.concatenate([jnp.zeros((B, 1), probs.dtype), incl[:, :-1]], axis=1)
    cut_p = jnp.min(jnp.where(excl < top_p[:, None], v, v[:, :1]), axis=1)
    cut = jnp.where(p_active, jnp.maximum(cut_p, kth), kth)
    decided = (~k_active | (top_k <= K)) & (~p_active | (incl[:, -1] >= top_p))
    return cut, decided


def _cuts_by_bisection(x, top_k, top_p, k_active, p_active):
    """Cut values from threshold searches over the whole row (no sort). x: [B, V]."""
    keys = _ordered_keys(x)
    kmin, kmax = keys.min(axis=1), keys.max(axis=1)
    # top-k: the k-th largest value = the largest key c with #{keys >= c} >= k
    kk = jnp.where(k_active, top_k, 1)
    kth_key = _largest_true(lambda c: (keys >= c[:, None]).sum(axis=1) >= kk, kmin, kmax)
    kth_key = jnp.where(k_active, kth_key, kmin)
    kept = keys >= kth_key[:, None]
    xk = jnp.where(kept, x, -jnp.inf)
    probs = jnp.exp(xk - jax.nn.logsumexp(xk, axis=1, keepdims=True))
    # top-p: c_ = the largest key with mass(keys > c_) >= p; cut = smallest kept key > c_
    lo = kth_key - 1  # mass above it = the whole kept mass; treated as >= p

    def enough(c):
        return (jnp.where(keys > c[:, None], probs, 0.0).sum(axis=1) >= top_p) | (c == lo)

    c_ = _largest_true(enough, lo, kmax)
    cut_key = jnp.min(jnp.where(kept & (keys > c_[:, None]), keys, kmax[:, None]), axis=1)
    cut_key = jnp.where(p_active, cut_key, kth_key)
    # back to a value: the row's value at that key (every cut key is a present key)
    cut = jnp.max(jnp.where(keys == cut_key[:, None], x, -jnp.inf), axis=1)
    return cut


def argmax_first(x: jax.Array) -> jax.Array:
    """`argmax` over the last axis, first index on ties (as `jnp.argmax` / `torch.argmax`),
    as two plain reductions: much faster than XLA CPU's variadic argmax reduction."""
    V = x.shape[-1]
    m = jnp.max(x, axis=-1, keepdims=True)
    iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.minimum(jnp.min(jnp.where(x == m, iota, V), axis=-1), V - 1).astype(jnp.int32)


def _as_rows(a, B, dtype):
    a = jnp.asarray(a, dtype)
    return jnp.broadcast_to(a, (B,)) if a.ndim == 0 else a


def logprob_temperature(temperature):
    """The temperature a row's log-probs are taken at: its sampling temperature, and 1 for a greedy
    row (temperature 0), whose log-probs are then the model's own. `temperature`: a host number,
    or a `[B]` array (traced values are fine)."""
    if isinstance(temperature, (int, float)):
        return float(temperature) if temperature > 0 else 1.0
    return jnp.where(temperature > 0, temperature, 1.0)


def scaled(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """`logits [B, V]` divided by each row's `logprob_temperature`."""
    return logits / logprob_temperature(temperature)[:, None]


def truncation_mask(
    logits: jax.Array,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    bound: int = DEFAULT_BOUND,
    method: str = "auto",
):
    """Scaled logits and the kept-token mask after temperature, top-k and top-p.

    logits: `[B, V]` float. temperature, top_k, top_p: scalars or `[B]`
    (traced values are fine; `top_k <= 0` or `>= V` and `top_p >= 1` disable
    that filter; rows with temperature 0 are scaled by 1). bound, method:
    static; `method` is "auto" (top-k list of `bound`, exact bisection
    fallback), "bisect" (threshold search only) or "sort" (`lax.top_k` over the
    whole vocabulary, a full sort: the reference).
    Returns `(x [B, V] float32, keep [B, V] bool)`.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    logits = jnp.asarray(logits, jnp.float32)
    B, V = logits.shape
    temperature = _as_rows(temperature, B, jnp.float32)
    top_k = _as_rows(top_k, B, jnp.int32)
    top_p = _as_rows(top_p, B, jnp.float32)
    x = scaled(logits, temperature)
    k_active = (top_k > 0) & (top_k < V)
    p_active = top_p < 1.0

    def by_list(K):
        vals, _ = lax.top_k(x, K)
        kth = jnp.take_along_axis(vals, jnp.clip(top_k - 1, 0, K - 1)[:, None], axis=1)
        xk = jnp.where(k_active[:, None] & (x < kth), -jnp.inf, x)
        return _cuts_from_list(vals, jax.nn.logsumexp(xk, axis=1), top_k, top_p, k_active, p_active)

    if method == "sort":
        cut, _ = by_list(V)
    elif method == "bisect":
        cut = _cuts_by_bisection(x, top_k, top_p, k_active, p_active)
    else:
        cut, decided = by_list(min(int(bound), V))
        cut = lax.cond(
            jnp.all(decided), lambda: cut, lambda: _cuts_by_bisection(x, top_k, top_p, k_active, p_active)
        )
    return x, x >= cut[:, None]


def sample_tokens(
    logits: jax.Array,
    keys: jax.Array,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    greedy: bool = False,
    truncate: bool = True,
    bound: int = DEFAULT_BOUND,
    method: str = "auto",
):
    """One token per row and its log-prob under the sampling (truncated) distribution.

    logits: `[B, V]`; keys: `[B]` PRNG keys (new-style) or `[B, 2]` uint32 raw keys;
    temperature/top_k/top_p: scalars or `[B]` (see `truncation_mask`); rows with
    temperature 0 take the argmax. greedy (static): argmax for every row, keys unused.
    truncate (static): False when no row has top-k or top-p on, which skips the truncation
    search (the same tokens; a smaller program to compile and run).
    Returns `(tokens [B] int32, sampling_logprobs [B] float32)`; the sampling
    log-prob of an argmax choice is 0 (a point mass).
    """
    logits = jnp.asarray(logits, jnp.float32)
    B, V = logits.shape
    argmax = argmax_first(logits)
    if greedy:
        return argmax, jnp.zeros((B,), jnp.float32)
    temperature = _as_rows(temperature, B, jnp.float32)
    if truncate:
        x, keep = truncation_mask(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, bound=bound, method=method
        )
    else:
        x = scaled(logits, temperature)
        keep = jnp.ones_like(x, bool)
    m = jnp.max(x, axis=1, keepdims=True)
    w = jnp.where(keep, jnp.exp(x - m), 0.0)
    cdf = jnp.cumsum(w, axis=1)
    total = cdf[:, -1]
    u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    tok = jnp.sum(cdf <= (u * total)[:, None], axis=1).astype(jnp.int32)
    tok = jnp.minimum(tok, V - 1)
    x_tok = jnp.take_along_axis(x, tok[:, None], axis=1)[:, 0]
    slp = x_tok - m[:, 0] - jnp.log(total)
    sampled = temperature > 0
    return (jnp.where(sampled, tok, argmax), jnp.where(sampled, slp, 0.0).astype(jnp.float32))
