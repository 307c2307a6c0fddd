"""The seed's policy: per-entry EMA of attention, recency decay, anchor pinning.

Float mode computes the formulas of docs/policy.md exactly; ``mode="int"`` is the Q0.16
contract the RTL matches bit for bit.  Within a step, reads record their weights and a touch
(weight ≥ touch_threshold) resets the idle counter at once; the EMA itself is
applied to every entry at the step boundary (an unread entry gets w = 0), which is
when the RTL's scoring engine streams the table.

Two rules the seed does not fix are parameters (float mode; the Q0.16 contract keeps the
defaults and refuses others): ``ema_tie_break``, the order among equal priorities (the
entry id, as the contract; the least recently touched; the lowest score; the oldest
admission), and ``ema_touch_resets_idle`` (false: no read zeroes idle, an entry's
admission to HBM does, so idle counts steps since the entry was last brought in).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .. import fixedpoint as fx
from .. import golden_step
from ..config import PolicyConfig
from ..formulas import ema_decay, ema_update, eviction_priority
from ..history import EntryHistory, HistoryRule
from ..params import Param, one_of
from ..table import EntryTable
from .base import Policy, Tick, register

EMA_TIE_BREAK = Param(
    "'id', 'last-touch', 'score' or 'age'",
    one_of("id", "last-touch", "score", "age"),
    str,
    "Order among equal EMA priorities: 'id' the lower entry id (the contract's); "
    "'last-touch' the least recently touched; 'score' the lowest score; 'age' the oldest "
    "admission to HBM (each then the lower id). Float mode.",
    default="id",
)
EMA_TOUCH_RESETS_IDLE = Param(
    "true or false",
    lambda v: isinstance(v, bool),
    bool,
    "Whether a touch (a read of weight >= touch_threshold) zeroes the EMA's idle count; "
    "false: only an admission to HBM does, so idle counts steps since the entry was last "
    "brought in (the seed's 'accessed'). Float mode.",
    default=True,
)
TIE_COLUMNS = {"last-touch": "touch_t", "score": "score_", "age": "admit_t"}  # the policy's


def ema_rules(policy: type[Policy], config: PolicyConfig) -> tuple[str, bool]:
    """(tie-break, touch resets idle) of an EMA-family policy: its configured values when it
    declares the parameters, else the seed's ('id', True)."""
    if "ema_tie_break" not in policy.parameters:
        return "id", True
    return config.param("ema_tie_break"), config.param("ema_touch_resets_idle")


class EmaHistory(HistoryRule):
    """The EMA recomputed from each entry's reads, kept lazily (the audit's side).

    The score as of some completed step plus the weight pending in the current step
    (a step's largest), brought forward on demand through zero-weight steps (a closed form
    in float mode, the Q0.16 recurrence in integer mode), so nothing here touches every
    entry at every step; idle = steps since the step after the last touch.  The EMA's
    quantities live at :meth:`index` (the entry itself here; ``ema-position`` indexes
    them by block position).
    """

    def __init__(self, history: EntryHistory) -> None:
        int_mode = history.mode == "int"
        q = np.int64 if int_mode else np.float64
        self.columns = {
            "score": (q, 0),  # the EMA as of score_k
            "score_k": (np.int64, 0),
            "pend_w": (q, 0),  # the largest weight read in step pend_k
            "pend_k": (np.int64, -1),
            "idle_base": (np.int64, 0),  # idle = max(k − idle_base, 0)
            "touch_t": (np.int64, -1),  # batch time of the last touch (-1: none)
        }
        super().__init__(history)
        cfg = history.config
        from . import POLICIES  # (the registry: this rule's policy, by its name)

        self.tie_break, self.resets_idle = ema_rules(POLICIES[history.name], cfg)
        if int_mode:
            self.alpha_q = fx.alpha_to_q16(cfg.alpha)
            self.touch_q = fx.to_q16(cfg.touch_threshold)
            self.decay = fx.decay_table(cfg.beta, cfg.decay_shift)

    def index(self, ids: NDArray) -> NDArray:
        """Where the EMA quantities of ``ids`` live."""
        return ids

    def fresh(self, ids: NDArray) -> None:
        k = self.h.k
        self.score[ids] = 0
        self.pend_w[ids] = 0
        self.score_k[ids] = k
        self.pend_k[ids] = -1
        self.idle_base[ids] = k
        self.touch_t[ids] = -1

    def on_admit(self, ids: NDArray, time: int) -> None:
        if not self.resets_idle:  # an admission is what zeroes idle
            self.idle_base[self.index(ids)] = self.h.k + 1

    def anchor(self, ids: NDArray) -> NDArray:
        return self.h.first_token(ids) < self.h.config.anchor_zone_size

    def on_read(self, ids: NDArray, weights: NDArray, time: int) -> None:
        ids = self.index(ids)
        if self.h.mode == "int":
            wq = np.asarray(fx.to_q16(weights), dtype=np.int64)
            touch = wq >= self.touch_q
        else:
            wq = weights
            touch = weights >= self.h.config.touch_threshold
        self._settle(ids)
        k = self.h.k
        stale = self.pend_k[ids] != k
        self.pend_w[ids[stale]] = 0
        self.pend_k[ids] = k
        np.maximum.at(self.pend_w, ids, wq)
        self.touch_t[ids[touch]] = time
        if self.resets_idle:
            self.idle_base[ids[touch]] = k + 1

    def _settle(self, ids: NDArray) -> None:
        """Bring the EMA of ``ids`` forward to the end of the last completed step."""
        k = self.h.k
        p = self.pend_k[ids]
        done = (p >= 0) & (p < k)
        if done.any():  # the pending step's weight enters once, at its step's end
            d = ids[done]
            self._decay(d, self.pend_k[d])
            if self.h.mode == "int":
                self.score[d] = fx.ema_update_q16(self.score[d], self.pend_w[d], self.alpha_q)
            else:
                self.score[d] = ema_update(self.score[d], self.pend_w[d], self.h.config.alpha)
            self.score_k[d] = self.pend_k[d] + 1
            self.pend_k[d] = -1
            self.pend_w[d] = 0
        self._decay(ids, np.full(ids.size, k, np.int64))

    def _decay(self, ids: NDArray, to_k: NDArray) -> None:
        """Zero-weight EMA steps from ``score_k`` up to ``to_k``."""
        n = to_k - self.score_k[ids]
        if not (n > 0).any():
            return
        if self.h.mode == "int":
            s = self.score[ids].copy()
            left = n.copy()
            while (left > 0).any():
                m = left > 0
                nxt = np.asarray(fx.ema_update_q16(s[m], 0, self.alpha_q), dtype=np.int64)
                still = nxt != s[m]  # a fixed point stays put: stop early
                s[m] = nxt
                left[m] = np.where(still, left[m] - 1, 0)
            self.score[ids] = s
        else:
            self.score[ids] = ema_decay(self.score[ids], n, self.h.config.alpha)
        self.score_k[ids] = np.maximum(self.score_k[ids], to_k)

    def idle(self, ids: NDArray) -> NDArray:
        idle = np.maximum(self.h.k - self.idle_base[ids], 0)
        return np.minimum(idle, 65535) if self.h.mode == "int" else idle

    def priority(self, ids: NDArray, time: int) -> NDArray:
        p = self.index(ids)
        self._settle(p)
        if self.h.mode == "int":
            cfg = self.h.config
            return np.asarray(
                fx.eviction_priority_q16(self.score[p], self.idle(p), self.decay, cfg.decay_shift)
            )
        return np.asarray(eviction_priority(self.score[p], self.idle(p), self.h.config.beta))

    def tie(self, ids: NDArray, time: int) -> NDArray | None:
        if self.tie_break == "id":
            return None
        if self.tie_break == "age":
            return self.h.admitted[ids]
        p = self.index(ids)
        if self.tie_break == "score":
            self._settle(p)
            return self.score[p].copy()
        return self.touch_t[p]


@register
class EmaPolicy(Policy):
    name = "ema"
    summary = "EMA attention score × recency decay, anchors pinned (the seed's policy)"
    modes = ("float", "int")
    parameters = {"ema_tie_break": EMA_TIE_BREAK, "ema_touch_resets_idle": EMA_TOUCH_RESETS_IDLE}
    history = EmaHistory

    def __init__(self, config: PolicyConfig, table: EntryTable, mode: str = "float") -> None:
        if mode not in ("float", "int"):
            raise ValueError(f"mode = {mode!r}: must be 'float' or 'int'")
        self.mode = mode
        self.tie_break, self.resets_idle = ema_rules(type(self), config)
        if mode == "int" and (self.tie_break, self.resets_idle) != ("id", True):
            name, value = (
                ("ema_tie_break", self.tie_break)
                if self.tie_break != "id"
                else ("ema_touch_resets_idle", self.resets_idle)
            )
            raise ValueError(
                f"{name} = {value!r} is not in the Q0.16 contract (mode='int' keeps the "
                "entry-id tie-break and touch-resets-idle rule the RTL implements): use "
                "mode 'float' or the default"
            )
        if mode == "float":
            self.columns = {
                "score_": (np.float64, 0.0),
                "idle": (np.int64, 0),
                "w_step": (np.float64, 0.0),
                "touched": (np.bool_, False),
            }
            if self.tie_break == "last-touch":
                self.columns["touch_t"] = (np.int64, -1)  # batch time of the last touch
            if self.tie_break == "age":
                self.columns["admit_t"] = (np.int64, 0)  # batch time of the last admission
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
        if self.tie_break == "last-touch":
            self.touch_t[hit] = tick.time
        if self.resets_idle:
            self.touched[hit] = True
            self.idle[hit] = 0

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        super().on_insert(ids, tick)
        if self.tie_break == "age":
            self.admit_t[ids] = tick.time
        if not self.resets_idle:  # an admission zeroes idle, as a touch does otherwise
            self.touched[ids] = True
            self.idle[ids] = 0

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
            ema_update(s, w, self.config.alpha, out=s)
            idle = self.idle[:n]
            idle += 1
            idle[t] = 0
        w[:] = 0
        t[:] = False

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        if self.mode == "int":
            return golden_step.priorities(self.score_[ids], self.idle[ids], self.int_params)
        return np.asarray(eviction_priority(self.score_[ids], self.idle[ids], self.config.beta))

    def tie(self, ids: NDArray, tick: Tick) -> NDArray | None:
        if self.tie_break == "id":
            return None
        return getattr(self, TIE_COLUMNS[self.tie_break])[ids]

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
