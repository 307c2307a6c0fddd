"""First in, first out: evict the entry that became resident earliest."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..history import HistoryRule
from .base import Policy, Tick, register


class FifoHistory(HistoryRule):
    """The earliest admission goes first."""

    def priority(self, ids: NDArray, time: int) -> NDArray:
        return -self.h.admitted[ids]


@register
class FifoPolicy(Policy):
    name = "fifo"
    summary = "first in, first out"
    columns = {"inserted": (np.int64, -1)}
    history = FifoHistory

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        self.inserted[ids] = tick.time

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return -self.inserted[ids]
