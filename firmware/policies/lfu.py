"""Least frequently used: evict the entry read the fewest times.

Ties go to the lower entry index (the project-wide order). libCacheSim's LFU
breaks ties differently, which is the only source of hit-count differences
against it (tests/test_libcachesim_crosscheck.py).  With persistent_metadata on,
counts survive eviction (Appendix N's "persistent LFU"); off is classic LFU.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .base import Policy, Tick, register


@register
class LfuPolicy(Policy):
    name = "lfu"
    summary = "least frequently used"
    columns = {"count": (np.int64, 0)}

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        np.add.at(self.count, ids, 1)

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return -self.count[ids]
