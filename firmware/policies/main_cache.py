"""The queue policies CLOCK, SIEVE, S3-FIFO and ARC as W-TinyLFU's main cache
(policies/wtinylfu.py, ``wtinylfu_main``).

W-TinyLFU owns an instance of the main policy's own class (a subclass below, not
registered: the same parameters, ``clock_bits``, ``s3fifo_*``, read from the same
configuration) sized to the main's M entries, and drives it as libCacheSim's WTinyLFU
drives its main cache:

* a window victim that moves into the main *joins* it (:meth:`MainCache.join`), as a
  libCacheSim insert: the policy's own admission rule (CLOCK and SIEVE: the head with no
  bit set; S3-FIFO: small, or main if its id is in the ghost or small is full before the
  first eviction), with no admission read pending (it was read in the window);
* a reuse in the main is the policy's own ``on_access`` (CLOCK counts one up, SIEVE sets
  the visited bit, S3-FIFO counts one up, ARC moves it to T2's head);
* the main's victim is the first victim of the policy's own walk over the offered entries
  (:meth:`MainCache.peek`, which changes nothing), and it leaves as the policy's
  ``on_evict`` commits that walk (:meth:`MainCache.pop`: bits cleared, entries moved,
  the hand set, ghosts added).

Within one W-TinyLFU pass these interleave: a comparison reads the main's victim, that
victim leaves and the window's victim joins, and the next comparison sees both changes;
yet ``select`` must not change state.  So W-TinyLFU's walk drives a :meth:`clone` of the
main, and ``on_evict`` adopts the clone when it commits the pass (the clone copies the
containers of ids and numbers one level: O(entries) per pass, numpy engine only).

ARC follows libCacheSim's WTinyLFU with an ARC main, whose ghost case belongs to the
cache's request, not to the entry that joins the main (:class:`ArcMain`).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .arc import FROM_B1, FROM_B2, NEW, T1, T2, ArcPolicy
from .base import Tick
from .clock import ClockPolicy
from .queued import QueuePolicy
from .s3fifo import S3FifoPolicy
from .sieve import SievePolicy


class MainCache(QueuePolicy):
    """What W-TinyLFU asks of its main cache (mixed in before a queue policy's class)."""

    def clone(self) -> Any:
        """An independent copy: the same configuration and table, its own queues, columns,
        ghosts and scalars."""
        twin = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, np.ndarray):
                setattr(twin, name, value.copy())
            elif isinstance(value, (list, dict, set)):  # ids and numbers: one level
                setattr(twin, name, copy.copy(value))
        return twin

    def members(self) -> int:
        """Entries in the main's queues."""
        return sum(self.count[1:])

    def admitted(self, ids: NDArray) -> None:
        """``ids`` were admitted to the cache (into the window), ascending."""

    def join(self, i: int, tick: Tick) -> None:
        """Entry ``i`` moves in from the window: placed by the policy's admission rule,
        in its queue at once (not arriving), its admission read long past."""
        self.on_insert(np.asarray([i], np.int64), tick)
        self.fresh[i] = False
        self._arriving = np.zeros(0, np.int64)

    def peek(self, tick: Tick) -> tuple[int, dict]:
        """The main's victim among the offered entries (``_ok``; one at least) and the
        walk that finds it, changing nothing."""
        victims, plan = self.walk(1, tick)
        return int(victims[0]), plan

    def pop(self, i: int, plan: dict, tick: Tick) -> None:
        """Victim ``i`` leaves, found by ``plan`` (:meth:`peek`'s): the walk is committed."""
        ids = np.asarray([i], np.int64)
        self._plan = {"victims": ids, **plan}
        self.on_evict(ids, tick)


class ClockMain(MainCache, ClockPolicy):
    """CLOCK as the main cache (libCacheSim's Clock: its victim is its walk's first)."""


class SieveMain(MainCache, SievePolicy):
    """SIEVE as the main cache (libCacheSim's Sieve: its victim is its walk's first)."""


class S3FifoMain(MainCache, S3FifoPolicy):
    """S3-FIFO as the main cache (libCacheSim's WTinyLFU refuses it): a window victim
    joins by S3-FIFO's admission rule, so an id back from its ghost joins main."""


class ArcMain(MainCache, ArcPolicy):
    """ARC as libCacheSim's WTinyLFU runs it behind the window.

    The main sees every request: when an admission to the cache finds its id in B1 (B2),
    p rises (falls) as ARC's does, the id leaves the ghost and that case becomes
    *pending*; a reuse in the main clears it (libCacheSim resets it on every request
    that finds its id in the main).  While a case is pending the main's evictions are
    REPLACE under it (no ghost trimmed), and the next entry to join goes to T2's head,
    which clears it; otherwise evictions follow ARC's rule for a new entry and a joining
    entry goes to T1's head.  (libCacheSim keeps the case in flags that only those two
    events clear, as its main cache's request count never advances.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pending = NEW

    def admitted(self, ids: NDArray) -> None:
        for i in np.asarray(ids, np.int64).tolist():  # ascending
            if i in self.b1:
                self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), self.capacity)
                del self.b1[i]
                self.pending = FROM_B1
            elif i in self.b2:
                self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)
                del self.b2[i]
                self.pending = FROM_B2

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        super().on_access(ids, weights, tick)
        if np.asarray(ids).size:
            self.pending = NEW

    def join(self, i: int, tick: Tick) -> None:
        self.push(i, T2 if self.pending != NEW else T1)
        self.pending = NEW

    def walk_cases(self) -> list[int]:
        return [self.pending]  # (its walks are of one victim: peek)


MAIN_POLICIES: dict[str, type[MainCache]] = {
    "clock": ClockMain,
    "sieve": SieveMain,
    "s3fifo": S3FifoMain,
    "arc": ArcMain,
}
