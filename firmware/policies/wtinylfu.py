"""W-TinyLFU (Einziger, Friedman, Manes 2017): a window LRU, a main cache, and a TinyLFU
frequency sketch that decides whether the window's victim replaces the main's victim.

libCacheSim's WTinyLFU, the form checked hit for hit in tests/test_policies_wtinylfu.py:

* New entries join the head of the window (an LRU of trunc(capacity × ``wtinylfu_window``)
  entries, at least one; the main cache holds the rest, M entries).  While the cache
  fills, every entry stays in the window; the first eviction moves window tails into the
  main cache until it is full.
* A reuse in the window moves the entry to the window's head; a reuse in the main cache
  is the main policy's own (``wtinylfu_main``).  Three mains live in W-TinyLFU's own
  queues: ``slru`` (the published default: probation of trunc(M × ``wtinylfu_probation``)
  and protected of trunc(M × (1 − that)) entries; a reuse moves to protected's head,
  protected's overflow cools its tail to probation's head; a new main entry joins the
  lowest segment with room, else probation), ``lru`` (to the head) and ``fifo`` (no
  move).  ``clock``, ``sieve``, ``s3fifo`` and ``arc`` are the queue policies of those
  names, an instance of each one's own class with its own parameters
  (:mod:`kvcxl.firmware.policies.main_cache`): a window victim joins by the policy's
  admission rule, a reuse is its ``on_access``, its victim is its walk's first.
* To evict one entry: take the window's tail w.  If the main cache has room, w moves into
  it and the pass goes on with the next window tail.  Otherwise w is compared with the
  main's victim m (probation's tail, else protected's; a queue policy's walk's first
  victim, the walk committed if m leaves): w replaces m only if its
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

Within one pass the main changes as the comparisons go (m leaves, w joins, the next
comparison sees both), yet the walk must not change state: the built-in mains are read
as lists the walk extends (the entries it moved to a segment's head follow that
segment's offered entries); a queue-policy main is played on a clone, which ``on_evict``
adopts when it commits the pass.  libCacheSim's WTinyLFU takes CLOCK, SIEVE and ARC as
mains (equal hit for hit, tests/test_policies_wtinylfu.py; its ARC's ghost case is the
request's, :class:`~kvcxl.firmware.policies.main_cache.ArcMain`) and refuses S3-FIFO,
which is checked against the plain reference instead.  The attention policies rank
scores the sketch does not keep.

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
from .base import CapacityTooSmall, Tick, register
from .main_cache import MAIN_POLICIES, MainCache
from .queued import NONE, WALK_AUDITED, QueuePolicy

WINDOW, PROBATION, PROTECTED = 1, 2, 3
# The mains: SLRU, LRU and FIFO kept in W-TinyLFU's own queues, then the queue policies it
# drives as their own classes (policies/main_cache.py).
MAINS = ("slru", "lru", "fifo", *MAIN_POLICIES)
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
    ", ".join(map(repr, MAINS[:-1])) + f" or {MAINS[-1]!r}",
    one_of(*MAINS),
    str,
    "W-TinyLFU's main cache behind the admission filter: 'slru' (probation + protected, "
    "the published default), 'lru', 'fifo', or the queue policy of that name with its own "
    "parameters (libCacheSim main-cache; it refuses 's3fifo').",
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
    not_audited = (
        "the admission filter compares against the main cache's victim and a shared sketch; "
        + WALK_AUDITED
    )
    summary = "W-TinyLFU: window LRU + a main cache (SLRU, ...), TinyLFU sketch admission"
    n_queues = 3
    main: MainCache | None = None  # a queue policy as the main (else SLRU, LRU or FIFO here)
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
        self.main = None
        if p.wtinylfu_main in MAIN_POLICIES:
            main = MAIN_POLICIES[p.wtinylfu_main](self.config, self.table)
            main.ensure(self.seq.size)
            try:
                main.set_capacity(self.main_share)
            except CapacityTooSmall as e:
                raise CapacityTooSmall(
                    f"wtinylfu: its main cache holds {self.main_share} entries; {e}"
                ) from None
            self.main = main
        n = max(1, math.ceil(p.wtinylfu_sketch_width * self.main_share))
        self.sketch = FrequencySketch(n, p.wtinylfu_sketch_hashes)
        self.period = p.wtinylfu_sample * self.main_share
        self.reuses = 0  # main-cache reuses since the last halving
        self._pending: list[int] = []  # admitted, counted after the pass (libCacheSim order)
        self._pending_time = -1

    def ensure(self, n: int) -> None:
        super().ensure(n)
        if self.main is not None:
            self.main.ensure(n)

    # --- the sketch's order of events ------------------------------------------------
    def _flush(self) -> None:
        self.sketch.add_all(self._pending)
        self._pending = []

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        self._flush()
        if self.main is not None:
            self.main.admitted(np.sort(np.asarray(ids, dtype=np.int64)))
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
        reuse = np.flatnonzero(self.first_reads(ids))
        in_main: list[int] = []  # positions in ids of the reuses in a queue-policy main
        for j, i in zip(reuse.tolist(), ids[reuse].tolist(), strict=True):  # in read order
            q = int(self.queue[i])
            if q == WINDOW:
                self.unlink(i)
                self.push(i, WINDOW)
                continue
            if self.main is not None:
                in_main.append(j)
            elif main == "slru":
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
        if in_main:  # the main policy's own reuse, in read order
            assert self.main is not None
            self.main.on_access(ids[in_main], np.asarray(weights)[in_main], tick)

    def on_evict(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        plan = self._plan
        committed = plan is not None and np.array_equal(np.sort(ids), plan["victims"])
        if self.main is not None and not committed:
            # not this pass's walk (a placement demotion): the main just lets them go
            self.main.on_evict(ids[self.main.queue[ids] != 0], tick)
        super().on_evict(ids, tick)
        if committed:
            self.sketch.add_all(plan["counted"])
        self._flush()  # the batch's arrivals, after the pass (libCacheSim inserts last)

    def commit(self, plan: dict) -> None:
        main = plan.get("main")
        if main is None:
            super().commit(plan)
            return
        for i, _ in plan["moved"]:  # out of the window: the main (now the walk's) has them
            self.unlink(i)
        self.main = main

    # --- the pass --------------------------------------------------------------------
    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        if self.main is not None:
            return self._walk_main(k, tick)
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

    def _walk_main(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        """The walk with a queue policy as the main: the same decisions, the main's part
        played on a clone of it (policies/main_cache.py), which the commit adopts."""
        assert self.main is not None
        main = self.main.clone()
        main._ok = self._ok.copy()  # the offered entries (the arriving are in the window)
        window = self.cursor(WINDOW)
        n_main = main.members()
        members = np.flatnonzero(main.queue)
        n_offered = int(np.count_nonzero(main._ok[members]))  # the main's that may leave
        pending: Counter[int] = Counter()
        victims: list[int] = []
        moved: list[tuple[int, int]] = []
        counted: list[int] = []
        peeked: tuple[int, dict] | None = None  # the main's victim while the main is unchanged

        def main_victim() -> tuple[int, dict]:
            nonlocal peeked
            if peeked is None:
                peeked = main.peek(tick)
            return peeked

        def pop() -> None:
            nonlocal peeked, n_offered
            m, plan = main_victim()
            main.pop(m, plan, tick)
            victims.append(m)
            n_offered -= 1
            peeked = None

        def join(w: int) -> None:
            nonlocal peeked, n_offered
            main.join(w, tick)
            moved.append((w, 0))
            n_offered += 1  # (offered: it came from the window's offered entries)
            peeked = None

        while len(victims) < k:
            w = next(window, NONE)
            if w == NONE:
                pop()
                n_main -= 1
                continue
            if n_main < self.main_share:
                join(w)
                n_main += 1
            else:
                est = self.sketch.estimate
                if n_offered and est(w, pending) > est(main_victim()[0], pending):
                    pop()
                    join(w)
                else:
                    victims.append(w)
            counted.append(w)
            pending.update(self.sketch.indices(w))
        main._ok = np.zeros_like(main._ok)
        return np.asarray(victims, np.int64), {"moved": moved, "counted": counted, "main": main}

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return self.walk_rank(ids, tick)
