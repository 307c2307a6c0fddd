"""H2O (Zhang et al. 2023): heavy hitters by accumulated attention, plus a recent window.

Given a per-head budget (quality, calibration), half of it is the recent window,
as in the H2O paper; otherwise ``recent_tokens``.
The first ``sink_tokens`` tokens (the attention sink) are pinned, as in
sink-window.  Entries within ``recent_tokens`` of their context's newest token are
evicted last (among themselves by the contract's tie-break: lower entry id first);
the rest go in order of least accumulated attention weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..policy_params import RECENT_TOKENS, SINK_TOKENS
from .base import Policy, Tick, register
from .sink_window import SinkWindowHistory


class H2oHistory(SinkWindowHistory):
    """The recent window last; the rest by least accumulated weight; sinks claim pins."""

    def priority(self, ids: NDArray, time: int) -> NDArray:
        recent = self.h.age_tokens(ids) < self.h.config.param("recent_tokens")
        return np.where(recent, -np.inf, -self.h.weight_sum[ids])


@register
class H2oPolicy(Policy):
    name = "h2o"
    summary = "H2O: heavy hitters (accumulated attention) + recent window"
    columns = {"acc": (np.float64, 0.0)}
    parameters = {"sink_tokens": SINK_TOKENS, "recent_tokens": RECENT_TOKENS}
    history = H2oHistory

    @classmethod
    def budget_params(cls, budget_tokens: int) -> dict[str, Any]:
        return {"recent_tokens": budget_tokens // 2}  # H2O splits its budget: half recent

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        np.add.at(self.acc, ids, np.asarray(weights, dtype=np.float64))

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        recent = self.table.age_tokens(ids) < self.params.recent_tokens
        return np.where(recent, -np.inf, -self.acc[ids])

    def wants_pin(self, ids: NDArray) -> NDArray:
        return self.table.first_token(ids) < self.params.sink_tokens
