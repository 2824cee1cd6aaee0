"""Host bookkeeping of the paged KV cache: which pages of the pool each slot's row holds.

The device holds one pool of `P` pages of `page_size` positions per layer
(`marljax.models.decode.init_page_pool`); the host holds, between the compiled calls of one
`Engine.run`:

- a page table per slot `[slots, M]` int32 (entry `P`: no page), passed to each insert and
  decode call;
- a reference count per page and a free list: a page is free when no table refers to it. The
  full pages of a prompt prefix that several rows share (the `n` samples of a prompt, a
  refinement turn on an earlier answer) are referenced by each row's table, not copied; a row
  that shares a prefix ending inside a page gets its own copy of that one page (copy on write:
  it writes its next positions there);
- pages allocated as rows grow: a prompt's pages when it is inserted, then before each decode
  call the pages its next `chunk` positions need (so memory follows the rows' actual lengths,
  not the cache capacity); a finished row's pages stay with its slot as a cache for later
  prefixes (`Schedule.share_prefixes`) and are reclaimed, least recently finished first, when
  pages run out;
- admission by reservation: a request is admitted only when the pool can still hold the worst
  case of every admitted row (prompt + budget) besides its own, so a row never runs out of pages
  mid-decode (there is no preemption); otherwise it waits in the queue until rows finish.
"""

from __future__ import annotations

import numpy as np


def pages_for(positions: int, page_size: int) -> int:
    """Pages that hold `positions` positions."""
    return -(-int(positions) // page_size)


class PagePool:
    """Page tables, reference counts and the free list of one call's pool (see the module)."""

    def __init__(self, num_pages: int, page_size: int, slots: int, max_pages: int):
        self.P, self.page_size, self.M = int(num_pages), int(page_size), int(max_pages)
        self.ref = np.zeros(self.P, np.int32)
        self.free = list(range(self.P - 1, -1, -1))  # a stack: the lowest page first
        self.table = np.full((slots, self.M), self.P, np.int32)
        self.count = np.zeros(slots, np.int32)  # pages in each slot's table
        self.worst = np.zeros(slots, np.int32)  # pages a busy row may hold at most (0: idle)
        self.finished_at = np.zeros(slots, np.int64)  # when the slot's row ended (for eviction)
        self.clock = 0
        self.peak = 0  # pages in use at most during the call
        self.evicted: list[int] = []  # idle slots whose cached pages were reclaimed (host resets them)

    # ----------------------------------------------------------------- counts
    @property
    def in_use(self) -> int:
        return self.P - len(self.free)

    def outstanding(self) -> int:
        """Pages the busy rows may still allocate."""
        return int(np.maximum(self.worst - self.count, 0)[self.worst > 0].sum())

    def reclaimable(self, protected: np.ndarray) -> int:
        """Pages held only by idle slots' caches, not in `protected` `[P]` bool."""
        idle = np.flatnonzero((self.worst == 0) & (self.count > 0))
        if not idle.size:
            return 0
        held = np.concatenate([self.table[s, : self.count[s]] for s in idle])
        idle_refs = np.bincount(held, minlength=self.P)
        return int(((idle_refs == self.ref) & (self.ref > 0) & ~protected).sum())

    def available(self, protected: np.ndarray) -> int:
        """Pages a new row can be promised: free and reclaimable, less the busy rows' reservations."""
        return len(self.free) + self.reclaimable(protected) - self.outstanding()

    # -------------------------------------------------------------- changes
    def release(self, slot: int) -> None:
        """Drop slot `slot`'s references (its pages go free when no other table holds them)."""
        for p in self.table[slot, : self.count[slot]]:
            self.unref(int(p))
        self.table[slot] = self.P
        self.count[slot] = 0
        self.worst[slot] = 0

    def unref(self, page: int) -> None:
        self.ref[page] -= 1
        if self.ref[page] == 0:
            self.free.append(int(page))

    def alloc(self, n: int, keep: frozenset = frozenset()) -> list[int]:
        """`n` fresh pages (reference 1), reclaiming idle slots' caches (but those of `keep`)
        least recently finished first when the free list is short."""
        while len(self.free) < n:
            idle = [
                s
                for s in range(len(self.count))
                if self.worst[s] == 0 and self.count[s] > 0 and s not in keep
            ]
            if not idle:
                raise RuntimeError(f"page pool exhausted: {n} pages asked, {len(self.free)} free (a bug)")
            s = min(idle, key=lambda s: self.finished_at[s])
            self.release(s)
            self.evicted.append(s)
        pages = [self.free.pop() for _ in range(n)]
        self.ref[pages] = 1
        self.peak = max(self.peak, self.in_use)
        return pages

    def admit(self, rows: list[tuple[int, int, int, int, int]]) -> list[tuple[np.ndarray, int, int]]:
        """Page tables for new rows `(slot, source slot, shared positions, prompt positions, worst
        pages)`: the source's full pages of the shared prefix by reference, a fresh copy of its
        partial last page (copy on write), fresh pages for the rest; each slot's old pages are
        released first. Per row: (its table, the copy-on-write source page or -1, the fresh page it is
        copied into). A source page stays referenced until the caller has made the copy and `unref`s it.
        """
        shared = []
        for _, src, n, _, _ in rows:  # references first: a source may be a slot of these rows
            full = self.table[src, : n // self.page_size].copy()
            self.ref[full] += 1
            cow = int(self.table[src, n // self.page_size]) if n % self.page_size else -1
            if cow >= 0:
                self.ref[cow] += 1
            shared.append((full, cow))
        for slot, *_ in rows:
            self.release(slot)
        out = []
        for (slot, _, _, positions, worst), (full, cow) in zip(rows, shared):
            fresh = self.alloc(pages_for(positions, self.page_size) - len(full))
            c = len(full) + len(fresh)
            self.table[slot, :c] = np.concatenate([full, fresh])
            self.count[slot], self.worst[slot] = c, worst
            out.append((self.table[slot].copy(), cow, fresh[0] if cow >= 0 else self.P))
        return out

    def grow(self, slot: int, positions: int) -> None:
        """Give slot `slot` the pages for its first `positions` positions."""
        need = min(pages_for(positions, self.page_size), self.M) - int(self.count[slot])
        if need > 0:
            c = int(self.count[slot])
            self.table[slot, c : c + need] = self.alloc(need)
            self.count[slot] = c + need

    def finish(self, slot: int) -> None:
        """The slot's row ended: no reservation left; its pages stay as an idle cache."""
        self.worst[slot] = 0
        self.clock += 1
        self.finished_at[slot] = self.clock

    def permute(self, keep: list[int]) -> None:
        """Keep the slots `keep` (in that order), releasing the others' pages."""
        for s in set(range(len(self.count))) - set(keep):
            self.release(s)
        self.table, self.count = self.table[keep], self.count[keep]
        self.worst, self.finished_at = self.worst[keep], self.finished_at[keep]
