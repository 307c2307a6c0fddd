"""Least frequently used: evict the entry read the fewest times.

Ties between equal counts go to the least recently read entry (``lfu_tie_break =
"lru"``, the default) — the order libCacheSim's LFU uses: objects of one frequency
leave in the order they reached it, which is the order of their last read.  With it the two
agree exactly (tests/test_firmware_libcachesim.py).  ``"index"`` uses the
project-wide lower-index rule alone; the same test measures how far that moves
the hit count.
With persistent_metadata on, counts survive eviction (Appendix N's "persistent
LFU", docs/design.md); off is classic LFU.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..history import HistoryRule
from ..policy_params import LFU_TIE_BREAK
from .base import Policy, Tick, register

_TIME_SPAN = 1 << 40  # > any batch time: count is the major key, last read the minor one


class LfuHistory(HistoryRule):
    """Fewest reads first; then the oldest last read (``lfu_tie_break = "lru"``)."""

    def priority(self, ids: NDArray, time: int) -> NDArray:
        h = self.h
        if h.config.param("lfu_tie_break") == "index":
            return -h.reads[ids]
        return -(h.reads[ids] * _TIME_SPAN + h.last_read[ids])


@register
class LfuPolicy(Policy):
    name = "lfu"
    summary = "least frequently used"
    columns = {"count": (np.int64, 0), "last": (np.int64, 0)}
    parameters = {"lfu_tie_break": LFU_TIE_BREAK}
    history = LfuHistory

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        np.add.at(self.count, ids, 1)
        self.last[ids] = tick.time

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        if self.params.lfu_tie_break == "lru":
            return -(self.count[ids] * _TIME_SPAN + self.last[ids])
        return -self.count[ids]
