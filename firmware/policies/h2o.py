"""H2O (Zhang et al. 2023): heavy hitters by accumulated attention, plus a recent window.

The first ``sink_tokens`` tokens (the attention sink) are pinned, as in
sink-window.  Entries within ``recent_tokens`` of their context's newest token are
evicted last (among themselves by the contract's tie-break: lower entry id first);
the rest go in order of least accumulated attention weight.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .base import Policy, Tick, register


@register
class H2oPolicy(Policy):
    name = "h2o"
    summary = "H2O: heavy hitters (accumulated attention) + recent window"
    columns = {"acc": (np.float64, 0.0)}

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        np.add.at(self.acc, ids, np.asarray(weights, dtype=np.float64))

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        recent = self.table.age_tokens(ids) < self.config.recent_tokens
        return np.where(recent, -np.inf, -self.acc[ids])

    def wants_pin(self, ids: NDArray) -> NDArray:
        return self.table.first_token(ids) < self.config.sink_tokens
