"""LRFU (Lee et al. 1999): combined recency and frequency, CRF = Σ (1/2)^(λ·age).

λ = 0 is LFU, λ = 1 is LRU-like. Kept in the log domain so that long idle times
do not underflow: key = log2(CRF at last reference) − λ·(now − last).
The seed's EMA is LRFU with attention-weighted increments.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..policy_params import LRFU_LAMBDA
from .base import Policy, Tick, register


@register
class LrfuPolicy(Policy):
    name = "lrfu"
    summary = "LRFU: exponentially decayed reference count (Lee et al. 1999)"
    columns = {"log_crf": (np.float64, -np.inf), "last": (np.int64, 0)}
    parameters = {"lrfu_lambda": LRFU_LAMBDA}

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        lam = self.params.lrfu_lambda
        decayed = self.log_crf[ids] - lam * (tick.time - self.last[ids])
        self.log_crf[ids] = np.logaddexp2(decayed, 0.0)  # CRF·2^(−λΔ) + 1
        self.last[ids] = tick.time

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        lam = self.params.lrfu_lambda
        return -(self.log_crf[ids] - lam * (tick.time - self.last[ids]))
