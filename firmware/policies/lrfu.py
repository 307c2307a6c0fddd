"""LRFU (Lee et al. 1999): combined recency and frequency, CRF = Σ (1/2)^(λ·age).

λ = 0 is LFU, λ = 1 is LRU-like. Kept in the log domain so that long idle times
do not underflow: key = log2(CRF at last reference) − λ·(now − last).
The seed's EMA is LRFU with attention-weighted increments.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..history import HistoryRule
from ..policy_params import LRFU_LAMBDA
from ..table import unique_ids
from .base import Policy, Tick, register


class LrfuHistory(HistoryRule):
    """CRF kept in the log domain from the reads: log2 CRF at the last read, less λ·age."""

    columns = {"log_crf": (np.float64, -np.inf), "crf_time": (np.int64, 0)}

    def on_read(self, ids: NDArray, weights: NDArray, time: int) -> None:
        lam = self.h.config.param("lrfu_lambda")
        u = unique_ids(ids)
        self.log_crf[u] = np.logaddexp2(self.log_crf[u] - lam * (time - self.crf_time[u]), 0.0)
        self.crf_time[u] = time

    def priority(self, ids: NDArray, time: int) -> NDArray:
        lam = self.h.config.param("lrfu_lambda")
        return -(self.log_crf[ids] - lam * (time - self.crf_time[ids]))


@register
class LrfuPolicy(Policy):
    name = "lrfu"
    summary = "LRFU: exponentially decayed reference count (Lee et al. 1999)"
    columns = {"log_crf": (np.float64, -np.inf), "last": (np.int64, 0)}
    parameters = {"lrfu_lambda": LRFU_LAMBDA}
    history = LrfuHistory

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        lam = self.params.lrfu_lambda
        decayed = self.log_crf[ids] - lam * (tick.time - self.last[ids])
        self.log_crf[ids] = np.logaddexp2(decayed, 0.0)  # CRF·2^(−λΔ) + 1
        self.last[ids] = tick.time

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        lam = self.params.lrfu_lambda
        return -(self.log_crf[ids] - lam * (tick.time - self.last[ids]))
