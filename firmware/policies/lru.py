"""Least recently used: evict the entry whose last read is oldest."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..history import HistoryRule
from .base import Policy, Tick, register


class LruHistory(HistoryRule):
    """The oldest last use (admission or read) goes first."""

    def priority(self, ids: NDArray, time: int) -> NDArray:
        return -self.h.last_use[ids]


@register
class LruPolicy(Policy):
    name = "lru"
    summary = "least recently used"
    columns = {"last": (np.int64, -1)}
    history = LruHistory

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        self.last[ids] = tick.time

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        self.last[ids] = tick.time

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return -self.last[ids]
