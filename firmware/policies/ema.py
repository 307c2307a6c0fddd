"""The seed's policy: per-entry EMA of attention, recency decay, anchor pinning.

Float mode computes the formulas of docs/policy.md exactly; ``mode="int"`` is the Q0.16
contract the RTL matches bit for bit.  Within a step, reads record their weights and a touch
(weight ≥ touch_threshold) resets the idle counter at once; the EMA itself is
applied to every entry at the step boundary (an unread entry gets w = 0), which is
when the RTL's scoring engine streams the table.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .. import fixedpoint as fx
from .. import golden_step
from ..config import PolicyConfig
from ..formulas import eviction_priority
from ..table import EntryTable
from .base import Policy, Tick, register


@register
class EmaPolicy(Policy):
    name = "ema"
    summary = "EMA attention score × recency decay, anchors pinned (the seed's policy)"
    modes = ("float", "int")

    def __init__(self, config: PolicyConfig, table: EntryTable, mode: str = "float") -> None:
        if mode not in ("float", "int"):
            raise ValueError(f"mode = {mode!r}: must be 'float' or 'int'")
        self.mode = mode
        if mode == "float":
            self.columns = {
                "score_": (np.float64, 0.0),
                "idle": (np.int64, 0),
                "w_step": (np.float64, 0.0),
                "touched": (np.bool_, False),
            }
        else:
            # Q0.16 values and the 16-bit idle counter, held in uint32 so that every
            # intermediate of the contract (< 2³²) is computed without widening.
            self.columns = {
                "score_": (np.uint32, 0),
                "idle": (np.uint32, 0),
                "w_step": (np.uint32, 0),
                "touched": (np.bool_, False),
            }
            self.int_params = golden_step.IntParams.from_config(config)
        super().__init__(config, table)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        if self.mode == "int":
            w = np.asarray(fx.to_q16(weights), dtype=np.uint32)
            touch = golden_step.touches(w, True, self.int_params.touch_q)
        else:
            w = np.asarray(weights, dtype=np.float64)
            touch = w >= self.config.touch_threshold
        # An entry read twice in one step keeps its largest weight.
        np.maximum.at(self.w_step, ids, w)
        hit = ids[touch]
        self.touched[hit] = True
        self.idle[hit] = 0

    def end_step(self, tick: Tick) -> None:
        n = self.table.n
        self.ensure(n)
        s, w, t = self.score_[:n], self.w_step[:n], self.touched[:n]
        if self.mode == "int":
            # the integer golden step's state update (its ranking is priority() below)
            s[:], self.idle[:n] = golden_step.advance(
                s, self.idle[:n], w, t, self.int_params.alpha_q
            )
        else:
            a = self.config.alpha
            s *= 1.0 - a
            s += a * w
            idle = self.idle[:n]
            idle += 1
            idle[t] = 0
        w[:] = 0
        t[:] = False

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        if self.mode == "int":
            return golden_step.priorities(self.score_[ids], self.idle[ids], self.int_params)
        return np.asarray(eviction_priority(self.score_[ids], self.idle[ids], self.config.beta))

    def wants_pin(self, ids: NDArray) -> NDArray:
        return self.table.first_token(ids) < self.config.anchor_zone_size

    def score(self, ids: NDArray) -> NDArray:
        s = self.score_[ids]
        return fx.from_q16(s) if self.mode == "int" else s.astype(np.float64)

    def score_q16(self, ids: NDArray) -> NDArray:
        if self.mode == "int":
            return np.asarray(self.score_[ids])
        return super().score_q16(ids)

    def idle_steps(self, ids: NDArray) -> NDArray:
        return self.idle[ids]
