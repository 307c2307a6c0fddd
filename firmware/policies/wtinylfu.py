"""W-TinyLFU (Einziger, Friedman, Manes 2017): a window LRU, a main cache, and a TinyLFU
frequency sketch that decides whether the window's victim replaces the main's victim.

libCacheSim's WTinyLFU, the form checked hit for hit in tests/test_policies_wtinylfu.py:

* New entries join the head of the window (an LRU of trunc(capacity × ``wtinylfu_window``)
  entries, at least one; the main cache holds the rest, M entries).  While the cache
  fills, every entry stays in the window; the first eviction moves window tails into the
  main cache until it is full.
* A reuse in the window moves the entry to the window's head; a reuse in the main cache
  is the main policy's (``wtinylfu_main``): ``slru`` (the published default: probation of
  trunc(M × ``wtinylfu_probation``) and protected of trunc(M × (1 − that)) entries; a
  reuse moves to protected's head, protected's overflow cools its tail to probation's
  head), ``lru`` (to the head) or ``fifo`` (no move).  A new main entry joins the lowest
  segment with room, else probation.
* To evict one entry: take the window's tail w.  If the main cache has room, w moves into
  it and the pass goes on with the next window tail.  Otherwise w is compared with the
  main's victim m (probation's tail, else protected's): w replaces m only if its
  estimated frequency is strictly greater, else w is the victim.  Either way w is counted
  once more in the sketch.  With the window empty, the main's victim goes.
* The sketch (:mod:`kvcxl.firmware.sketch`) counts an entry when it is admitted (after
  the pass that made room for it), on every reuse in the main cache, and when it is
  considered as the window's victim.  After ``wtinylfu_sample`` × M main-cache reuses,
  every counter is halved.

Where libCacheSim departs from the published algorithm (followed here; docs/policy.md):
reuses in the window are not counted; the window's victim is counted again each time it
is considered; the reset period counts main-cache reuses only (the paper counts every
access); there is no doorkeeper and counters are 32-bit (the paper: 4-bit counters
behind a Bloom filter); one eviction decides one window victim (libCacheSim's source
loops on after an admission, but the 0.3.5 wheel decides one per eviction, measured).

The mains are, for now, those whose victim is a plain read of ordered lists (a victim
chosen without changing state, as the comparison needs): LRU, FIFO and SLRU.  CLOCK,
SIEVE, S3-FIFO and ARC move or clear entries while they look for a victim; their
``select`` computes that walk without changing state (``on_evict`` commits it), which is
how they could serve as mains, not built yet.  The attention policies rank scores the
sketch does not keep.

The victim order has no closed form (it depends on the sketch and on the main's room),
so ``priority`` is the rank in the walk, as for S3-FIFO.
"""

from __future__ import annotations

import math
from collections import Counter, deque

import numpy as np
from numpy.typing import NDArray

from ..params import REAL, Param, in_range, one_of
from ..sketch import FrequencySketch, counters_per_element, hashes_for
from .base import Tick, register
from .queued import NONE, QueuePolicy

WINDOW, PROBATION, PROTECTED = 1, 2, 3
MAINS = ("slru", "lru", "fifo")  # main policies with a read-only victim (docstring)
_DEFAULT_ERROR = 0.001  # libCacheSim's sketch: 0.1 % false positives (10 hashes)

WTINYLFU_WINDOW = Param(
    "(0, 1)",
    in_range(0.0, 1.0, lo_open=True, hi_open=True),
    REAL,
    "W-TinyLFU's window LRU share of the capacity: trunc(capacity × share) entries, at "
    "least 1 (libCacheSim window-size); larger favours recency (bursts of new entries "
    "survive), smaller favours frequency.",
    default=0.01,
)
WTINYLFU_MAIN = Param(
    "'slru', 'lru' or 'fifo'",
    one_of(*MAINS),
    str,
    "W-TinyLFU's main cache behind the admission filter: 'slru' (probation + protected, "
    "the published default), 'lru' or 'fifo' (libCacheSim main-cache).",
    default="slru",
)
WTINYLFU_PROBATION = Param(
    "(0, 1)",
    in_range(0.0, 1.0, lo_open=True, hi_open=True),
    REAL,
    "W-TinyLFU's SLRU main: the probation segment's share of the main cache (protected "
    "holds the rest; libCacheSim seg-size=1:4); larger protects fewer reused entries.",
    default=0.2,
)
WTINYLFU_SKETCH_WIDTH = Param(
    "(0, 1048576] counters per entry",
    in_range(0.0, float(1 << 20), lo_open=True),
    REAL,
    "W-TinyLFU's sketch counters per main-cache entry (libCacheSim: −ln 0.001 / ln²2); "
    "wider: fewer collisions, estimates nearer the true counts.",
    default=counters_per_element(_DEFAULT_ERROR),
)
WTINYLFU_SKETCH_HASHES = Param(
    "[1, 32] hashes",
    in_range(1, 32),
    int,
    "W-TinyLFU's counters per id in the sketch, the estimate their minimum; more (up to "
    "ln 2 × width) overestimate less.",
    default=hashes_for(counters_per_element(_DEFAULT_ERROR)),
)
WTINYLFU_SAMPLE = Param(
    "[1, 2**30] reuses per entry",
    in_range(1, 1 << 30),
    int,
    "W-TinyLFU's reset period: every counter halves after sample × main entries "
    "main-cache reuses (libCacheSim 32); larger remembers old popularity longer.",
    default=32,
)


@register
class WTinyLfuPolicy(QueuePolicy):
    name = "wtinylfu"
    summary = "W-TinyLFU: window LRU + SLRU/LRU/FIFO main, TinyLFU sketch admission"
    n_queues = 3
    parameters = {
        "wtinylfu_window": WTINYLFU_WINDOW,
        "wtinylfu_main": WTINYLFU_MAIN,
        "wtinylfu_probation": WTINYLFU_PROBATION,
        "wtinylfu_sketch_width": WTINYLFU_SKETCH_WIDTH,
        "wtinylfu_sketch_hashes": WTINYLFU_SKETCH_HASHES,
        "wtinylfu_sample": WTINYLFU_SAMPLE,
    }

    def set_capacity(self, capacity: int) -> None:
        super().set_capacity(capacity)
        p = self.params
        if p.wtinylfu_main not in MAINS:  # (the Param refuses it first; a direct caller)
            raise ValueError(f"wtinylfu_main = {p.wtinylfu_main!r}: choose from {MAINS}")
        # trunc, as libCacheSim's integer cast; where that is 0 (libCacheSim then admits
        # nothing at all) the window holds one entry
        window = min(capacity, max(1, int(capacity * p.wtinylfu_window)))
        self.main_share = capacity - window
        if p.wtinylfu_main == "slru":
            # libCacheSim's segment sizes: trunc(share × M) each (their sum may fall short
            # of M; probation then holds the rest without a hit evicting, docs/policy.md)
            self.shares = (
                int(p.wtinylfu_probation * self.main_share),
                int((1 - p.wtinylfu_probation) * self.main_share),
            )
        else:
            self.shares = (self.main_share, 0)
        n = max(1, math.ceil(p.wtinylfu_sketch_width * self.main_share))
        self.sketch = FrequencySketch(n, p.wtinylfu_sketch_hashes)
        self.period = p.wtinylfu_sample * self.main_share
        self.reuses = 0  # main-cache reuses since the last halving
        self._pending: list[int] = []  # admitted, counted after the pass (libCacheSim order)
        self._pending_time = -1

    # --- the sketch's order of events ------------------------------------------------
    def _flush(self) -> None:
        self.sketch.add_all(self._pending)
        self._pending = []

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        self._flush()
        super().on_insert(ids, tick)
        self._pending = self._arriving.tolist()
        self._pending_time = tick.time

    def place(self, ids: NDArray) -> None:
        for i in ids.tolist():
            self.push(i, WINDOW)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        if tick.time != self._pending_time:  # arrivals of an earlier batch
            self._flush()
        ids = np.asarray(ids, dtype=np.int64)
        main = self.params.wtinylfu_main
        for i in ids[self.first_reads(ids)].tolist():  # in read order
            q = int(self.queue[i])
            if q == WINDOW:
                self.unlink(i)
                self.push(i, WINDOW)
                continue
            if main == "slru":
                self.unlink(i)
                self.push(i, PROTECTED)
                while self.count[PROTECTED] > self.shares[1]:
                    t = self.tail[PROTECTED]
                    self.unlink(t)
                    self.push(t, PROBATION)
            elif main == "lru":
                self.unlink(i)
                self.push(i, PROBATION)
            self.sketch.add(i)
            self.reuses += 1
            if self.reuses >= self.period:
                self.reuses = 0
                self.sketch.halve()

    def on_evict(self, ids: NDArray, tick: Tick) -> None:
        plan = self._plan
        super().on_evict(ids, tick)
        if plan is not None and np.array_equal(np.sort(ids), plan["victims"]):
            self.sketch.add_all(plan["counted"])
        self._flush()  # the batch's arrivals, after the pass (libCacheSim inserts last)

    # --- the pass --------------------------------------------------------------------
    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        window = self.cursor(WINDOW)
        # Each main segment as the walk sees it: its offered entries tail first, then those
        # the walk moved to its head (in the order they arrived there).
        cur = {q: self.cursor(q) for q in (PROBATION, PROTECTED)}
        extra: dict[int, deque[int]] = {PROBATION: deque(), PROTECTED: deque()}
        heads = {PROBATION: NONE, PROTECTED: NONE}  # each segment's next offered entry
        n = {q: self.live(q) for q in (PROBATION, PROTECTED)}
        pending: Counter[int] = Counter()  # this walk's sketch increments, by counter index
        victims: list[int] = []
        moved: list[tuple[int, int]] = []
        counted: list[int] = []

        def main_victim(pop: bool) -> int:
            """The main's victim: probation's tail, else protected's (NONE: none offered)."""
            for q in (PROBATION, PROTECTED):
                if heads[q] == NONE:
                    heads[q] = next(cur[q], NONE)
                    if heads[q] == NONE and extra[q]:
                        heads[q] = extra[q].popleft()
                i = heads[q]
                if i != NONE:
                    if pop:
                        heads[q] = NONE
                        n[q] -= 1
                    return i
            return NONE

        def to_main(i: int) -> None:
            p, s = self.shares
            q = PROBATION if n[PROBATION] < p else PROTECTED if n[PROTECTED] < s else PROBATION
            extra[q].append(i)
            n[q] += 1
            moved.append((i, q))

        def count(i: int) -> None:
            counted.append(i)
            pending.update(self.sketch.indices(i))

        while len(victims) < k:
            w = next(window, NONE)
            if w == NONE:
                victims.append(main_victim(pop=True))
                continue
            if n[PROBATION] + n[PROTECTED] < self.main_share:
                to_main(w)
            else:
                m = main_victim(pop=False)
                est = self.sketch.estimate
                if m != NONE and est(w, pending) > est(m, pending):
                    victims.append(main_victim(pop=True))
                    to_main(w)
                else:
                    victims.append(w)
            count(w)
        return np.asarray(victims, np.int64), {"moved": moved, "counted": counted}

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return self.walk_rank(ids, tick)
