"""Shared mechanics of the queue-based policies (CLOCK, SIEVE, S3-FIFO, SLRU, ARC and
W-TinyLFU, whose window and main cache are queues).

Their victim choice is a walk over queues that changes state as it goes (a hand clears
visited bits, a tail entry is moved to the head), not a ranking of independent keys.
So each one implements ``select`` as that walk, which reads the live queues without
changing them and returns the victims plus a *plan* (who moved where, which bits
changed); the cache then removes the victims, and ``on_evict`` commits the plan.
``priority`` stays a separate closed-form key where the published algorithm has one
(CLOCK, SIEVE, SLRU), which the eviction audit compares with the walk.

The queues are doubly linked lists over entry ids (Python lists ``older``/``newer``,
one head and tail per queue), so a pass costs O(entries the walk visits): the victims,
the entries it moves or clears, and the non-offered entries it steps over — never a
scan of every resident entry.  ``seq`` stamps the order an entry reached its queue's
head (larger = newer); the closed-form priorities use it.

Batch rule (docs/simulator.md "Replay, exactly"): the entries admitted by the batch that
caused the overflow are *arriving*: the walk does not see them (as in libCacheSim, which
evicts before it inserts) and they join the head of their queue after it, in ascending
id order.  Entries the cache does not offer (pinned, read in this batch) are skipped by
the walk and keep their place and bits.

An entry's first read after it became resident is its admission read (libCacheSim's
compulsory miss): it sets no reference bit and counts no hit.  Later reads do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from ..config import PolicyConfig
from ..table import EntryTable, grow
from .base import Policy, Tick

NONE = -1  # no entry (end of a list, hand at the tail)
# Priority of an arriving entry in a closed form: below every queued entry's key, equal
# among arrivals, so the audit's "priority descending, id ascending" order puts them
# last, lowest id first — the walk's rule when the batch alone overflows.
ARRIVING = np.int64(-(1 << 62))
# What the audit checks of a walk, since its order is not any one entry's history
# (each queue policy's ``not_audited`` says why, then this).
WALK_AUDITED = (
    "the top-k audit compares the walk's victims with its closed-form key, and "
    "tests/reference_queues.py replays the policy independently"
)


class QueuePolicy(Policy):
    """A policy whose resident entries sit in FIFO-ordered linked queues."""

    # seq: head stamp (larger = newer, -1: not resident); queue: which queue (0: none);
    # fresh: resident, not yet read (its next read is the admission read)
    columns = {"seq": (np.int64, -1), "queue": (np.int8, 0), "fresh": (np.bool_, False)}
    # Columns that describe where a resident entry sits; forget() keeps them.
    _place_cols: ClassVar[tuple[str, ...]] = ("seq", "queue")
    n_queues: ClassVar[int] = 1
    # The order is a walk over the queued (resident) entries: an entry in CXL DRAM is in
    # no queue, so CXL DRAM keeps its arrival order under cxl_order = "policy".
    ranks_lower_tiers = False

    def __init__(self, config: PolicyConfig, table: EntryTable) -> None:
        super().__init__(config, table)
        self.capacity = 0
        self.counter = 0  # next head stamp
        self.older: list[int] = [NONE] * 16  # toward the tail
        self.newer: list[int] = [NONE] * 16  # toward the head
        self.head = [NONE] * (self.n_queues + 1)  # index 0 unused
        self.tail = [NONE] * (self.n_queues + 1)
        self.count = [0] * (self.n_queues + 1)
        self._ok = np.zeros(16, bool)  # offered to the current walk
        self._arriving = np.zeros(0, np.int64)
        self._plan: dict | None = None

    # --- storage ---------------------------------------------------------------------
    def ensure(self, n: int) -> None:
        super().ensure(n)
        if len(self.older) < n:
            extra = max(n, 2 * len(self.older)) - len(self.older)
            self.older += [NONE] * extra
            self.newer += [NONE] * extra
        self._ok = grow(self._ok, n, False)

    def forget(self, ids: NDArray) -> None:
        """Reset ``ids``' bits; a resident entry keeps its place in its queue."""
        ids = np.asarray(ids, dtype=np.int64)
        keep = {c: getattr(self, c)[ids].copy() for c in self._place_cols}
        super().forget(ids)
        for c, v in keep.items():
            getattr(self, c)[ids] = v

    # --- the linked queues -----------------------------------------------------------
    def push(self, i: int, q: int) -> None:
        """Put entry ``i`` (in no queue) at the head of queue ``q``."""
        h = self.head[q]
        self.older[i], self.newer[i] = h, NONE
        if h == NONE:
            self.tail[q] = i
        else:
            self.newer[h] = i
        self.head[q] = i
        self.count[q] += 1
        self.queue[i] = q
        self.seq[i] = self.counter
        self.counter += 1

    def unlink(self, i: int) -> None:
        """Take entry ``i`` out of its queue (no-op if it is in none)."""
        q = int(self.queue[i])
        if q == 0:
            return
        o, n = self.older[i], self.newer[i]
        if o == NONE:
            self.tail[q] = n
        else:
            self.newer[o] = n
        if n == NONE:
            self.head[q] = o
        else:
            self.older[n] = o
        self.older[i] = self.newer[i] = NONE
        self.count[q] -= 1
        self.queue[i] = 0

    def order(self, q: int) -> Iterator[int]:
        """Queue ``q`` from tail (oldest) to head."""
        i = self.tail[q]
        while i != NONE:
            yield i
            i = self.newer[i]

    def live(self, q: int) -> int:
        """Entries in queue ``q`` that the walk may see (arriving ones excluded)."""
        a = self._arriving
        arriving = int(np.count_nonzero(self.queue[a] == q)) if a.size else 0
        return self.count[q] - arriving

    # --- events ----------------------------------------------------------------------
    def admit_queue(self, i: int) -> int:
        """The queue a newly admitted entry ``i`` joins (subclasses decide)."""
        return 1

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        # Queue state is defined at admission (the published algorithms reset it), so
        # persistent_metadata does not apply; memory of evicted entries is a ghost list.
        ids = np.asarray(ids, dtype=np.int64)
        for i in ids.tolist():
            self.unlink(i)
        Policy.forget(self, ids)
        self._arriving = np.sort(ids)
        self._plan = None
        self.fresh[ids] = True
        self.place(self._arriving)

    def place(self, ids: NDArray) -> None:
        """Put arriving ``ids`` (in no queue) at the heads of their queues, in order."""
        for i in ids.tolist():
            self.push(i, self.admit_queue(i))

    def first_reads(self, ids: NDArray) -> NDArray:
        """Mask of ``ids`` whose read now is a reuse (not the admission read); clears fresh.

        A batch that reads an entry twice counts one admission read and one reuse.
        """
        ids = np.asarray(ids, dtype=np.int64)
        reuse = ~self.fresh[ids]
        fresh_ids = ids[~reuse]
        if fresh_ids.size:
            # the first occurrence of each fresh id is its admission read
            _, first = np.unique(fresh_ids, return_index=True)
            later = np.ones(fresh_ids.size, bool)
            later[first] = False
            reuse[np.flatnonzero(~reuse)[later]] = True
            self.fresh[fresh_ids] = False
        return reuse

    # --- the plan: select() walks the live queues read-only, on_evict() commits it -----
    def select(self, eligible: NDArray, k: int, tick: Tick, ordered: bool = True) -> NDArray:
        eligible = np.asarray(eligible, dtype=np.int64)
        k = min(int(k), eligible.size)
        victims, plan = self.run_walk(eligible, k, tick)
        self._plan = {"victims": np.sort(victims), **plan}
        return victims

    def run_walk(self, eligible: NDArray, k: int, tick: Tick) -> tuple[NDArray, dict]:
        """The walk over ``eligible`` minus the arriving entries, then (if the batch alone
        overflows) its own arriving entries by id."""
        arriving = np.intersect1d(eligible, self._arriving)
        ok = self._ok
        ok[eligible] = True
        ok[arriving] = False
        try:
            n_queued = eligible.size - arriving.size
            victims, plan = self.walk(min(k, n_queued), tick)
        finally:
            ok[eligible] = False
        if victims.size < k:
            victims = np.concatenate([victims, arriving[: k - victims.size]])
        return victims, plan

    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        """The published eviction walk over the entries ``self._ok`` offers, reading the
        live queues only: (victims in order, the state changes to commit)."""
        raise NotImplementedError

    def cursor(self, q: int) -> Iterator[int]:
        """Offered entries of queue ``q``, tail first (a generator the walk pulls from)."""
        ok = self._ok
        i = self.tail[q]
        while i != NONE:
            if ok[i]:
                yield i
            i = self.newer[i]

    def commit(self, plan: dict) -> None:
        """Apply a walk's state changes: ``moved`` = [(id, queue)] in the order they reached
        a head (the last move of an id counts), ``set`` = {column: (ids, values)}."""
        last: dict[int, int] = {}
        for i, q in plan.get("moved", ()):
            if self.seq[i] < 0:  # a victim (left already)
                continue
            last.pop(i, None)  # re-insert: dict order is the order of last moves
            last[i] = q
        for i, q in last.items():
            self.unlink(i)
            self.push(i, q)
        for col, (ids, values) in plan.get("set", {}).items():
            getattr(self, col)[ids] = values

    def on_evict(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        plan, self._plan = self._plan, None
        for i in ids.tolist():
            self.leave(i)
        if plan is not None and np.array_equal(np.sort(ids), plan["victims"]):
            self.commit(plan)
            # arriving entries join the heads after the walk's movers (libCacheSim inserts
            # after it evicts)
            arriving = self._arriving[self.seq[self._arriving] >= 0]
            for i in arriving.tolist():
                self.unlink(i)
            self._arriving = np.zeros(0, np.int64)
            self.place(arriving)
        self._arriving = np.zeros(0, np.int64)
        Policy.forget(self, ids)

    def arriving_last(self, ids: NDArray, priority: NDArray) -> NDArray:
        """A closed-form ``priority`` of ``ids`` with the arriving entries (the walk does not
        see them; they are its last victims, lowest id first) set to :data:`ARRIVING`."""
        if self._arriving.size == 0:
            return priority
        return np.where(np.isin(ids, self._arriving), ARRIVING, priority)

    def walk_rank(self, ids: NDArray, tick: Tick) -> NDArray:
        """A priority for policies without a closed form: minus the rank of each of ``ids``
        in the walk that evicts all of them (the audit then checks the selection only)."""
        ids = np.asarray(ids, dtype=np.int64)
        victims, _ = self.run_walk(ids, ids.size, tick)
        rank = np.empty(ids.size, np.int64)
        rank[np.searchsorted(np.sort(ids), victims)] = np.arange(victims.size)
        return -rank[np.argsort(np.argsort(ids))]

    def leave(self, i: int) -> None:
        """Entry ``i`` is no longer resident."""
        self.unlink(i)
        self.seq[i] = -1
        self.fresh[i] = False

    def walk_moves(self, q: int, extra: deque[int]) -> Iterator[int]:
        """Queue ``q`` as the walk sees it: the offered live entries, then those the walk
        appended to its head (``extra``, consumed as it is read)."""
        yield from self.cursor(q)
        while extra:
            yield extra.popleft()
