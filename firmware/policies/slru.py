"""SLRU (segmented LRU, Karedla et al. 1994), libCacheSim's n-segment form.

``slru_segments`` LRU segments of capacity / n entries each, segment 0 the probationary
one.  A new entry joins the head of the lowest segment with room (so while the cache
fills, later segments fill directly), else — the cache is full — segment 0.  A reuse of
an entry in the top segment moves it to that segment's head; in a lower segment it moves
to the head of the next one up, and while that segment holds more than its share its
tail moves down to the head of the segment below (cascading).  The victim is the tail
of the lowest non-empty segment.  This is libCacheSim's SLRU (4 segments), checked hit
for hit in tests/test_firmware_libcachesim.py at capacities divisible by the segment
count; otherwise libCacheSim's byte-truncated segments leave segment 0 over its share
and a cascade into it evicts on a hit, which demand paging does not do (docs/policy.md).

Closed form the audit compares with the walk: (segment, recency within the segment).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..params import Param, in_range
from .base import Tick, register
from .queued import WALK_AUDITED, QueuePolicy

SLRU_SEGMENTS = Param(
    "[1, 8] segments",
    in_range(1, 8),
    int,
    "SLRU's number of LRU segments, each capacity / n entries; a reuse moves an entry one "
    "segment up (libCacheSim n-seg).",
    default=4,
)
_SPAN = np.int64(1) << 40  # > any head stamp: the segment is the major key
_MAX_SEGMENTS = 8


@register
class SlruPolicy(QueuePolicy):
    name = "slru"
    not_audited = (
        "demotions between segments depend on other entries' promotions, "
        "not on an entry's own history; " + WALK_AUDITED
    )
    summary = "SLRU: n LRU segments, a reuse promotes one segment (libCacheSim's form)"
    parameters = {"slru_segments": SLRU_SEGMENTS}
    n_queues = _MAX_SEGMENTS  # queue q = segment q − 1

    def set_capacity(self, capacity: int) -> None:
        super().set_capacity(capacity)
        self.share = capacity / self.params.slru_segments  # entries per segment

    def place(self, ids: NDArray) -> None:
        n = self.params.slru_segments
        for i in ids.tolist():
            q = next((s for s in range(1, n + 1) if self.count[s] + 1 <= self.share), 1)
            self.push(i, q)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        top = self.params.slru_segments
        for i in ids[self.first_reads(ids)].tolist():  # in read order
            q = int(self.queue[i])
            self.unlink(i)
            self.push(i, min(q + 1, top))
            s = q + 1
            while 1 < s <= top and self.count[s] > self.share:
                t = self.tail[s]
                self.unlink(t)
                self.push(t, s - 1)
                s -= 1

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        ids = np.asarray(ids, dtype=np.int64)
        return self.arriving_last(ids, -(self.queue[ids].astype(np.int64) * _SPAN + self.seq[ids]))

    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        victims: list[int] = []
        for q in range(1, self.params.slru_segments + 1):
            for i in self.cursor(q):
                if len(victims) >= k:
                    break
                victims.append(i)
        return np.asarray(victims, np.int64), {}
