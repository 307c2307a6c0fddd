"""Position-level EMA: one score per block position, shared by every head and layer.

The ablation ladder's alternative to per-head tracking (docs/design.md, "Validation
programme"): the device keeps one EMA and one idle counter per (context, block) instead
of one per (context, layer, KV head, block).  A position's weight in a step is the
largest weight any of its entries was read with in that step, and a touch of any of them
resets its idle counter; every entry of the position then carries the position's
priority ``(1 − score)·r`` (the formulas of ``ema``, firmware/formulas.py).  Anchors are
pinned as in ``ema``.  Float mode only; the fast engine does not cover it (numpy).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..config import PolicyConfig
from ..formulas import ema_update, eviction_priority
from ..history import EntryHistory
from ..table import EntryTable, grow
from .base import Policy, Tick, register
from .ema import EmaHistory


class Positions:
    """Dense position ids for entries, by (context, block); shared by policy and audit."""

    def __init__(self) -> None:
        self.of: dict[tuple[int, int], int] = {}
        self.pos = np.full(16, -1, dtype=np.int64)
        self.known = 0  # entries 0 … known−1 have a position

    def update(self, table: EntryTable) -> int:
        """Assign positions to entries added since the last call; returns the position count."""
        n = table.n
        self.pos = grow(self.pos, n, -1)
        if n > self.known:
            of = self.of
            ctx = table.ctx[self.known : n].tolist()
            blk = table.block[self.known : n].tolist()
            keys = zip(ctx, blk, strict=True)
            self.pos[self.known : n] = [of.setdefault(k, len(of)) for k in keys]
            self.known = n
        return len(self.of)

    def __call__(self, ids: NDArray) -> NDArray:
        return self.pos[np.asarray(ids, dtype=np.int64)]


class EmaPositionHistory(EmaHistory):
    """The EMA's history rule with its quantities indexed by position: born with the
    position's first entry and never forgotten (an entry's restart leaves them alone)."""

    def __init__(self, history: EntryHistory) -> None:
        super().__init__(history)
        self.positions = Positions()

    def index(self, ids: NDArray) -> NDArray:
        self.ensure(self.positions.update(self.h.table))
        return self.positions(ids)

    def fresh(self, ids: NDArray) -> None:
        pass  # per-position quantities survive any one entry's restart

    def born(self, ids: NDArray) -> None:
        if ids.size:
            seen = len(self.positions.of)
            p = self.index(ids)
            super().fresh(np.unique(p[p >= seen]))


@register
class EmaPositionPolicy(Policy):
    name = "ema-position"
    summary = "EMA × recency per block position, shared by all heads and layers; anchors pinned"
    ablation = True
    history = EmaPositionHistory

    def __init__(self, config: PolicyConfig, table: EntryTable) -> None:
        super().__init__(config, table)
        self.positions = Positions()
        z = lambda dt, fill=0: np.full(16, fill, dtype=dt)  # noqa: E731
        self.p_score = z(np.float64)
        self.p_idle = z(np.int64)
        self.p_w = z(np.float64)
        self.p_touched = z(np.bool_, False)

    def _sync(self) -> None:
        m = self.positions.update(self.table)
        self.p_score = grow(self.p_score, m, 0.0)
        self.p_idle = grow(self.p_idle, m, 0)
        self.p_w = grow(self.p_w, m, 0.0)
        self.p_touched = grow(self.p_touched, m, False)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        self._sync()
        p = self.positions(ids)
        w = np.asarray(weights, dtype=np.float64)
        np.maximum.at(self.p_w, p, w)
        hit = p[w >= self.config.touch_threshold]
        self.p_touched[hit] = True
        self.p_idle[hit] = 0

    def end_step(self, tick: Tick) -> None:
        self._sync()
        m = len(self.positions.of)
        s, w, t = self.p_score[:m], self.p_w[:m], self.p_touched[:m]
        ema_update(s, w, self.config.alpha, out=s)
        idle = self.p_idle[:m]
        idle += 1
        idle[t] = 0
        w[:] = 0
        t[:] = False

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        self._sync()
        p = self.positions(ids)
        return np.asarray(eviction_priority(self.p_score[p], self.p_idle[p], self.config.beta))

    def wants_pin(self, ids: NDArray) -> NDArray:
        return self.table.first_token(ids) < self.config.anchor_zone_size

    def score(self, ids: NDArray) -> NDArray:
        self._sync()
        return self.p_score[self.positions(ids)].astype(np.float64)

    def idle_steps(self, ids: NDArray) -> NDArray:
        self._sync()
        return self.p_idle[self.positions(ids)]
