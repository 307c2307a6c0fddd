"""Shared mechanics of the queue-based policies (CLOCK, SIEVE, S3-FIFO, SLRU).

Their victim choice is a walk over queues that changes state as it goes (a hand clears
visited bits, a tail entry is moved to the head), not a ranking of independent keys.
So each one implements ``select`` as that walk, run on a copy of its state, and keeps
the resulting state as a *plan*; the cache then removes the victims, and ``on_evict``
commits the plan.  ``priority`` stays a separate closed-form key where the published
algorithm has one (CLOCK, SIEVE, SLRU), which the eviction audit compares with the walk.

Batch rule (docs/simulator.md "Replay, exactly"): the entries admitted by the batch that
caused the overflow are *arriving*: they are not in any queue while the pass runs (as in
libCacheSim, which evicts before it inserts) and join the head of their queue after it,
in ascending id order.  Entries the cache does not offer (pinned, read in this batch)
are skipped by the walk and keep their place and bits.

An entry's first read after it became resident is its admission read (libCacheSim's
compulsory miss): it sets no reference bit and counts no hit.  Later reads do.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..config import PolicyConfig
from ..table import EntryTable
from .base import Policy, Tick


class QueuePolicy(Policy):
    """A policy whose entries sit in FIFO-ordered queues keyed by a sequence number."""

    # seq: position in its queue (larger = nearer the head, -1: not resident);
    # fresh: resident, not yet read (its next read is the admission read)
    columns = {"seq": (np.int64, -1), "fresh": (np.bool_, False)}

    def __init__(self, config: PolicyConfig, table: EntryTable) -> None:
        super().__init__(config, table)
        self.capacity = 0
        self.counter = 0  # next sequence number (a queue head)
        self._arriving = np.zeros(0, np.int64)
        self._plan: dict | None = None

    def _stamp(self, ids: NDArray) -> None:
        """Put ``ids`` at the head of their queue, in the given order."""
        ids = np.asarray(ids, dtype=np.int64)
        self.seq[ids] = np.arange(self.counter, self.counter + ids.size)
        self.counter += ids.size

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        # Queue state is defined at admission (the published algorithms reset it), so
        # persistent_metadata does not apply; memory of evicted entries is a ghost list.
        Policy.forget(self, ids)
        self._stamp(ids)
        self.fresh[ids] = True
        self._arriving = np.asarray(ids, dtype=np.int64)
        self._plan = None

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

    def members(self) -> NDArray:
        """Every resident entry, in queue order (oldest first), arriving ones excluded."""
        ids = np.flatnonzero(self.seq >= 0)
        ids = np.setdiff1d(ids, self._arriving, assume_unique=False)
        return ids[np.argsort(self.seq[ids], kind="stable")]

    # --- the plan: select() walks a copy, on_evict() commits it ----------------------
    def select(self, eligible: NDArray, k: int, tick: Tick, ordered: bool = True) -> NDArray:
        eligible = np.asarray(eligible, dtype=np.int64)
        k = min(int(k), eligible.size)
        arriving = np.intersect1d(eligible, self._arriving)
        queued = np.setdiff1d(eligible, arriving)
        victims, plan = self.walk(queued, min(k, queued.size), tick)
        if victims.size < k:  # the batch alone overflows: its own entries go, by id
            victims = np.concatenate([victims, arriving[: k - victims.size]])
        self._plan = {"victims": np.sort(victims), **plan}
        return victims

    def walk(self, eligible: NDArray, k: int, tick: Tick) -> tuple[NDArray, dict]:
        """The published eviction walk over a copy of the state: (victims in order, the
        state to commit).  Subclasses implement it."""
        raise NotImplementedError

    def commit(self, plan: dict) -> None:
        """Apply a walk's state changes (subclasses extend; the base re-heads movers)."""
        moved = plan.get("moved")
        if moved is not None and moved.size:
            self._stamp(moved)
        for col, (ids, values) in plan.get("set", {}).items():
            getattr(self, col)[ids] = values

    def on_evict(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        plan, self._plan = self._plan, None
        if plan is not None and np.array_equal(np.sort(ids), plan["victims"]):
            self.leave(ids)
            self.commit(plan)
            # arriving entries join the head after the walk's movers (libCacheSim inserts
            # after it evicts)
            arriving = self._arriving[self.seq[self._arriving] >= 0]
            if arriving.size:
                self._stamp(arriving)
        else:  # an eviction the cache chose itself (placement demotion): just leave
            self.leave(ids)
        self._arriving = np.zeros(0, np.int64)

    def leave(self, ids: NDArray) -> None:
        """``ids`` are no longer resident."""
        self.seq[ids] = -1
        self.fresh[ids] = False
