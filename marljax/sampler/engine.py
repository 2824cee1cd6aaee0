"""The compiled core: a prefill over a padded prompt batch and a decode loop under one `jit`.

Layout. Prompts are left-padded to a prompt bucket `P` so that they all end at
slot `P - 1` of one preallocated `KVCache` of `P + M` slots (`M` the
new-token bucket); every row then decodes in lockstep, writing slot `P + t`
at step `t`, while its rotary position is its own `prompt_len + t`. Padded
slots are masked out, so each row sees exactly its own prompt. The prefill is
`marljax.models.hidden_states`; the decode loop runs `marljax.models.decode`'s
one-token step (the same layer maths over per-layer caches, unrolled layers).
This module holds no model maths: it chooses tokens, records them and stops rows.

Two jitted functions, both taking the parameters as a pytree argument (new
parameters of the same shapes and shardings reuse the compiled code):

- `prefill(params, ids [Bp, P], mask [Bp, P])` -> cache and the last position's
  logits `[Bp, V]`; run once per call over the distinct prompts.
- `decode(params, cache, logits, ...)` -> tokens, raw and sampling log-probs,
  lengths, finish reasons, steps. It first copies each prompt's cache rows to
  its `n` samples (a gather along the batch axis: `n` samples share one
  prefill), then runs a `lax.while_loop` that stops when every row is done or
  `max_new_tokens` (a traced value, at most `M`) is reached. Its carry is a
  `DecodeState`. The loop is split into phases over growing cache windows
  (`Buckets.kv_phases`, `kv_windows`): on CPU a decode step reads the whole
  cache it is given, so early steps get only its used part.

Static (recompiling) choices: the model config, the prompt bucket `P`, the
prompt-batch bucket `Bp`, the sample-batch bucket `Bd`, the new-token bucket
`M`, greedy vs sampling, whether sampling log-probs are returned, and the
sizes of the EOS / stop-sequence tables (themselves bucketed). Temperature,
top-k, top-p, the seed, `max_new_tokens`, EOS ids and stop sequences are
traced arrays. `Engine.stats` counts compilations (incremented in the traced
bodies, so only when JAX traces) and calls.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding

from marljax.kernels.losses_terms import logprobs_from_logits
from marljax.models import (
    ModelConfig,
    batch_sharding,
    cache_sharding,
    hidden_states,
    init_cache,
    positions_from_mask,
    unembed,
)
from marljax.models.decode import DecodeCache, decode_step, decode_weights, grow_cache, split_cache
from marljax.sampler.sampling import DEFAULT_BOUND, sample_tokens

# finish reasons
UNFINISHED, EOS, STOP, LENGTH = 0, 1, 2, 3
REASONS = ("unfinished", "eos", "stop", "length")


def next_bucket(n: int, minimum: int = 1, sizes: tuple[int, ...] | None = None, multiple: int = 1) -> int:
    """The smallest bucket >= n: from `sizes` if given (ValueError past the largest),
    else the next power of two >= max(n, minimum); rounded up to a multiple of `multiple`."""
    if sizes:
        fits = [s for s in sorted(sizes) if s >= n]
        if not fits:
            raise ValueError(f"{n} is larger than the largest bucket {max(sizes)}")
        b = fits[0]
    else:
        b = 1 << max(0, (max(n, minimum) - 1).bit_length())
    return -(-b // multiple) * multiple


def kv_windows(prompt_slots: int, new_slots: int, phases: int) -> list[int]:
    """Cache widths of the decode phases: phase j attends over the first `P + (j + 1) M / n` slots
    (the last phase over all `P + M`), so early steps do not read the empty tail of the cache."""
    phases = max(1, min(int(phases), new_slots))
    return [prompt_slots + (new_slots * (j + 1)) // phases for j in range(phases)]


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Shape buckets. `None` sizes mean powers of two from the minimum.

    prompt: prompt lengths (left-padded); batch: number of prompts and of samples
    (rounded up to a multiple of the mesh's data-parallel size); new_tokens: the
    token buffer and cache tail; stop: (number of stop sequences, their length).
    kv_phases: the decode loop runs in this many phases over growing cache windows
    (`kv_windows`), so early steps skip the cache's empty tail; each phase is
    compiled separately. None: 4 phases from 128 new-token slots on, else 1 (short
    generations save little and would pay the extra compilation).
    """

    prompt: tuple[int, ...] | None = None
    min_prompt: int = 16
    batch: tuple[int, ...] | None = None
    min_batch: int = 1
    new_tokens: tuple[int, ...] | None = None
    min_new_tokens: int = 16
    min_eos: int = 4
    min_stop: int = 1
    min_stop_len: int = 4
    kv_phases: int | None = None

    def phases(self, new_tokens_bucket: int) -> int:
        if self.kv_phases is not None:
            return self.kv_phases  # `kv_windows` clamps it to 1..new_tokens_bucket
        return 1 if new_tokens_bucket < 128 else 4


@dataclasses.dataclass
class EngineStats:
    """Counters: compiles are counted when JAX traces (not when a cached executable runs)."""

    prefill_compiles: int = 0
    decode_compiles: int = 0
    prefill_calls: int = 0
    prefill_rows: int = 0  # prompt rows prefilled (after batch bucketing)
    decode_calls: int = 0
    decode_rows: int = 0
    last_steps: int = 0  # decode-loop iterations of the latest call (tokens per row)

    @property
    def compiles(self) -> int:
        return self.prefill_compiles + self.decode_compiles


class DecodeState(NamedTuple):
    """The decode loop's carry, `Bd` rows and `M` new-token slots."""

    step: jax.Array  # [] int32: tokens chosen so far (the next is token `step` of every row)
    kv: DecodeCache  # per-layer caches in the decode layout (`marljax.models.decode`)
    last_token: jax.Array  # [Bd] int32: token `step - 1`, the next decode step's input
    tokens: jax.Array  # [Bd, M] int32: chosen tokens, `pad_id` once a row is done
    logprobs: jax.Array  # [Bd, M] float32: under softmax(logits / T), no truncation; 0 when done
    sampling_logprobs: jax.Array  # [Bd, M] float32 under the sampled distribution ([Bd, 1] if unused)
    done: jax.Array  # [Bd] bool
    lengths: jax.Array  # [Bd] int32: tokens generated, set when the row ends
    finish_reason: jax.Array  # [Bd] int32: UNFINISHED, EOS, STOP or LENGTH
    recent: jax.Array  # [Bd, Ls] int32: the row's last Ls tokens, matched against stop sequences


class Engine:
    """Compiled prefill + decode for one `ModelConfig` (and optionally one mesh).

    Get one with `get_engine(config, mesh)`; `marljax.sampler.generate` does.
    topk_bound: size of the top-k fast path of `sample_tokens`. fuse_projections:
    decode with fused q/k/v and gate/up weight copies (None: on when there is no
    mesh and the parameters take <= 256 MiB).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        mesh: Mesh | None = None,
        buckets: Buckets | None = None,
        topk_bound: int = DEFAULT_BOUND,
        fuse_projections: bool | None = None,
    ):
        self.config = config
        self.mesh = mesh
        if fuse_projections is None:  # fused q/k/v and gate/up copies of the weights, built per
            # call: worth it when steps are short; off on meshes (tensor-split weights) and
            # for models over 256 MiB of parameters (transient memory)
            nbytes = config.num_params() * np.dtype(config.param_dtype).itemsize
            fuse_projections = mesh is None and nbytes <= 256 * 2**20
        self.fuse_projections = bool(fuse_projections)
        self.buckets = buckets or Buckets()
        self.topk_bound = int(topk_bound)
        self.stats = EngineStats()
        self._prefill_jit = jax.jit(self._prefill, static_argnames=("cache_len",))
        self._decode_jit = jax.jit(
            self._decode,
            static_argnames=("new_tokens_bucket", "greedy", "want_sampling_lp", "broadcast", "pad_id"),
        )

    # ----------------------------------------------------------------- shapes
    @property
    def data_parallel(self) -> int:
        if self.mesh is None:
            return 1
        return int(self.mesh.shape.get("data", 1) * self.mesh.shape.get("fsdp", 1))

    def batch_bucket(self, n: int) -> int:
        b = self.buckets
        return next_bucket(n, b.min_batch, b.batch, self.data_parallel)

    def prompt_bucket(self, n: int) -> int:
        return next_bucket(n, self.buckets.min_prompt, self.buckets.prompt)

    def new_tokens_bucket(self, n: int) -> int:
        return next_bucket(n, self.buckets.min_new_tokens, self.buckets.new_tokens)

    def _put(self, x, ndim_batch: bool = True):
        x = jnp.asarray(x)
        if self.mesh is None or not ndim_batch:
            return x
        return jax.device_put(x, batch_sharding(self.mesh, x.ndim))

    def _constrain_cache(self, cache):
        if self.mesh is None:
            return cache
        return lax.with_sharding_constraint(cache, cache_sharding(self.mesh, cache))

    def _constrain_batch(self, x):
        if self.mesh is None:
            return x
        return lax.with_sharding_constraint(x, batch_sharding(self.mesh, x.ndim))

    # ---------------------------------------------------------------- prefill
    def _prefill(self, params, ids, mask, *, cache_len: int):
        self.stats.prefill_compiles += 1  # runs at trace time only
        c = self.config
        B, _ = ids.shape
        cache = self._constrain_cache(init_cache(c, B, cache_len))
        h, cache = hidden_states(
            params, ids, config=c, positions=positions_from_mask(mask), attention_mask=mask, cache=cache
        )
        logits = unembed(params, h[:, -1])
        return self._constrain_cache(cache), self._constrain_batch(logits)

    def prefill(self, params, ids: np.ndarray, mask: np.ndarray, cache_len: int):
        """Run the prefill over `[Bp, P]` left-padded prompts; returns (cache, logits [Bp, V])."""
        self.stats.prefill_calls += 1
        self.stats.prefill_rows += int(ids.shape[0])
        return self._prefill_jit(
            params, self._put(ids.astype(np.int32)), self._put(mask.astype(bool)), cache_len=int(cache_len)
        )

    # ----------------------------------------------------------------- decode
    def _decode(
        self,
        params,
        cache,
        logits,
        src,
        prompt_len,
        live,
        seed,
        temperature,
        top_k,
        top_p,
        eos,
        stop_seqs,
        stop_valid,
        stop_active,
        max_new,
        *,
        new_tokens_bucket: int,
        greedy: bool,
        want_sampling_lp: bool,
        broadcast: bool,
        pad_id: int,
    ):
        self.stats.decode_compiles += 1  # runs at trace time only
        c = self.config
        Bd, M = prompt_len.shape[0], new_tokens_bucket
        if broadcast:  # n samples per prompt: copy the prefilled rows
            cache = dataclasses.replace(
                cache,
                k=jnp.take(cache.k, src, axis=1),
                v=jnp.take(cache.v, src, axis=1),
                mask=jnp.take(cache.mask, src, axis=0),
            )
            logits = jnp.take(logits, src, axis=0)
        cache = self._constrain_cache(cache)
        logits = self._constrain_batch(logits)
        base = jax.random.key(seed)
        row_keys = jax.vmap(lambda r: jax.random.fold_in(base, r))(jnp.arange(Bd, dtype=jnp.uint32))
        Ls = stop_seqs.shape[1]
        S = cache.k.shape[2]
        P = S - M  # the prompt bucket: first decode slot; every slot from here on holds a real token
        windows = kv_windows(P, M, self.buckets.phases(M))
        weights = decode_weights(params, c, self.fuse_projections)
        valid = cache.mask | (jnp.arange(S) >= P)[None, :]
        # log-probs under softmax(logits / T) without top-k/top-p, the distribution the trainer
        # recomputes; a greedy row (T = 0) records the model's own (T = 1)
        scale = jnp.ones_like(temperature) if greedy else jnp.where(temperature > 0, temperature, 1.0)

        def record(state: DecodeState, logits) -> DecodeState:
            """Choose token `state.step` of every row from its `logits` `[Bd, V]`; end rows."""
            t, done = state.step, state.done
            step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(row_keys)
            tok, slp = sample_tokens(
                logits,
                step_keys,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                greedy=greedy,
                bound=self.topk_bound,
            )
            lp = logprobs_from_logits(logits / scale[:, None], tok)  # the trainer's convention
            tok = jnp.where(done, pad_id, tok)

            def put(buf, x, t=t):
                return lax.dynamic_update_slice(buf, x[:, None], (0, t))

            sampling_logprobs = state.sampling_logprobs
            if want_sampling_lp:
                sampling_logprobs = put(sampling_logprobs, jnp.where(done, 0.0, slp))
            recent = jnp.concatenate([state.recent[:, 1:], tok[:, None]], axis=1)
            is_eos = jnp.any(tok[:, None] == eos[None, :], axis=1)
            match = jnp.all((recent[:, None, :] == stop_seqs[None]) | ~stop_valid[None], axis=2)
            is_stop = jnp.any(match & stop_active[None], axis=1)
            ends = ~done & (is_eos | is_stop | (t + 1 >= max_new))
            why = jnp.where(is_eos, EOS, jnp.where(is_stop, STOP, LENGTH))
            return state._replace(
                step=t + 1,
                last_token=tok,
                tokens=put(state.tokens, tok),
                logprobs=put(state.logprobs, jnp.where(done, 0.0, lp)),
                sampling_logprobs=sampling_logprobs,
                done=done | ends,
                lengths=jnp.where(ends, t + 1, state.lengths),
                finish_reason=jnp.where(ends, why, state.finish_reason),
                recent=recent,
            )

        def phase(W, last):
            def cond(state: DecodeState):  # step t writes slot P + t - 1, which must lie in the window
                return ~jnp.all(state.done) & (True if last else state.step <= W - P)

            def body(state: DecodeState):
                t = state.step
                # token t-1 sits at rotary position prompt_len + t - 1 and in slot P + t - 1
                logits, kv = decode_step(
                    weights, state.last_token, prompt_len + t - 1, state.kv, valid[:, :W], P + t - 1, config=c
                )
                return record(state._replace(kv=kv), logits)

            return cond, body

        state = DecodeState(
            step=jnp.zeros((), jnp.int32),
            kv=split_cache(cache, windows[0]),
            last_token=jnp.zeros((Bd,), jnp.int32),
            tokens=jnp.full((Bd, M), pad_id, jnp.int32),
            logprobs=jnp.zeros((Bd, M), jnp.float32),
            sampling_logprobs=jnp.zeros((Bd, M) if want_sampling_lp else (Bd, 1), jnp.float32),
            done=~live,
            lengths=jnp.zeros((Bd,), jnp.int32),
            finish_reason=jnp.full((Bd,), UNFINISHED, jnp.int32),
            recent=jnp.full((Bd, Ls), -1, jnp.int32),
        )
        state = record(state, logits)
        for j, W in enumerate(windows):
            if j:
                state = state._replace(kv=grow_cache(state.kv, W))
            state = lax.while_loop(*phase(W, j == len(windows) - 1), state)
        return (
            state.tokens,
            state.logprobs,
            state.sampling_logprobs,
            state.lengths,
            state.finish_reason,
            state.step,
        )

    def decode(
        self,
        params,
        cache,
        logits,
        *,
        src,
        prompt_len,
        live,
        seed,
        temperature,
        top_k,
        top_p,
        eos,
        stop_seqs,
        stop_valid,
        stop_active,
        max_new,
        new_tokens_bucket: int,
        greedy: bool,
        want_sampling_lp: bool,
        broadcast: bool,
        pad_id: int,
    ):
        """Run the decode loop (see the module doc); arrays are host numpy, `[Bd]` per row."""
        self.stats.decode_calls += 1
        self.stats.decode_rows += int(prompt_len.shape[0])
        return self._decode_jit(
            params,
            cache,
            logits,
            self._put(src.astype(np.int32)),
            self._put(prompt_len.astype(np.int32)),
            self._put(live.astype(bool)),
            jnp.asarray(seed, jnp.uint32),
            self._put(temperature.astype(np.float32)),
            self._put(top_k.astype(np.int32)),
            self._put(top_p.astype(np.float32)),
            jnp.asarray(eos, jnp.int32),
            jnp.asarray(stop_seqs, jnp.int32),
            jnp.asarray(stop_valid, bool),
            jnp.asarray(stop_active, bool),
            jnp.asarray(max_new, jnp.int32),
            new_tokens_bucket=int(new_tokens_bucket),
            greedy=bool(greedy),
            want_sampling_lp=bool(want_sampling_lp),
            broadcast=bool(broadcast),
            pad_id=int(pad_id),
        )


_ENGINES: dict[Any, Engine] = {}
_LOCK = threading.Lock()


def get_engine(
    config: ModelConfig,
    mesh: Mesh | None = None,
    buckets: Buckets | None = None,
    topk_bound: int = DEFAULT_BOUND,
    fuse_projections: bool | None = None,
) -> Engine:
    """The shared `Engine` for these settings (built on first use; see `Engine`)."""
    key = (config, mesh, buckets or Buckets(), int(topk_bound), fuse_projections)
    with _LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = Engine(
                config, mesh=mesh, buckets=buckets, topk_bound=topk_bound, fuse_projections=fuse_projections
            )
        return _ENGINES[key]


def mesh_of(params) -> Mesh | None:
    """The mesh the parameters are sharded over (None for single-device arrays)."""
    for leaf in jax.tree.leaves(params):
        sh = getattr(leaf, "sharding", None)
        if isinstance(sh, NamedSharding) and sh.mesh.size > 1:
            return sh.mesh
    return None
