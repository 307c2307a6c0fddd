"""CLOCK (second chance, Corbató 1968), with an n-bit reference counter.

One FIFO queue; a reuse adds one to the entry's counter, up to 2**clock_bits − 1.  To
evict, look at the tail (the oldest entry): a counter above zero is decremented and the
entry moves to the head; an entry at zero is the victim.  This is libCacheSim's Clock
(``n-bit-counter``; its default of 1 bit is the classic second-chance CLOCK), checked hit
for hit in tests/test_firmware_libcachesim.py.

Closed form the audit compares with the walk: victims leave in order of (counter, queue
position) — every full turn lowers all counters by one and keeps the queue order.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray

from ..params import Param, in_range
from .base import Tick, register
from .queued import WALK_AUDITED, QueuePolicy

CLOCK_BITS = Param(
    "[1, 8] bits",
    in_range(1, 8),
    int,
    "CLOCK's reference counter width: a reuse counts up to 2**bits − 1, and each pass of "
    "the hand over the entry takes one off (1: classic second chance).",
    default=1,
)
_SPAN = np.int64(1) << 40  # > any sequence number: the counter is the major key


@register
class ClockPolicy(QueuePolicy):
    name = "clock"
    not_audited = (
        "the hand's walk decrements counters the entry's own history does not show; " + WALK_AUDITED
    )
    summary = "CLOCK / second chance: FIFO with a reference counter"
    columns = {**QueuePolicy.columns, "ref": (np.int64, 0)}
    parameters = {"clock_bits": CLOCK_BITS}

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        reuse = ids[self.first_reads(ids)]
        np.add.at(self.ref, reuse, 1)
        np.minimum(self.ref, (1 << self.params.clock_bits) - 1, out=self.ref)

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        ids = np.asarray(ids, dtype=np.int64)
        return self.arriving_last(ids, -(self.ref[ids] * _SPAN + self.seq[ids]))

    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        extra: deque[int] = deque()
        ref: dict[int, int] = {}
        victims: list[int] = []
        moved: list[tuple[int, int]] = []  # (id, queue) in the order they reached the head
        for i in self.walk_moves(1, extra):
            if len(victims) >= k:
                break
            r = ref.get(i, int(self.ref[i]))
            if r > 0:
                ref[i] = r - 1
                extra.append(i)
                moved.append((i, 1))
            else:
                victims.append(i)
        gone = set(victims)
        kept = np.asarray([i for i in ref if i not in gone], np.int64)
        return np.asarray(victims, np.int64), {
            "moved": moved,
            "set": {"ref": (kept, np.asarray([ref[int(i)] for i in kept], np.int64))},
        }
