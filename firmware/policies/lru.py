"""Least recently used: evict the entry whose last read is oldest."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .base import Policy, Tick, register


@register
class LruPolicy(Policy):
    name = "lru"
    summary = "least recently used"
    columns = {"last": (np.int64, -1)}

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        self.last[ids] = tick.time

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        self.last[ids] = tick.time

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return -self.last[ids]
