"""Plain CLOCK, SIEVE, S3-FIFO, SLRU, ARC and W-TinyLFU for tests/reference_engine.py.

Written from docs/policy.md ("Queue policies", the S3-FIFO, SLRU, ARC and W-TinyLFU
paragraphs and their parameter table) and docs/simulator.md ("Replay, exactly"), not from
``kvcxl.firmware``: queues are Python lists, oldest (tail) first; a walk runs over a
copy and simply rewrites the lists.

The batch rules the docs give, as used here:

* an entry's first read after it became resident is its admission read (no bit, no
  counter, no move); later reads are reuses;
* the entries an operation (a read batch or a write) admitted are *arriving*; during an
  eviction walk they are in no queue, and afterwards they join the heads, behind the
  entries the walk moved, in ascending id order; if the batch alone overflows, they are
  the last victims, lowest id first;
* entries not offered (pinned, in the batch) are skipped by a walk and keep their place.

READING: an admitted entry joins its queue when it is admitted (ascending id order), so
that the batch's reads find it there; when the batch then overflows it is taken out for
the walk and placed again after it, by the placement rule at that moment (SLRU's "lowest
segment with room", S3-FIFO's small-full rule, ARC's case).
READING: an arriving entry evicted because the batch alone overflows leaves no ghost
(S3-FIFO, ARC): ghosts are what the walk evicts.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from typing import Any

from kvcxl.firmware.sketch import SEED_A, SEED_B, xxh64

QUEUE_POLICIES = ("clock", "sieve", "s3fifo", "slru", "arc", "wtinylfu")


class QueueRef:
    """Common bookkeeping: fresh (admission read pending) and the arriving entries."""

    def __init__(self, capacity: int, cfg: Any) -> None:
        self.cap = capacity
        self.cfg = cfg
        self.fresh: set[int] = set()
        self.arriving: list[int] = []

    # the policy's own parts
    def place(self, i: int) -> None:
        raise NotImplementedError

    def unplace(self, i: int) -> None:
        raise NotImplementedError

    def reuse(self, i: int) -> None:
        raise NotImplementedError

    def walk(self, offered: set[int], k: int) -> list[int]:
        raise NotImplementedError

    def gone(self, i: int) -> None:
        """Entry ``i`` left the cache (its per-entry state goes)."""

    def evicted(self, victims: list[int]) -> None:
        """The pass is over (victims chosen), before the arrivals join their queues."""

    # the engine's calls
    def admit(self, ids: list[int]) -> None:
        self.arriving = sorted(ids)
        for i in self.arriving:
            self.fresh.add(i)
            self.place(i)

    def read(self, i: int) -> None:
        if i in self.fresh:
            self.fresh.discard(i)  # the admission read
        else:
            self.reuse(i)

    def evict(self, offered: set[int], k: int) -> list[int]:
        arriving = [i for i in self.arriving if i in offered]
        for i in self.arriving:
            self.unplace(i)
        queued = offered - set(self.arriving)
        victims = self.walk(queued, min(k, len(queued)))
        victims += arriving[: k - len(victims)]
        self.evicted(victims)
        for v in victims:
            self.fresh.discard(v)
            self.gone(v)
        for i in self.arriving:
            if i not in victims:
                self.place(i)
        self.arriving = []
        return victims

    def end_op(self) -> None:
        self.arriving = []


def _out(q: list[int], i: int) -> None:
    if i in q:
        q.remove(i)


class ClockRef(QueueRef):
    """docs/policy.md: one FIFO; a reuse adds one up to 2**clock_bits − 1; the tail with a
    counter above zero loses one and moves to the head, at zero it is the victim."""

    def __init__(self, capacity: int, cfg: Any) -> None:
        super().__init__(capacity, cfg)
        self.q: list[int] = []
        self.ref: dict[int, int] = {}
        self.top = (1 << int(cfg.param("clock_bits"))) - 1

    def place(self, i: int) -> None:
        self.ref.setdefault(i, 0)
        self.q.append(i)

    def unplace(self, i: int) -> None:
        _out(self.q, i)

    def reuse(self, i: int) -> None:
        self.ref[i] = min(self.ref[i] + 1, self.top)

    def walk(self, offered: set[int], k: int) -> list[int]:
        q: list[int | None] = list(self.q)
        victims: list[int] = []
        pos = 0
        while len(victims) < k:
            e = q[pos]
            pos += 1
            if e is None or e not in offered:
                continue
            q[pos - 1] = None
            if self.ref[e] > 0:
                self.ref[e] -= 1
                q.append(e)  # to the head
            else:
                victims.append(e)
        self.q = [e for e in q if e is not None]
        return victims

    def gone(self, i: int) -> None:
        self.ref.pop(i, None)


class SieveRef(QueueRef):
    """docs/policy.md: one FIFO, a visited bit, a hand that moves from the tail toward the
    head, clearing visited entries and stopping just after the unvisited victim; past the
    head it wraps to the tail; new entries land at the head."""

    def __init__(self, capacity: int, cfg: Any) -> None:
        super().__init__(capacity, cfg)
        self.q: list[int] = []
        self.visited: set[int] = set()
        self.hand: int | None = None  # the entry the next look starts at (None: the tail)

    def place(self, i: int) -> None:
        self.q.append(i)

    def unplace(self, i: int) -> None:
        _out(self.q, i)

    def reuse(self, i: int) -> None:
        self.visited.add(i)

    def walk(self, offered: set[int], k: int) -> list[int]:
        victims: list[int] = []
        if k == 0:
            return victims
        q = self.q
        pos = 0 if self.hand is None else q.index(self.hand)
        while len(victims) < k:
            if pos == len(q):
                pos = 0  # wrap to the tail
            e = q[pos]
            pos += 1
            if e not in offered or e in victims:
                continue
            if e in self.visited:
                self.visited.discard(e)
            else:
                victims.append(e)
        # the hand stops just after the last victim (on the queue without the victims)
        after = [e for e in q[pos:] if e not in victims]
        self.q = [e for e in q if e not in victims]
        self.hand = after[0] if after else None
        return victims

    def gone(self, i: int) -> None:
        self.visited.discard(i)


class S3FifoRef(QueueRef):
    """docs/policy.md, S3-FIFO (libCacheSim 0.3.5's): small and main FIFOs, a ghost of ids."""

    def __init__(self, capacity: int, cfg: Any) -> None:
        super().__init__(capacity, cfg)
        ratio = float(cfg.param("s3fifo_small_ratio"))
        self.small_share = capacity * ratio
        self.main_share = capacity - self.small_share
        self.ghost_len = int(capacity * float(cfg.param("s3fifo_ghost_ratio")))
        self.threshold = int(cfg.param("s3fifo_move_threshold"))
        self.small: list[int] = []
        self.main: list[int] = []
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}
        self.to_main: set[int] = set()  # arrivals whose id was in the ghost
        self.evicted_once = False

    def admit(self, ids: list[int]) -> None:
        self.to_main = set()
        for i in sorted(ids):
            if i in self.ghost:
                del self.ghost[i]
                self.to_main.add(i)
        super().admit(ids)

    def place(self, i: int) -> None:
        self.freq[i] = 0
        full = not self.evicted_once and len(self.small) >= self.small_share
        (self.main if i in self.to_main or full else self.small).append(i)

    def unplace(self, i: int) -> None:
        _out(self.small, i)
        _out(self.main, i)

    def reuse(self, i: int) -> None:
        self.freq[i] += 1

    def walk(self, offered: set[int], k: int) -> list[int]:
        victims: list[int] = []
        while len(victims) < k:
            small_offers = [e for e in self.small if e in offered]
            main_offers = [e for e in self.main if e in offered]
            # a queue that offers nothing is passed over
            if (len(self.main) > self.main_share or not small_offers) and main_offers:
                e = main_offers[0]
                self.main.remove(e)
                if self.freq[e] >= 1:
                    self.freq[e] = min(self.freq[e], 3) - 1
                    self.main.append(e)
                else:
                    victims.append(e)
                continue
            for e in small_offers:  # small's tail; moves go on in small until a victim
                self.small.remove(e)
                if self.freq[e] >= self.threshold:
                    self.freq[e] = 0
                    self.main.append(e)
                else:
                    victims.append(e)
                    if self.ghost_len > 0 and e not in self.ghost:
                        self.ghost[e] = None
                        if len(self.ghost) > self.ghost_len:
                            self.ghost.popitem(last=False)
                    break
        return victims

    def evicted(self, victims: list[int]) -> None:
        self.evicted_once = self.evicted_once or bool(victims)

    def gone(self, i: int) -> None:
        self.freq.pop(i, None)


class SlruRef(QueueRef):
    """docs/policy.md, SLRU: n LRU segments of capacity / n; a new entry joins the lowest
    segment with room (else segment 0); a reuse moves one segment up, over-full segments
    cool their tail to the one below, cascading; the victim is the lowest segment's tail."""

    def __init__(self, capacity: int, cfg: Any) -> None:
        super().__init__(capacity, cfg)
        self.n = int(cfg.param("slru_segments"))
        self.share = capacity / self.n
        self.seg: list[list[int]] = [[] for _ in range(self.n)]

    def _where(self, i: int) -> int:
        return next(s for s in range(self.n) if i in self.seg[s])

    def place(self, i: int) -> None:
        s = next((s for s in range(self.n) if len(self.seg[s]) + 1 <= self.share), 0)
        self.seg[s].append(i)

    def unplace(self, i: int) -> None:
        for q in self.seg:
            _out(q, i)

    def reuse(self, i: int) -> None:
        s = self._where(i)
        self.seg[s].remove(i)
        up = min(s + 1, self.n - 1)
        self.seg[up].append(i)
        if up == s:
            return
        while up > 0 and len(self.seg[up]) > self.share:
            t = self.seg[up].pop(0)
            self.seg[up - 1].append(t)
            up -= 1

    def walk(self, offered: set[int], k: int) -> list[int]:
        order = [e for q in self.seg for e in q if e in offered]
        victims = order[:k]
        for v in victims:
            self.unplace(v)
        return victims


class ArcRef(QueueRef):
    """docs/policy.md and the ARC paper (FAST'03): T1, T2, ghosts B1, B2, target p."""

    NEW, B1, B2 = 0, 1, 2

    def __init__(self, capacity: int, cfg: Any) -> None:
        super().__init__(capacity, cfg)
        self.t1: list[int] = []
        self.t2: list[int] = []
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0.0
        self.case: dict[int, int] = {}

    def admit(self, ids: list[int]) -> None:
        self.case = {}
        for i in sorted(ids):
            if i in self.b1:
                self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), self.cap)
                del self.b1[i]
                self.case[i] = self.B1
            elif i in self.b2:
                self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)
                del self.b2[i]
                self.case[i] = self.B2
            else:
                self.case[i] = self.NEW
        super().admit(ids)

    def place(self, i: int) -> None:
        (self.t1 if self.case.get(i, self.NEW) == self.NEW else self.t2).append(i)

    def unplace(self, i: int) -> None:
        _out(self.t1, i)
        _out(self.t2, i)

    def reuse(self, i: int) -> None:
        self.unplace(i)
        self.t2.append(i)

    def walk(self, offered: set[int], k: int) -> list[int]:
        cases = [self.case[i] for i in sorted(self.case)]
        victims: list[int] = []
        while len(victims) < k:
            case = cases[len(victims)] if len(victims) < len(cases) else self.NEW
            ghost = True
            n1, n2 = len(self.t1), len(self.t2)
            if case == self.NEW:
                if n1 + len(self.b1) >= self.cap:
                    if self.b1:
                        self.b1.popitem(last=False)
                    else:
                        ghost = False  # T1's tail leaves without a ghost
                elif n1 + len(self.b1) + n2 + len(self.b2) >= 2 * self.cap and self.b2:
                    self.b2.popitem(last=False)
            if not ghost:
                from_t1 = True
            else:
                from_t1 = (n1 > 0 and (n1 > self.p or (n1 == self.p and case == self.B2))) or (
                    n2 == 0
                )
            o1 = [e for e in self.t1 if e in offered]
            o2 = [e for e in self.t2 if e in offered]
            if not (o1 if from_t1 else o2):
                from_t1 = not from_t1  # the chosen list offers nothing
            if from_t1:
                e = o1[0]
                self.t1.remove(e)
                if ghost:
                    self.b1[e] = None
            else:
                e = o2[0]
                self.t2.remove(e)
                self.b2[e] = None
            victims.append(e)
        return victims


REFS = {"clock": ClockRef, "sieve": SieveRef, "s3fifo": S3FifoRef, "slru": SlruRef, "arc": ArcRef}


def make(policy: str, capacity: int, cfg: Any) -> QueueRef:
    return REFS[policy](capacity, cfg)


class WTinyLfuRef(QueueRef):
    """docs/policy.md, W-TinyLFU (libCacheSim's): a window LRU, a main cache (SLRU
    probation/protected, LRU or FIFO, or one of the plain queues above), and a counting
    Bloom filter of frequencies.

    The sketch here is a plain list of counters; only the hash (XXH64, a primitive checked
    on the specification's vectors in tests/test_policies_wtinylfu.py) is the firmware's.
    A queue main is the plain queue above at M entries: a window victim joins it by its
    placement rule (ARC: T2 while a ghost case is pending), a reuse is its reuse, and its
    victim is its own walk's first victim, found on a copy (kept if the victim leaves).
    """

    def __init__(self, capacity: int, cfg: Any) -> None:
        super().__init__(capacity, cfg)
        # trunc(capacity × share), at least one entry
        window = min(capacity, max(1, int(capacity * float(cfg.param("wtinylfu_window")))))
        self.m = capacity - window  # main cache entries
        self.main = cfg.param("wtinylfu_main")
        r = float(cfg.param("wtinylfu_probation"))
        self.share = (
            (int(r * self.m), int((1 - r) * self.m)) if self.main == "slru" else (self.m, 0)
        )
        self.window: list[int] = []  # oldest first
        self.prob: list[int] = []
        self.prot: list[int] = []
        self.n = max(1, math.ceil(float(cfg.param("wtinylfu_sketch_width")) * self.m))
        self.k = int(cfg.param("wtinylfu_sketch_hashes"))
        self.counters = [0] * self.n
        self.period = int(cfg.param("wtinylfu_sample")) * self.m
        self.reuses = 0
        # a plain queue as the main cache (None: SLRU, LRU or FIFO in prob/prot)
        self.mq: QueueRef | None = None
        if self.main in ("clock", "sieve", "s3fifo", "arc"):
            self.mq = REFS[self.main](self.m, cfg)
        self.pending = ArcRef.NEW  # ARC main: the ghost case of the last request found there

    # the sketch
    def _idx(self, i: int) -> list[int]:
        key = i.to_bytes(8, "little")
        a = xxh64(key, SEED_A) % 2**32
        b = xxh64(key, SEED_B) % 2**32
        return [(a + j * b) % 2**32 % self.n for j in range(self.k)]

    def _add(self, i: int) -> None:
        for x in self._idx(i):
            self.counters[x] += 1

    def _est(self, i: int) -> int:
        return min(self.counters[x] for x in self._idx(i))

    # the queues
    def place(self, i: int) -> None:
        self.window.append(i)

    def unplace(self, i: int) -> None:
        for q in (self.window, self.prob, self.prot):
            _out(q, i)

    def reuse(self, i: int) -> None:
        if i in self.window:
            self.window.remove(i)
            self.window.append(i)
            return
        if self.mq is not None:
            self.mq.reuse(i)
            self.pending = ArcRef.NEW  # (a request found in the main)
        elif self.main == "slru":
            self.unplace(i)
            self.prot.append(i)
            while len(self.prot) > self.share[1]:
                self.prob.append(self.prot.pop(0))
        elif self.main == "lru":
            self.prob.remove(i)
            self.prob.append(i)
        self._add(i)
        self.reuses += 1
        if self.reuses >= self.period:
            self.reuses = 0
            self.counters = [c // 2 for c in self.counters]

    def _to_main(self, i: int) -> None:
        if len(self.prob) < self.share[0]:
            self.prob.append(i)
        elif len(self.prot) < self.share[1]:
            self.prot.append(i)
        else:
            self.prob.append(i)

    def _main_victim(self, offered: set[int]) -> int | None:
        return next((e for e in self.prob + self.prot if e in offered), None)

    # a plain queue as the main
    def _members(self) -> list[int]:
        q = self.mq
        if isinstance(q, S3FifoRef):
            return q.small + q.main
        if isinstance(q, ArcRef):
            return q.t1 + q.t2
        assert isinstance(q, (ClockRef, SieveRef))
        return list(q.q)

    def admit(self, ids: list[int]) -> None:
        q = self.mq
        if isinstance(q, ArcRef):  # a request for an id in the main's ghost
            for i in sorted(ids):
                if i in q.b1:
                    q.p = min(q.p + max(len(q.b2) / len(q.b1), 1.0), q.cap)
                    del q.b1[i]
                    self.pending = ArcRef.B1
                elif i in q.b2:
                    q.p = max(q.p - max(len(q.b1) / len(q.b2), 1.0), 0.0)
                    del q.b2[i]
                    self.pending = ArcRef.B2
        super().admit(ids)

    def _join(self, w: int) -> None:
        q = self.mq
        if isinstance(q, ArcRef):
            (q.t1 if self.pending == ArcRef.NEW else q.t2).append(w)
            self.pending = ArcRef.NEW
            return
        if isinstance(q, S3FifoRef):
            q.to_main = set()
            if w in q.ghost:
                del q.ghost[w]
                q.to_main = {w}
        assert q is not None
        q.place(w)

    def _main_try(self, offered: set[int]) -> tuple[QueueRef | None, int | None]:
        """The main's victim, by its walk on a copy (the copy after it, to keep if the
        victim leaves)."""
        if not any(e in offered for e in self._members()):
            return None, None
        trial = copy.deepcopy(self.mq)
        assert trial is not None
        if isinstance(trial, ArcRef):
            trial.case = {0: self.pending}  # the case its eviction runs under
        got = trial.walk(offered, 1)
        trial.evicted(got)
        for v in got:
            trial.gone(v)
        if isinstance(trial, ArcRef):
            trial.case = {}
        return trial, got[0]

    def walk(self, offered: set[int], k: int) -> list[int]:
        return self._walk_queue_main(offered, k) if self.mq is not None else self._walk(offered, k)

    def _walk_queue_main(self, offered: set[int], k: int) -> list[int]:
        victims: list[int] = []
        while len(victims) < k:
            w = next((e for e in self.window if e in offered), None)
            if w is None:
                trial, m = self._main_try(offered)
                assert m is not None
                self.mq = trial
                victims.append(m)
                continue
            self.window.remove(w)
            if len(self._members()) < self.m:
                self._join(w)
            else:
                trial, m = self._main_try(offered)
                if m is not None and self._est(w) > self._est(m):
                    self.mq = trial
                    victims.append(m)
                    self._join(w)
                else:
                    victims.append(w)
            self._add(w)
        return victims

    def _walk(self, offered: set[int], k: int) -> list[int]:
        victims: list[int] = []
        while len(victims) < k:
            w = next((e for e in self.window if e in offered), None)
            if w is None:
                m = self._main_victim(offered)
                assert m is not None
                self.unplace(m)
                victims.append(m)
                continue
            self.window.remove(w)
            if len(self.prob) + len(self.prot) < self.m:
                self._to_main(w)
            else:
                m = self._main_victim(offered)
                if m is not None and self._est(w) > self._est(m):
                    self.unplace(m)
                    victims.append(m)
                    self._to_main(w)
                else:
                    victims.append(w)
            self._add(w)
        return victims

    def evicted(self, victims: list[int]) -> None:
        for i in self.arriving:  # counted once the pass has made room (libCacheSim's order)
            self._add(i)

    def end_op(self) -> None:
        for i in self.arriving:
            self._add(i)
        super().end_op()


REFS["wtinylfu"] = WTinyLfuRef
