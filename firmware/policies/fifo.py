"""First in, first out: evict the entry that became resident earliest."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .base import Policy, Tick, register


@register
class FifoPolicy(Policy):
    name = "fifo"
    summary = "first in, first out"
    columns = {"inserted": (np.int64, -1)}

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        self.inserted[ids] = tick.time

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return -self.inserted[ids]
