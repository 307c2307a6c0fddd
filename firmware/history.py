"""An entry's own history, kept beside the policy, from which the audit recomputes priorities.

The top-k audit (:mod:`kvcxl.firmware.audit`) re-ranks the priorities the policy
computed, so it can catch a broken selection but never a wrong priority: an idle
counter not reset on a touch, a context length that shrank, a pin ignored, an
EMA stepped once too often.  This module records, from the events the cache
sees (admissions, reads with their weights, evictions, step ends, context
lengths), the documented per-entry quantities in their plainest form — when an
entry was admitted, last read, last touched; its reads and weights; the longest
its context has been — and recomputes each policy's priority from them by the
documented formulas of docs/policy.md (the formula functions themselves are the
firmware's one definition; the state they are applied to is this history's own).

``ema-position`` keeps one EMA per block position (firmware/policies/ema_position.py): its
EMA quantities (score, pending weight, idle base) are indexed by position instead of by
entry, born with the position's first entry and never forgotten.

EMA scores are kept lazily: the score as of some completed step plus the weight
pending in the current step, brought forward on demand through zero-weight steps
(a closed form in float mode, the Q0.16 recurrence in integer mode), so nothing
here touches every entry at every step.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from . import fixedpoint as fx
from .config import PolicyConfig
from .formulas import eviction_priority
from .policies.ema_position import Positions
from .table import EntryTable, grow, unique_ids

_TIME_SPAN = 1 << 40  # LFU's documented order: read count, then last read time


class EntryHistory:
    """Per-entry history of one cache, and each policy's priority recomputed from it."""

    def __init__(self, policy: object, pinned_capacity: int) -> None:
        self.name: str = policy.name  # type: ignore[attr-defined]
        self.config: PolicyConfig = policy.config  # type: ignore[attr-defined]
        self.table: EntryTable = policy.table  # type: ignore[attr-defined]
        self.policy = policy
        self.mode = getattr(policy, "mode", "float")
        self.pinned_capacity = int(pinned_capacity)
        self.n_pinned = 0
        self.k = 0  # completed decode steps (end_step calls)
        self.ctx_len = np.zeros(16, np.int64)  # longest each context has been
        z = lambda dt, fill=0: np.full(16, fill, dtype=dt)  # noqa: E731
        self.admitted = z(np.int64)  # batch time of the last admission
        self.last_read = z(np.int64)  # batch time of the last read (0: never)
        self.last_use = z(np.int64)  # last admission or read (LRU)
        self.reads = z(np.int64)
        self.weight_sum = z(np.float64)
        self.log_crf = z(np.float64, -np.inf)
        self.crf_time = z(np.int64)
        self.idle_base = z(np.int64)  # idle = max(k − idle_base, 0)
        int_mode = self.mode == "int"
        self.score = z(np.int64 if int_mode else np.float64)  # EMA as of score_k
        self.score_k = z(np.int64)
        self.pend_w = z(np.int64 if int_mode else np.float64)  # largest weight in pend_k
        self.pend_k = z(np.int64, -1)
        self.pinned = z(np.bool_, False)
        # ema-position: EMA columns are indexed by position (None: by entry)
        self.positions = Positions() if self.name == "ema-position" else None
        self.known = z(np.bool_, False)  # existed before (the table's entries at the start)
        if int_mode:
            self.alpha_q = fx.alpha_to_q16(self.config.alpha)
            self.touch_q = fx.to_q16(self.config.touch_threshold)
            self.decay = fx.decay_table(self.config.beta, self.config.decay_shift)
        table = self.table
        table.observers.append(self.on_lengths)
        if table.n:  # entries that exist before the history starts
            self.ensure(table.n)
            self.known[: table.n] = True
            known = np.flatnonzero(table.ctx_tokens)
            self.on_lengths(known, table.ctx_tokens[known])

    _COLS = ("admitted", "last_read", "last_use", "reads", "weight_sum", "log_crf", "crf_time",
             "idle_base", "score", "score_k", "pend_w", "pend_k", "pinned", "known")  # fmt: skip
    _FILL = {"log_crf": -np.inf, "pend_k": -1, "pinned": False, "known": False}

    def ensure(self, n: int) -> None:
        for c in self._COLS:
            setattr(self, c, grow(getattr(self, c), n, self._FILL.get(c, 0)))

    # --- what the history records ------------------------------------------------------
    def on_lengths(self, ctx: NDArray, tokens: NDArray) -> None:
        """A context is at least ``tokens`` long (every length report the table receives)."""
        ctx = np.asarray(ctx, dtype=np.int64)
        if ctx.size:
            self.ctx_len = grow(self.ctx_len, int(ctx.max()) + 1)
            np.maximum.at(self.ctx_len, ctx, np.asarray(tokens, dtype=np.int64))

    def _fresh(self, ids: NDArray) -> None:
        """Classic (non-persistent) state starts afresh."""
        for c in ("reads", "weight_sum", "last_read"):
            getattr(self, c)[ids] = 0
        self.log_crf[ids] = -np.inf
        self.crf_time[ids] = 0
        if self.positions is None:
            self._fresh_ema(ids)

    def _fresh_ema(self, ids: NDArray) -> None:
        self.score[ids] = 0
        self.pend_w[ids] = 0
        self.score_k[ids] = self.k
        self.pend_k[ids] = -1
        self.idle_base[ids] = self.k

    def _ema_index(self, ids: NDArray) -> NDArray:
        """Where the EMA quantities of ``ids`` live: the entries, or their positions."""
        if self.positions is None:
            return ids
        self.ensure(self.positions.update(self.table))
        return self.positions(ids)

    def on_admit(self, ids: NDArray, time: int) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self.ensure(int(ids.max()) + 1)
        born = ids[~self.known[ids]]  # created now: score 0 and idle 0 from this step
        self._fresh(born)
        if self.positions is not None and born.size:  # a position is born with its first entry
            seen = len(self.positions.of)
            p = self._ema_index(born)
            self._fresh_ema(np.unique(p[p >= seen]))
        self.known[born] = True
        if not self.config.persistent_metadata:
            self._fresh(ids)
        self.admitted[ids] = time
        self.last_use[ids] = time
        # Pins: in ascending id order, anchors take free slots for good (docs/policy.md).
        free = self.pinned_capacity - self.n_pinned
        if free > 0:
            anchors = ids[self._anchor(ids) & ~self.pinned[ids]][:free]
            self.pinned[anchors] = True
            self.n_pinned += anchors.size

    def on_forget(self, ids: NDArray) -> None:
        """The policy was told to start ``ids`` afresh: so does their history."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size:
            self.ensure(int(ids.max()) + 1)
            self._fresh(ids)
            self.last_use[ids] = 0
            self.admitted[ids] = 0

    def on_read(self, ids: NDArray, weights: NDArray, time: int) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        w = np.asarray(weights, dtype=np.float64)
        self.last_read[ids] = time
        self.last_use[ids] = time
        np.add.at(self.reads, ids, 1)
        np.add.at(self.weight_sum, ids, w)
        lam = self.config.param("lrfu_lambda")
        u = unique_ids(ids)
        self.log_crf[u] = np.logaddexp2(self.log_crf[u] - lam * (time - self.crf_time[u]), 0.0)
        self.crf_time[u] = time
        if self.name not in ("ema", "ema-position"):
            return
        ids = self._ema_index(ids)
        if self.mode == "int":
            wq = np.asarray(fx.to_q16(w), dtype=np.int64)
            touch = wq >= self.touch_q
        else:
            wq = w
            touch = w >= self.config.touch_threshold
        self._settle(ids)
        stale = self.pend_k[ids] != self.k
        self.pend_w[ids[stale]] = 0
        self.pend_k[ids] = self.k
        np.maximum.at(self.pend_w, ids, wq)
        self.idle_base[ids[touch]] = self.k + 1

    def on_end_step(self) -> None:
        self.k += 1

    # --- the documented quantities, recomputed -------------------------------------------
    def _settle(self, ids: NDArray) -> None:
        """Bring the EMA of ``ids`` forward to the end of the last completed step."""
        k = self.k
        p = self.pend_k[ids]
        done = (p >= 0) & (p < k)
        if done.any():  # the pending step's weight enters once, at its step's end
            d = ids[done]
            self._decay(d, self.pend_k[d])
            if self.mode == "int":
                self.score[d] = fx.ema_update_q16(self.score[d], self.pend_w[d], self.alpha_q)
            else:
                a = self.config.alpha
                self.score[d] = self.score[d] * (1.0 - a) + a * self.pend_w[d]
            self.score_k[d] = self.pend_k[d] + 1
            self.pend_k[d] = -1
            self.pend_w[d] = 0
        self._decay(ids, np.full(ids.size, k, np.int64))

    def _decay(self, ids: NDArray, to_k: NDArray) -> None:
        """Zero-weight EMA steps from ``score_k`` up to ``to_k``."""
        n = to_k - self.score_k[ids]
        if not (n > 0).any():
            return
        if self.mode == "int":
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
            self.score[ids] = self.score[ids] * (1.0 - self.config.alpha) ** np.maximum(n, 0)
        self.score_k[ids] = np.maximum(self.score_k[ids], to_k)

    def idle(self, ids: NDArray) -> NDArray:
        idle = np.maximum(self.k - self.idle_base[ids], 0)
        return np.minimum(idle, 65535) if self.mode == "int" else idle

    def age_tokens(self, ids: NDArray) -> NDArray:
        bt = self.table.block_tokens
        last = self.table.block[ids].astype(np.int64) * bt + bt - 1
        return np.maximum(self.ctx_len[self.table.ctx[ids]] - 1 - last, 0)

    def _anchor(self, ids: NDArray) -> NDArray:
        first = self.table.block[ids].astype(np.int64) * self.table.block_tokens
        if self.name in ("ema", "ema-position", "lru-anchor"):
            return first < self.config.anchor_zone_size
        if self.name in ("sink-window", "h2o"):
            return first < self.config.param("sink_tokens")
        return np.zeros(ids.size, dtype=bool)

    def priority(self, ids: NDArray, time: int) -> NDArray | None:
        """Each entry's priority from its history by docs/policy.md (None: not recomputable)."""
        ids = np.asarray(ids, dtype=np.int64)
        name, cfg = self.name, self.config
        if name == "ema":
            self._settle(ids)
            if self.mode == "int":
                return np.asarray(
                    fx.eviction_priority_q16(
                        self.score[ids], self.idle(ids), self.decay, cfg.decay_shift
                    )
                )
            return np.asarray(eviction_priority(self.score[ids], self.idle(ids), cfg.beta))
        if name == "ema-position":
            p = self._ema_index(ids)
            self._settle(p)
            return np.asarray(eviction_priority(self.score[p], self.idle(p), cfg.beta))
        if name in ("lru", "lru-anchor"):
            return -self.last_use[ids]
        if name == "fifo":
            return -self.admitted[ids]
        if name == "lfu":
            if self.config.param("lfu_tie_break") == "index":
                return -self.reads[ids]
            return -(self.reads[ids] * _TIME_SPAN + self.last_read[ids])
        if name == "lrfu":
            return -(self.log_crf[ids] - cfg.param("lrfu_lambda") * (time - self.crf_time[ids]))
        if name == "sink-window":
            return self.age_tokens(ids)
        if name == "h2o":
            recent = self.age_tokens(ids) < cfg.param("recent_tokens")
            return np.where(recent, -np.inf, -self.weight_sum[ids])
        return None  # random, offline policies: their keys are inputs, not history
