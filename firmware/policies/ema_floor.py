"""The seed's EMA with a floor under its recency term: touched entries stay ordered by score.

A touch zeroes the idle count, so the seed's priority ``(1 − score)·r`` is exactly 0 for
every entry touched in the last step, and among those the contract's tie-break (the lower
entry id) picks the victim, not attention (docs/results.md: 54–62 % of the EMA's victims
had priority 0).  This variant ranks by ``(1 − score)·max(r, ema_floor)``: an entry idle
long enough that ``r > ema_floor`` ranks as in the seed; below that, entries go in order
of lowest score.  ``ema_floor = 0`` is the seed's policy exactly.  Float mode; everything
else (the EMA, touches, anchors, placement, prefetch) is ``ema``'s.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..formulas import priority_step, recency_decay
from ..params import REAL, Param, in_range
from .base import Tick, register
from .ema import EmaHistory, EmaPolicy

EMA_FLOOR = Param(
    "[0, 1]",
    in_range(0.0, 1.0),
    REAL,
    "ema-floor's least recency term: priority (1 − score)·max(r, floor), so entries touched "
    "lately are ordered by score instead of by id (0: the seed's EMA).",
    default=0.05,
)


def floored_priority(score: NDArray, idle: NDArray, beta: float, floor: float) -> NDArray:
    """(1 − score) · max(recency_decay(idle), floor): the seed's kernel with r floored."""
    return np.asarray(priority_step(score, np.maximum(recency_decay(idle, beta), floor)))


class EmaFloorHistory(EmaHistory):
    """The EMA's history, ranked by the floored priority."""

    def priority(self, ids: NDArray, time: int) -> NDArray:
        p = self.index(ids)
        self._settle(p)
        cfg = self.h.config
        return floored_priority(self.score[p], self.idle(p), cfg.beta, cfg.param("ema_floor"))


@register
class EmaFloorPolicy(EmaPolicy):
    name = "ema-floor"
    summary = "EMA × recency with a floor under recency: lately touched entries ordered by score"
    modes = ("float",)
    parameters = {"ema_floor": EMA_FLOOR}
    history = EmaFloorHistory

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        c = self.config
        return floored_priority(self.score_[ids], self.idle[ids], c.beta, self.params.ema_floor)
