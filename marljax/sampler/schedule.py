"""The host side of continuous batching: what a call asks for and how its requests share the slots.

`Request` and `Completion` are one completion asked for and delivered; `Schedule` and `Buckets`
say how requests share the decode slots and which shapes compile; `HostLoop` is one
`Engine.run` call on the host: it queues requests, fills free slots through the engine's
compiled `insert`, runs `decode` calls, streams each request's completion as soon as it ends,
halves the slot batch in the tail (`compact`) and tracks what each slot's cache holds, so a new
prompt can copy a prefix another slot computed. With the paged cache it also keeps the page
tables (`marljax.sampler.pages.PagePool`): pages for each row's next chunk before a decode call,
prefix pages referenced instead of copied, requests admitted only while the pool can promise
them their pages. The compiled programs are in `marljax.sampler.engine`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from marljax.sampler.pages import PagePool, pages_for

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


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Shape buckets. `None` sizes mean powers of two from the minimum.

    prompt: prompt lengths (the cache holds the longest prompt's bucket plus the new-token
    bucket); batch: slot counts (rounded up to a multiple of the mesh's data-parallel size);
    new_tokens: the per-request token budget; stop: (number of stop sequences, their length);
    min_window: the smallest decode window (cache positions a decode step reads); None: every
    step reads the whole cache, one window (`Engine.window`).
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
    min_window: int | None = 64


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How requests share the decode slots.

    slots: decode slots at most (the cache is allocated for these); more requests wait in a
      queue and take a slot as soon as one frees.
    chunk: decode steps per device call at most while requests wait (the host refills slots
      between calls).
    idle_chunk: decode steps per call at most once no request waits: the host has nothing to
      refill, so fewer, longer calls (the call's cache window covers them).
    refill_fraction: with requests waiting, a call returns once this fraction of the slots is
      free (at least one slot), so finished rows are replaced without waiting for the others.
    shrink: fit the slot batch to the work: a call of fewer requests than `slots` gets as many
      slots as it has requests (bucketed), and once no request waits and at most half the slots
      are busy, the busy rows move to a smaller slot batch (a power of two, at least
      `min_slots`). On a CPU a step costs about in proportion to its rows; on an accelerator
      small batches cost about the same, and each slot count compiles its own programs. Off,
      every call decodes `slots` rows.
    share_prefixes: a new request copies the longest prefix of its prompt that some slot's
      cache holds and prefills only the rest.
    min_shared_prefix: a request waits for a second insert call (after the first call of the
      same fill) only to copy a prefix of at least this many tokens from a request of the first
      call; a shorter prefix is prefilled again, which costs less than another call.
    """

    slots: int = 64
    chunk: int = 32
    idle_chunk: int = 128
    refill_fraction: float = 0.125
    shrink: bool = True
    min_slots: int = 4
    share_prefixes: bool = True
    min_shared_prefix: int = 16

    def __post_init__(self):
        if (
            min(self.slots, self.chunk, self.idle_chunk, self.min_slots) < 1
            or not 0 < self.refill_fraction <= 1
        ):
            raise ValueError(
                f"bad schedule {self}: slots, chunk, idle_chunk, min_slots >= 1, 0 < refill_fraction <= 1"
            )


class Tables(NamedTuple):
    """A call's shared stopping rules (traced)."""

    eos: jax.Array  # [E] int32, -1 = unused
    stop_seqs: jax.Array  # [NS, Ls] int32, right-aligned
    stop_valid: jax.Array  # [NS, Ls] bool
    stop_active: jax.Array  # [NS] bool
    seed: jax.Array  # [] uint32


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one prompt is sampled, from a run's config (`SamplerConfig.sampling`) to its `Request`.

    max_new_tokens: tokens to generate at most. temperature: 0 means greedy (argmax), else the
    logits are divided by it. top_p: nucleus mass in (0, 1], 1 disables; top_k: 0 disables (order
    and semantics as transformers: `marljax.sampler.sampling`). stop: strings that end a completion
    (kept in it); the caller tokenizes them, one set per sampler call (`generate(stop=)`).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        is_int = (int, np.integer)
        for ok, why in (
            (
                isinstance(self.max_new_tokens, is_int) and self.max_new_tokens >= 1,
                "max_new_tokens must be an int >= 1",
            ),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (isinstance(self.top_k, is_int) and self.top_k >= 0, "top_k must be an int >= 0"),
        ):
            if not ok:
                raise ValueError(f"{why}, got {self}")


@dataclasses.dataclass
class Request:
    """One completion to generate: its prompt ids, sampling settings and adapter."""

    prompt: np.ndarray
    sampling: SamplingParams
    adapter: int = 0  # which LoRA adapter of the parameters (`marljax.models.lora`) samples it


@dataclasses.dataclass
class Completion:
    """A finished request (index into the call's requests)."""

    index: int
    tokens: np.ndarray  # [n] int32, a final EOS / stop sequence included
    logprobs: np.ndarray  # [n] float32 under softmax(logits / T), no truncation
    sampling_logprobs: np.ndarray | None  # [n] under the sampled distribution
    finish_reason: str


class HostLoop:
    """The host side of one `Engine.run` call: queue, slot bookkeeping, outputs."""

    def __init__(self, engine, params, requests, seed, eos, stop, schedule, want_sampling_lp, pad_id):
        e = self.engine = engine
        self.requests = list(requests)
        self.schedule, self.want_slp, self.pad_id = schedule, bool(want_sampling_lp), int(pad_id)
        settings = [r.sampling for r in self.requests]
        self.greedy = all(s.temperature == 0 for s in settings)
        self.truncate = any(s.top_k > 0 or s.top_p < 1 for s in settings)
        N = len(self.requests)
        self.capacity = e.prompt_bucket(max(len(r.prompt) for r in self.requests)) + e.new_tokens_bucket(
            max(s.max_new_tokens for s in settings)
        )
        self.slots = e.batch_bucket(min(N, schedule.slots) if schedule.shrink else schedule.slots)
        self.paged = e.paged
        if self.paged:  # whole pages of positions; the pool and its tables (marljax.sampler.pages)
            ps = e.page_size
            self.capacity = pages_for(self.capacity, ps) * ps
            P = e.pool_pages(self.slots, self.capacity)
            worst = max(self._worst(r) for r in range(N))
            if worst > P:
                raise ValueError(
                    f"the page pool ({P} pages of {ps}) cannot hold one request of {worst} pages "
                    "(prompt + max_new_tokens): give the engine more pages"
                )
            self.pool = PagePool(P, ps, self.slots, self.capacity // ps)
            e.stats.pool_pages, e.stats.peak_pages = P, 0
            self.page_short = False  # the latest fill left requests waiting for pages
        b = e.buckets
        E = next_bucket(max(len(eos), 1), b.min_eos)
        eos_arr = np.full((E,), -1, np.int32)
        eos_arr[: len(eos)] = eos
        NS = next_bucket(max(len(stop), 1), b.min_stop)
        Ls = next_bucket(max([len(s) for s in stop] + [1]), b.min_stop_len)
        seqs = np.full((NS, Ls), -2, np.int32)
        valid = np.zeros((NS, Ls), bool)
        for j, s in enumerate(stop):
            seqs[j, Ls - len(s) :] = s
            valid[j, Ls - len(s) :] = True
        self.tables = Tables(
            eos=jnp.asarray(eos_arr),
            stop_seqs=jnp.asarray(seqs),
            stop_valid=jnp.asarray(valid),
            stop_active=jnp.asarray(np.arange(NS) < len(stop)),
            seed=jnp.asarray(seed, jnp.uint32),
        )
        self.weights = e.weights(params)
        self.state = e.empty_state(self.slots, self.capacity, Ls)
        e.stats.cache_bytes = e.cache_bytes(self.slots, self.capacity)
        e.stats.peak_slots = max(e.stats.peak_slots, self.slots)
        self.queue = collections.deque(range(N))
        self.slot_request = [-1] * self.slots  # the request a slot serves, -1 when free
        self.slot_pos = [0] * self.slots  # host copy of each slot's write position
        self.contents: list[np.ndarray] = [np.zeros((0,), np.int32)] * self.slots  # tokens in each cache
        # the LoRA adapter that computed each cache: a prefix is shared between rows of one adapter only
        self.slot_adapter = [0] * self.slots
        self.out: dict[int, list] = {}  # request -> [tokens, logprobs, sampling logprobs] chunks
        self.finished: list[tuple[int, int]] = []  # (slot, finish reason) ended since the last yield

    # ------------------------------------------------------------- paging
    def _worst(self, r: int) -> int:
        """Pages request `r`'s row holds at most: its prompt and every token fed back."""
        req = self.requests[r]
        return pages_for(len(req.prompt) + req.sampling.max_new_tokens - 1, self.engine.page_size)

    def _sync_pages(self) -> None:
        """Forget the contents of idle slots whose cached pages the pool reclaimed."""
        for s in self.pool.evicted:
            self.contents[s] = np.zeros((0,), np.int32)
        self.pool.evicted = []
        self.engine.stats.peak_pages = max(self.engine.stats.peak_pages, self.pool.peak)

    # ------------------------------------------------------------- insertion
    def _longest_prefix(self, prompt: np.ndarray, candidates) -> tuple[int, int]:
        """(length, source) of the longest common prefix of `prompt` with a candidate's tokens."""
        best, source = 0, -1
        for src, toks in candidates:
            m = min(len(toks), len(prompt))
            if m <= best:
                continue
            diff = np.flatnonzero(toks[:m] != prompt[:m])
            n = int(diff[0]) if diff.size else m
            if n > best:
                best, source = n, src
        return best, source

    def _fill(self) -> None:
        """Put waiting requests into the free slots: one insert call for those whose longest
        shared prefix is in a cache already (or none), then one for those that share more
        with a request of the first call."""
        free = [s for s in range(self.slots) if self.slot_request[s] < 0]
        if not free or not self.queue:
            return
        share = self.schedule.share_prefixes
        cached = [(s, self.contents[s]) for s in range(self.slots) if len(self.contents[s])] if share else []
        first, second = [], []  # (request, slot, copy source, copied length)
        pool = self.pool if self.paged else None
        if pool is not None:
            protected = np.zeros(pool.P, bool)  # cached pages the admitted rows will reference
            promised = 0  # pages promised to the admitted rows
            self.page_short = False
        while free and self.queue:
            r = self.queue[0]
            prompt, adapter = self.requests[r].prompt, self.requests[r].adapter
            limit = len(prompt) - 1  # at least one token runs, for the first token's logits
            n, src = self._longest_prefix(
                prompt, [(s, toks) for s, toks in cached if self.slot_adapter[s] == adapter]
            )
            leaders = [
                (j, self.requests[q].prompt)
                for j, (q, *_) in enumerate(first)
                if share and self.requests[q].adapter == adapter
            ]
            m, lead = self._longest_prefix(prompt, leaders)
            slot = free[0]
            from_leader = min(m, limit)
            if from_leader > min(n, limit) and from_leader >= self.schedule.min_shared_prefix:
                group, entry = second, (r, slot, first[lead][1], from_leader)
            else:
                group, entry = first, (r, slot, src if n else slot, min(n, limit))
            if pool is not None:  # admitted only if the pool can promise the row its worst case
                k = entry[3]
                mine = protected.copy()
                if group is first and k:  # pages of a cache it references (or copies on write)
                    mine[pool.table[entry[2], : pages_for(k, pool.page_size)]] = True
                need = self._worst(r) - k // pool.page_size
                if need > pool.available(mine) - promised:
                    if not (first or second or any(q >= 0 for q in self.slot_request)):
                        raise RuntimeError(f"request {r} does not fit an idle page pool (a bug)")
                    self.page_short = True
                    self.engine.stats.page_waits += 1
                    break
                protected, promised = mine, promised + need
            self.queue.popleft()
            free.pop(0)
            group.append(entry)
        for group in (first, second):
            if group:
                self._insert(group)

    def _insert(self, group) -> None:
        e, N_slots = self.engine, self.slots
        Bn = e.batch_bucket(len(group))
        T = max(len(self.requests[r].prompt) - n for r, _, _, n in group)
        if T > 1:  # (one token: the samples of a prompt after its first, the usual second call)
            T = e.prompt_bucket(T)
        window = e.window(max(len(self.requests[r].prompt) for r, *_ in group), self.capacity)
        slots = np.full((Bn,), N_slots, np.int32)  # out of range: padding rows write nothing
        source = np.zeros((Bn,), np.int32)
        starts = np.zeros((Bn,), np.int32)
        tokens = np.full((Bn, T), self.pad_id, np.int32)
        lengths = np.ones((Bn,), np.int32)
        request = np.zeros((Bn,), np.uint32)
        max_new = np.ones((Bn,), np.int32)
        temperature = np.ones((Bn,), np.float32)
        top_k = np.zeros((Bn,), np.int32)
        top_p = np.ones((Bn,), np.float32)
        adapter = np.zeros((Bn,), np.int32)
        paging, cow = None, []
        if self.paged:
            paging, cow = self._page_rows(group, Bn)
        for j, (r, slot, src, n) in enumerate(group):
            req = self.requests[r]
            rest = req.prompt[n:]
            slots[j], source[j], starts[j] = slot, src, n
            tokens[j, : len(rest)], lengths[j] = rest, len(rest)
            s = req.sampling
            request[j], max_new[j] = r, s.max_new_tokens
            temperature[j], top_k[j], top_p[j] = s.temperature, s.top_k, s.top_p
            adapter[j] = req.adapter
            e.stats.prefill_tokens += len(rest)
            e.stats.shared_tokens += n
        e.stats.insert_calls += 1
        self.state, first = e._insert_jit(
            self.weights,
            self.state,
            self.tables,
            *(
                e._put(x)
                for x in (
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
                )
            ),
            paging,
            window=window,
            greedy=self.greedy,
            truncate=self.truncate,
        )
        for page in cow:  # the copies are made: the sources need not stay
            self.pool.unref(page)
        tok, lp, slp, reason = jax.device_get(first)
        for j, (r, slot, _, _) in enumerate(group):
            prompt = self.requests[r].prompt
            self.slot_request[slot] = r
            self.slot_pos[slot] = len(prompt)
            self.contents[slot] = prompt
            self.slot_adapter[slot] = self.requests[r].adapter
            self.out[r] = [[tok[j : j + 1]], [lp[j : j + 1]], [slp[j : j + 1]]]
            if reason[j] != UNFINISHED:
                self.finished.append((slot, int(reason[j])))

    def _page_rows(self, group, Bn: int):
        """The page tables of `group`'s rows (their slots' old pages released), as the insert
        call takes them, and the copy-on-write source pages (referenced until the call ran)."""
        pool, e = self.pool, self.engine
        admitted = pool.admit(
            [(slot, src, n, len(self.requests[r].prompt), self._worst(r)) for r, slot, src, n in group]
        )
        rows = np.full((Bn, pool.M), pool.P, np.int32)
        cow_src, cow_dst = np.full((Bn,), pool.P, np.int32), np.full((Bn,), pool.P, np.int32)
        for j, ((_, _, _, n), (table, cow, fresh)) in enumerate(zip(group, admitted)):
            rows[j] = table
            if cow >= 0:
                cow_src[j], cow_dst[j] = cow, fresh
            e.stats.shared_pages += n // pool.page_size
            e.stats.cow_pages += int(cow >= 0)
        self._sync_pages()
        paging = tuple(e._put(x) for x in (rows, cow_src, cow_dst))
        return paging, [cow for _, cow, _ in admitted if cow >= 0]

    # ----------------------------------------------------------------- decode
    def _decode(self) -> None:
        e, sched = self.engine, self.schedule
        B = self.slots
        busy = [s for s in range(B) if self.slot_request[s] >= 0]
        waiting = bool(self.queue)
        refill_free = max(1, int(B * sched.refill_fraction)) if waiting else B + 1
        if waiting and self.paged and self.page_short:  # free slots wait for pages: until a row ends
            refill_free = max(refill_free, B - len(busy) + 1)
        can_shrink = sched.shrink and not waiting and self._smaller() < B
        shrink_busy = B // 2 if can_shrink else -1
        reach = max(self.slot_pos[s] for s in busy)
        # while requests wait, one window for `chunk` steps; once none waits, `idle_chunk` steps
        # over the windows they grow through
        chunk = sched.chunk if waiting else sched.idle_chunk
        windows = [e.window(reach + sched.chunk, self.capacity)]
        while windows[-1] < min(reach + chunk, self.capacity):
            windows.append(e.window(windows[-1] + 1, self.capacity))
        pages = None
        if self.paged:  # every busy row gets the pages of its next `chunk` positions
            for s in busy:
                req = self.requests[self.slot_request[s]]
                self.pool.grow(
                    s, min(self.slot_pos[s] + chunk, len(req.prompt) + req.sampling.max_new_tokens - 1)
                )
            self._sync_pages()
            pages = e._put(self.pool.table)
        e.stats.decode_calls += 1
        self.state, steps, outs = e._decode_jit(
            self.weights,
            self.state,
            self.tables,
            jnp.asarray(refill_free, jnp.int32),
            jnp.asarray(shrink_busy, jnp.int32),
            pages,
            windows=tuple(windows),
            chunk=chunk,
            greedy=self.greedy,
            truncate=self.truncate,
            want_sampling_lp=self.want_slp,
            pad_id=self.pad_id,
        )
        steps, (toks, lps, slps, emitted, reason) = jax.device_get((steps, outs))
        steps = int(steps)
        e.stats.decode_steps += steps
        e.stats.slot_steps += steps * B
        for s in busy:
            k = int(emitted[s])
            r = self.slot_request[s]
            self.out[r][0].append(toks[s, :k])
            self.out[r][1].append(lps[s, :k])
            self.out[r][2].append(slps[s, :k] if self.want_slp else lps[s, :0])
            self.slot_pos[s] += k
            if reason[s] != UNFINISHED:
                self.finished.append((s, int(reason[s])))

    def _complete(self) -> Iterator[Completion]:
        for slot, why in self.finished:
            r = self.slot_request[slot]
            toks, lps, slps = (np.concatenate(x) for x in self.out.pop(r))
            # the cache holds the prompt and every generated token but the last
            self.contents[slot] = np.concatenate([self.requests[r].prompt, toks[:-1]]).astype(np.int32)
            self.slot_request[slot] = -1
            if self.paged:  # the row's pages stay as a prefix cache, or go free at once
                self.pool.finish(slot)
                if not self.schedule.share_prefixes:
                    self.pool.release(slot)
                    self.contents[slot] = np.zeros((0,), np.int32)
            self.engine.stats.useful_tokens += len(toks)
            yield Completion(r, toks, lps, slps if self.want_slp else None, REASONS[why])
        self.finished = []

    def _smaller(self, busy: int | None = None) -> int:
        """The slot count for `busy` rows (default half the slots) when shrinking."""
        busy = self.slots // 2 if busy is None else busy
        return self.engine.batch_bucket(max(busy, self.schedule.min_slots))

    def _compact(self) -> None:
        """Move the busy rows to fewer slots (the tail of a call, nothing waiting)."""
        e = self.engine
        busy = [s for s in range(self.slots) if self.slot_request[s] >= 0]
        B2 = self._smaller(len(busy))
        keep = busy + [s for s in range(self.slots) if self.slot_request[s] < 0][: B2 - len(busy)]
        keep_arr = e._put(np.asarray(keep, np.int32))
        if self.paged:  # the pool stays as it is (no copy): the page tables move with the rows
            self.state = e._compact_jit(self.state._replace(kv=()), keep_arr)._replace(kv=self.state.kv)
            self.pool.permute(keep)
        else:
            self.state = e._compact_jit(self.state, keep_arr)
        self.slot_request = [self.slot_request[s] for s in keep]
        self.slot_pos = [self.slot_pos[s] for s in keep]
        self.contents = [self.contents[s] for s in keep]
        self.slot_adapter = [self.slot_adapter[s] for s in keep]
        self.slots = B2

    def loop(self) -> Iterator[Completion]:
        while self.queue or any(r >= 0 for r in self.slot_request):
            if self.queue:
                self._fill()
                yield from self._complete()
                if not any(r >= 0 for r in self.slot_request):
                    continue
            self._decode()
            yield from self._complete()
            busy = sum(r >= 0 for r in self.slot_request)
            if self.schedule.shrink and not self.queue and busy > 0 and self._smaller(busy) < self.slots:
                self._compact()
