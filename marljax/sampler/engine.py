"""The compiled core: continuous batching over a fixed number of decode slots.

Layout. The engine owns one cache of `B` slots (rows) x `C` positions in the decode layout
(`marljax.models.decode`). A request occupies one slot: its prompt fills positions
`0 .. len - 1` and each generated token the next one, so a slot's write position is also its
rotary position, and every slot has its own. Three jitted functions over a `SlotState`:

- `insert`: puts new requests into free slots. Each new row first takes a copy of the cache
  row that holds the longest prefix of its prompt (another request's prompt or answer, or an
  earlier request in the same slot; `share_prefixes`), then runs only the rest of its prompt
  through `extend_step` and chooses its first token. The `n` samples of one prompt, the nodes
  of one search tree and refinement prompts built on one problem prefill their shared part once.
- `decode`: up to `chunk` one-token steps (`idle_chunk` once no request waits) of every busy
  slot inside one `lax.while_loop`, over a cache window `W <= C` (the first `W` positions:
  attention reads the window it is given, so short rows do not pay for the longest one). The
  state is donated, so the cache is updated in place. It returns early, so the host can act,
  when enough slots are free to refill while requests wait, when few enough are busy to halve
  the slots with none waiting, or when a row reaches the window's end.
- `compact`: keeps the busy rows in a smaller slot batch (the tail of a call, when the rows
  left would otherwise share the step with idle slots).

Paged cache (`cache_layout="paged"`): instead of `B x C` positions, one pool of fixed-size pages
per layer and a page table per slot, kept on the host (`marljax.sampler.pages.PagePool`) and
passed to each call. A row holds the pages of its own length (allocated before each decode call
for its next `chunk` positions), a finished row's pages go back to the pool (kept as a prefix
cache until needed), and a new row shares another row's prefix by referencing its full pages
(`insert` copies only the page the prefix ends inside: copy on write). The pool is
`Engine.num_pages` pages (None: enough for every slot at full capacity); a request the pool
cannot promise its worst case (prompt + budget) waits until rows finish. Tokens and log-probs are
those of the dense layouts.

The host loop (`marljax.sampler.schedule.HostLoop`, behind `Engine.run`) queues requests, refills
free slots, streams each request's completion as soon as it ends and tracks what every slot's
cache holds (for prefix sharing).
Sampling uses per-request keys: request `r`'s token `t` uses `fold_in(fold_in(key(seed), r), t)`,
so a request's tokens do not depend on its slot, its batch or the slot count.

Static (recompiling) shapes: the slot count `B` (powers of two, halved in the tail), the cache
length `C` (prompt bucket + new-token bucket), the decode window `W` and chunk, the insert batch
and its token and window buckets, greedy vs sampling, whether any row truncates (top-k or top-p),
whether sampling log-probs are kept, and the EOS / stop-table sizes. Temperature, top-k, top-p,
seeds, budgets, EOS ids and stop sequences are traced arrays. `Engine.stats` counts compilations
(incremented in the traced bodies, so only when JAX traces), calls, slot-steps and shared prefix
tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding

from marljax.kernels.losses_terms import logprobs_from_logits
from marljax.models import ModelConfig
from marljax.models.decode import (
    LAYOUTS,
    DecodeCache,
    decode_weights,
    default_layout,
    extend_step,
    heads_axis,
    init_decode_cache,
    init_page_pool,
    position_axis,
)
from marljax.models.sharding import activation_sharding, batch_sharding, logical_to_spec
from marljax.sampler.sampling import DEFAULT_BOUND, sample_tokens, scaled
from marljax.sampler.schedule import (
    EOS,
    LENGTH,
    STOP,
    UNFINISHED,
    Buckets,
    Completion,
    HostLoop,
    Request,
    Schedule,
    Tables,
    next_bucket,
)


def _under_mesh(method):
    """`method` traced inside `activation_sharding(self.mesh)`: its activations stay split by rows."""

    @functools.wraps(method)
    def traced(self, *args, **kwargs):
        with activation_sharding(self.mesh):
            return method(self, *args, **kwargs)

    return traced


@dataclasses.dataclass
class EngineStats:
    """Counters: compiles are counted when JAX traces (not when a cached executable runs)."""

    insert_compiles: int = 0
    decode_compiles: int = 0
    compact_compiles: int = 0
    insert_calls: int = 0
    prefill_tokens: int = 0  # prompt tokens run through the model
    shared_tokens: int = 0  # prompt tokens copied from another slot's cache instead
    decode_calls: int = 0
    decode_steps: int = 0  # one-token steps of the slot batch
    slot_steps: int = 0  # decode steps x slots (busy or not)
    useful_tokens: int = 0  # tokens generated for requests
    peak_slots: int = 0
    cache_bytes: int = 0  # KV cache of the latest call
    # paged layout: the latest call's pool and the most pages it held at once; cumulative
    # prefix pages referenced instead of copied and pages copied on write
    pool_pages: int = 0
    peak_pages: int = 0
    shared_pages: int = 0
    cow_pages: int = 0
    page_waits: int = 0  # fills that left requests waiting for pages (free slots unused)

    @property
    def compiles(self) -> int:
        return self.insert_compiles + self.decode_compiles + self.compact_compiles


class SlotState(NamedTuple):
    """Per-slot state on the device, `B` slots."""

    kv: DecodeCache  # per-layer caches, `C` positions per slot
    pos: jax.Array  # [B] int32: the next write position (= rotary position of `last_token`)
    last_token: jax.Array  # [B] int32: the latest chosen token, the next step's input
    step: jax.Array  # [B] int32: tokens generated so far
    done: jax.Array  # [B] bool: finished or never used (the slot is free)
    key: jax.Array  # [B, 2] uint32: the request's key data, `fold_in(key(seed), request)`
    max_new: jax.Array  # [B] int32: the request's token budget
    temperature: jax.Array  # [B] float32
    top_k: jax.Array  # [B] int32
    top_p: jax.Array  # [B] float32
    recent: jax.Array  # [B, Ls] int32: the last Ls tokens, matched against stop sequences
    adapter: jax.Array  # [B] int32: the request's LoRA adapter in params["lora"] (0 without adapters)


def _positions(layout: str, i: int, ndim: int, first, positions) -> tuple:
    """An index of cache array `i`: `first` on its slot axis, `positions` on its position axis."""
    index = [slice(None)] * ndim
    index[0], index[position_axis(layout, i)] = first, positions
    return tuple(index)


def _window(kv: DecodeCache, window: int, layout: str) -> DecodeCache:
    """The first `window` positions of each cache (the caches themselves when that is all)."""
    return tuple(x[_positions(layout, i, x.ndim, slice(None), slice(window))] for i, x in enumerate(kv))


def _unwindow(full: DecodeCache, part: DecodeCache) -> DecodeCache:
    """`full` with its first positions replaced by `part` (from `_window`)."""
    return tuple(
        p if x.shape == p.shape else lax.dynamic_update_slice(x, p, (0,) * x.ndim) for x, p in zip(full, part)
    )


class Engine:
    """Compiled insert / decode / compact for one `ModelConfig` (and optionally one mesh).

    Get one with `get_engine(config, mesh)`; `marljax.sampler.generate` does.
    topk_bound: size of the top-k fast path of `sample_tokens`. fuse_projections:
    decode with fused q/k/v and gate/up weight copies (None: on when there is no
    mesh and the parameters take <= 256 MiB). cache_layout: of the KV cache, see
    `marljax.models.decode.LAYOUTS` (None: "split" on CPU, "bskh" on accelerators,
    whose one-token steps run `jax.nn.dot_product_attention` with the config's
    `attention_impl`; "paged": a pool of pages, see the module). page_size: positions per
    page (paged layout). num_pages: the pool's pages (paged layout; None: slots x capacity
    worth, i.e. the dense cache's memory; or give `cache_budget` in bytes instead).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        mesh: Mesh | None = None,
        buckets: Buckets | None = None,
        topk_bound: int = DEFAULT_BOUND,
        fuse_projections: bool | None = None,
        cache_layout: str | None = None,
        page_size: int = 16,
        num_pages: int | None = None,
        cache_budget: int | None = None,
    ):
        self.config = config
        self.layout = cache_layout or default_layout()
        if self.layout not in LAYOUTS:
            raise ValueError(f"cache_layout must be one of {LAYOUTS} or None, got {cache_layout!r}")
        self.mesh = mesh
        self.paged = self.layout == "paged"
        self.page_size = int(page_size)
        if self.paged:
            if mesh is not None:
                raise ValueError("the paged cache layout runs on one device for now (no mesh)")
            if self.page_size < 1:
                raise ValueError(f"page_size must be >= 1, got {page_size}")
            if num_pages is not None and cache_budget is not None:
                raise ValueError("give num_pages or cache_budget, not both")
            if cache_budget is not None:
                num_pages = int(cache_budget) // self.page_bytes()
            if num_pages is not None and num_pages < 1:
                raise ValueError(f"the page pool needs at least one page, got {num_pages}")
        self.num_pages = None if num_pages is None else int(num_pages)
        if fuse_projections is None:  # fused q/k/v and gate/up copies of the weights, built per
            # call: worth it when steps are short; off on meshes (tensor-split weights) and
            # for models over 256 MiB of parameters (transient memory)
            nbytes = config.num_params() * np.dtype(config.param_dtype).itemsize
            fuse_projections = mesh is None and nbytes <= 256 * 2**20
        self.fuse_projections = bool(fuse_projections)
        self.buckets = buckets or Buckets()
        self.topk_bound = int(topk_bound)
        self.stats = EngineStats()
        self._fuse_jit = jax.jit(self._fuse)
        self._fused = None  # (parameter leaves, their fused copy)
        self._empty_jit = jax.jit(self._empty, static_argnames=("slots", "capacity", "stop_len"))
        # the slot state (its KV cache above all) is donated: each call updates it in place
        # instead of holding a second copy of the cache
        self._insert_jit = jax.jit(
            self._insert, static_argnames=("window", "greedy", "truncate"), donate_argnums=1
        )
        self._decode_jit = jax.jit(
            self._decode,
            static_argnames=("windows", "chunk", "greedy", "truncate", "want_sampling_lp", "pad_id"),
            donate_argnums=1,
        )
        self._compact_jit = jax.jit(self._compact)  # (a smaller state: nothing to update in place)

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

    def window(self, needed: int, capacity: int) -> int:
        """The decode window for `needed` positions: the smallest of `min_window` times 1, 1.5,
        2, 3, 4, 6, ... that holds them, or the whole cache (a step reads the whole window, so
        half-steps between powers of two cut the waste to a third for one compile more). Without
        `min_window`, the whole cache: one window, so one program where a ladder of windows
        compiles one per set of windows a call grows through."""
        if self.buckets.min_window is None:
            return capacity
        w = next_bucket(needed, self.buckets.min_window)
        if w * 3 // 4 >= max(needed, self.buckets.min_window):
            w = w * 3 // 4
        return min(w, capacity)

    def cache_bytes(self, slots: int, capacity: int) -> int:
        """Bytes of the KV cache of a call with `slots` slots of `capacity` positions (paged: its pool)."""
        if self.paged:
            return self.pool_pages(slots, capacity) * self.page_bytes()
        c = self.config
        itemsize = np.dtype(c.dtype).itemsize
        return 2 * c.num_layers * slots * c.num_kv_heads * c.head_dim * capacity * itemsize

    def page_bytes(self) -> int:
        """Bytes of one page of every layer's keys and values."""
        c = self.config
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.page_size * np.dtype(c.dtype).itemsize

    def pool_pages(self, slots: int, capacity: int) -> int:
        """The paged pool of a call: `num_pages`, or slots x capacity worth of pages."""
        if self.num_pages is not None:
            return self.num_pages
        return slots * (-(-capacity // self.page_size))

    def _put(self, x):
        """A host array with a leading slot axis, on the device (split over the mesh's data axes)."""
        x = jnp.asarray(x)
        if self.mesh is None:
            return x
        return jax.device_put(x, batch_sharding(self.mesh, x.ndim))

    def _constrain(self, state: SlotState) -> SlotState:
        """The state laid out over the mesh (see `_kv_sharding`)."""
        if self.mesh is None:
            return state
        kv = tuple(lax.with_sharding_constraint(x, self._kv_sharding(x)) for x in state.kv)
        rest = [lax.with_sharding_constraint(x, batch_sharding(self.mesh, x.ndim)) for x in state[1:]]
        return SlotState(kv, *rest)

    # ------------------------------------------------------------------ state
    def empty_state(self, slots: int, capacity: int, stop_len: int) -> SlotState:
        """`slots` free slots of `capacity` cache positions, built on the device."""
        return self._empty_jit(slots=slots, capacity=capacity, stop_len=stop_len)

    def _empty(self, *, slots: int, capacity: int, stop_len: int) -> SlotState:
        zeros = jnp.zeros((slots,), jnp.int32)
        if self.paged:
            kv = init_page_pool(self.config, self.pool_pages(slots, capacity), self.page_size)
        else:
            kv = init_decode_cache(self.config, slots, capacity, layout=self.layout)
        return self._constrain(
            SlotState(
                kv=kv,
                pos=zeros,
                last_token=zeros,
                step=zeros,
                done=jnp.ones((slots,), bool),
                key=jnp.zeros((slots, 2), jnp.uint32),
                max_new=jnp.ones((slots,), jnp.int32),
                temperature=jnp.ones((slots,), jnp.float32),
                top_k=zeros,
                top_p=jnp.ones((slots,), jnp.float32),
                recent=jnp.full((slots, stop_len), -1, jnp.int32),
                adapter=zeros,
            )
        )

    def _kv_sharding(self, x) -> NamedSharding:
        """Slots over the data axes, kv heads over `tensor` (where they divide)."""
        names = [None] * x.ndim
        names[0], names[heads_axis(self.layout)] = "batch", "kv_heads"
        return NamedSharding(self.mesh, logical_to_spec(names, x.shape, self.mesh))

    # --------------------------------------------------------------- compiled
    def _choose(self, logits, state: SlotState, tables: Tables, busy, *, greedy: bool, truncate: bool):
        """Token `state.step` of every slot from its `logits` `[B, V]`: the token, its log-prob
        under softmax(logits / T) (what the trainer recomputes; T = 1 for greedy rows), its
        log-prob under the sampled distribution, the new recent window, and whether and why the
        row ends (`busy` rows only)."""
        keys = state.key  # unused when greedy
        if not greedy:
            keys = jax.vmap(jax.random.fold_in)(
                jax.random.wrap_key_data(state.key), state.step.astype(jnp.uint32)
            )
        tok, slp = sample_tokens(
            logits,
            keys,
            temperature=state.temperature,
            top_k=state.top_k,
            top_p=state.top_p,
            greedy=greedy,
            truncate=truncate,
            bound=self.topk_bound,
        )
        # (a greedy call's busy rows all have temperature 0: their log-probs are at temperature 1)
        lp = logprobs_from_logits(scaled(logits, state.temperature), tok)
        recent = jnp.concatenate([state.recent[:, 1:], tok[:, None]], axis=1)
        is_eos = jnp.any(tok[:, None] == tables.eos[None, :], axis=1)
        match = jnp.all((recent[:, None, :] == tables.stop_seqs[None]) | ~tables.stop_valid[None], axis=2)
        is_stop = jnp.any(match & tables.stop_active[None], axis=1)
        ends = busy & (is_eos | is_stop | (state.step + 1 >= state.max_new))
        why = jnp.where(is_eos, EOS, jnp.where(is_stop, STOP, LENGTH))
        return tok, lp, slp, recent, ends, why

    def _fuse(self, params):
        return decode_weights(params, self.config, fuse=True)

    def weights(self, params):
        """What the insert and decode steps take: with fused projections, the fused copy (small
        models only), kept while the same parameter arrays come back (the calls of one RL step);
        else the parameters themselves, sliced per layer inside each step (a separate per-layer
        copy would double a large model)."""
        if not self.fuse_projections:
            return params
        leaves = tuple(jax.tree.leaves(params))
        cached = self._fused
        if (
            cached is None
            or len(cached[0]) != len(leaves)
            or any(a is not b for a, b in zip(cached[0], leaves))
        ):
            self._fused = cached = (leaves, self._fuse_jit(params))
        return cached[1]

    def _layer_weights(self, weights):
        if isinstance(weights["layers"], list):  # already in the decode layout (`weights`)
            return weights
        return decode_weights(weights, self.config, fuse=False)

    @_under_mesh
    def _insert(
        self,
        weights,
        state: SlotState,
        tables: Tables,
        slots,
        source,
        starts,
        tokens,
        lengths,
        request,
        max_new,
        temperature,
        top_k,
        top_p,
        adapter,
        paging=None,
        *,
        window: int,
        greedy: bool,
        truncate: bool,
    ):
        """Put `Bn` requests into `slots`: row j copies positions `< starts[j]` of slot
        `source[j]`'s cache (all as they were before this call), then runs its `lengths[j]`
        prompt tokens `tokens[j]` from position `starts[j]` on, and chooses its first token.
        Rows whose slot is out of range (padding) change nothing.

        Paged layout: `paging` = (page tables `[Bn, M]`, copy-on-write sources `[Bn]`, their
        destinations `[Bn]`) and `source` is unused: the tables already reference the shared
        prefix's full pages; page `cow_src[j]` is first copied to `cow_dst[j]` (out of range:
        nothing), all copies reading the pool as it was before this call."""
        self.stats.insert_compiles += 1  # runs at trace time only
        weights = self._layer_weights(weights)
        if self.paged:
            pages, cow_src, cow_dst = paging
            pool = tuple(
                x.at[:, cow_dst].set(jnp.take(x, cow_src, axis=1, mode="clip"), mode="drop") for x in state.kv
            )
            n_pages = min(-(-window // self.page_size), pages.shape[1])
            logits, pool = extend_step(
                weights,
                tokens,
                starts,
                lengths,
                pool,
                config=self.config,
                adapter=adapter,
                layout=self.layout,
                pages=pages[:, :n_pages],
            )
            rows_kv = ()
        else:
            rows_kv = _window(tuple(x[source] for x in state.kv), window, self.layout)
            logits, rows_kv = extend_step(
                weights,
                tokens,
                starts,
                lengths,
                rows_kv,
                config=self.config,
                adapter=adapter,
                layout=self.layout,
            )
        Bn = slots.shape[0]
        new = SlotState(
            kv=rows_kv,
            pos=starts + lengths,
            last_token=jnp.zeros((Bn,), jnp.int32),
            step=jnp.zeros((Bn,), jnp.int32),
            done=jnp.zeros((Bn,), bool),
            key=jax.vmap(lambda r: jax.random.key_data(jax.random.fold_in(jax.random.key(tables.seed), r)))(
                request
            ),
            max_new=max_new,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            recent=jnp.full((Bn, state.recent.shape[1]), -1, jnp.int32),
            adapter=adapter,
        )
        busy = jnp.ones((Bn,), bool)
        tok, lp, slp, recent, ends, why = self._choose(
            logits, new, tables, busy, greedy=greedy, truncate=truncate
        )
        new = new._replace(last_token=tok, step=jnp.ones((Bn,), jnp.int32), done=ends, recent=recent)
        if self.paged:
            kv = pool
        else:
            kv = tuple(
                x.at[_positions(self.layout, i, x.ndim, slots, slice(window))].set(r, mode="drop")
                for i, (x, r) in enumerate(zip(state.kv, new.kv))
            )
        rest = [x.at[slots].set(r, mode="drop") for x, r in zip(state[1:], new[1:])]
        state = self._constrain(SlotState(kv, *rest))
        return state, (tok, lp, slp, jnp.where(ends, why, UNFINISHED))

    @_under_mesh
    def _decode(
        self,
        weights,
        state: SlotState,
        tables: Tables,
        refill_free,
        shrink_busy,
        pages=None,
        *,
        windows: tuple[int, ...],
        chunk: int,
        greedy: bool,
        truncate: bool,
        want_sampling_lp: bool,
        pad_id: int,
    ):
        """Up to `chunk` decode steps of every busy slot, over cache positions `< windows[0]`
        until a busy row's next position is outside it, then over the next window, and so on
        (one loop per window, in one program: no return to the host between windows).

        Stops early once `refill_free` slots are free, once at most `shrink_busy` are busy, or
        once a busy row's next position is outside the last window. Returns the state, the steps
        run and, per slot, the chosen tokens `[B, chunk]` with their log-probs (0 and `pad_id`
        where the slot was not busy), the number it emitted and its finish reason.

        Paged layout: `pages` `[B, M]` are the slots' page tables (every busy row has pages for
        its next `chunk` positions); a window is the tables' first columns."""
        self.stats.decode_compiles += 1  # runs at trace time only
        weights = self._layer_weights(weights)
        B = state.pos.shape[0]
        full_kv = state.kv

        def cond(carry, window):
            state, i = carry[0], carry[1]
            busy = ~state.done
            n_busy = jnp.sum(busy)
            inside = jnp.max(jnp.where(busy, state.pos, 0)) < window
            return (i < chunk) & (n_busy > jnp.maximum(shrink_busy, 0)) & (B - n_busy < refill_free) & inside

        def body(carry, window_pages=None):
            state, i, toks, lps, slps, emitted, reason = carry
            busy = ~state.done
            logits, kv = extend_step(
                weights,
                state.last_token[:, None],
                state.pos,
                busy.astype(jnp.int32),
                state.kv,
                config=self.config,
                adapter=state.adapter,
                layout=self.layout,
                pages=window_pages,
            )
            state = state._replace(kv=kv)
            tok, lp, slp, recent, ends, why = self._choose(
                logits, state, tables, busy, greedy=greedy, truncate=truncate
            )

            def put(buf, x):
                return lax.dynamic_update_slice(buf, x[:, None], (0, i))

            toks = put(toks, jnp.where(busy, tok, pad_id))
            lps = put(lps, jnp.where(busy, lp, 0.0))
            if want_sampling_lp:
                slps = put(slps, jnp.where(busy, slp, 0.0))
            state = state._replace(
                pos=jnp.where(busy, state.pos + 1, state.pos),
                last_token=jnp.where(busy, tok, state.last_token),
                step=jnp.where(busy, state.step + 1, state.step),
                done=state.done | ends,
                recent=jnp.where(busy[:, None], recent, state.recent),
            )
            return state, i + 1, toks, lps, slps, emitted + busy, jnp.where(ends, why, reason)

        carry = (
            state,
            jnp.zeros((), jnp.int32),
            jnp.full((B, chunk), pad_id, jnp.int32),
            jnp.zeros((B, chunk), jnp.float32),
            jnp.zeros((B, chunk) if want_sampling_lp else (B, 1), jnp.float32),
            jnp.zeros((B,), jnp.int32),
            jnp.full((B,), UNFINISHED, jnp.int32),
        )
        if self.paged:  # one loop per window of the page tables, over the whole pool
            for window in windows:
                n_pages = min(-(-window // self.page_size), pages.shape[1])
                carry = lax.while_loop(
                    functools.partial(cond, window=n_pages * self.page_size),
                    functools.partial(body, window_pages=pages[:, :n_pages]),
                    carry,
                )
            state, steps, toks, lps, slps, emitted, reason = carry
            return self._constrain(state), steps, (toks, lps, slps, emitted, reason)
        for j, window in enumerate(windows):
            state = carry[0]
            if j:  # the previous window's positions back into the cache
                full_kv = _unwindow(full_kv, state.kv)
            state = state._replace(kv=_window(full_kv, window, self.layout))
            carry = lax.while_loop(functools.partial(cond, window=window), body, (state, *carry[1:]))
        state, steps, toks, lps, slps, emitted, reason = carry
        state = state._replace(kv=_unwindow(full_kv, state.kv))
        return self._constrain(state), steps, (toks, lps, slps, emitted, reason)

    def _compact(self, state: SlotState, keep):
        """The slots `keep` `[B2]` as a state of `B2` slots."""
        self.stats.compact_compiles += 1  # runs at trace time only
        # (paged layout: the host passes the state without its pool, which stays as it is)
        return self._constrain(jax.tree.map(lambda x: x[keep], state))

    # -------------------------------------------------------------- host loop
    def run(
        self,
        params,
        requests: Sequence[Request],
        *,
        seed: int,
        eos: Sequence[int],
        stop: Sequence[Sequence[int]],
        schedule: Schedule,
        want_sampling_lp: bool = False,
        pad_id: int = 0,
    ) -> Iterator[Completion]:
        """Generate every request; yields each `Completion` as soon as its request ends.

        `requests` take slots in order; all rows are greedy when every temperature is 0."""
        run = HostLoop(self, params, requests, seed, eos, stop, schedule, want_sampling_lp, pad_id)
        yield from run.loop()


_ENGINES: dict[Any, Engine] = {}
_LOCK = threading.Lock()


def get_engine(
    config: ModelConfig,
    mesh: Mesh | None = None,
    buckets: Buckets | None = None,
    topk_bound: int = DEFAULT_BOUND,
    fuse_projections: bool | None = None,
    cache_layout: str | None = None,
    page_size: int = 16,
    num_pages: int | None = None,
    cache_budget: int | None = None,
) -> Engine:
    """The shared `Engine` for these settings (built on first use; see `Engine`)."""
    key = (config, mesh, buckets or Buckets(), int(topk_bound), fuse_projections, cache_layout)
    if cache_layout == "paged":
        key += (int(page_size), num_pages, cache_budget)
    with _LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = Engine(
                config,
                mesh=mesh,
                buckets=buckets,
                topk_bound=topk_bound,
                fuse_projections=fuse_projections,
                cache_layout=cache_layout,
                page_size=page_size,
                num_pages=num_pages,
                cache_budget=cache_budget,
            )
        return _ENGINES[key]


def mesh_of(params) -> Mesh | None:
    """The mesh the parameters are sharded over (None for single-device arrays)."""
    for leaf in jax.tree.leaves(params):
        sh = getattr(leaf, "sharding", None)
        if isinstance(sh, NamedSharding) and sh.mesh.size > 1:
            return sh.mesh
    return None
