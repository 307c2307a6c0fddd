"""An entry's own history, kept beside the policy, from which the audit recomputes priorities.

The top-k audit (:mod:`kvcxl.firmware.audit`) re-ranks the priorities the policy
computed, so it can catch a broken selection but never a wrong priority: an idle
counter not reset on a touch, a context length that shrank, a pin ignored, an
EMA stepped once too often.  :class:`EntryHistory` records, from the events the cache
sees (admissions, reads with their weights, evictions, step ends, context lengths),
the documented per-entry quantities in their plainest form — when an entry was
admitted, last read, last used; its reads and weights; the longest its context has
been; whether it holds a pin.

Each policy owns how its priority follows from that history: its class names a
:class:`HistoryRule` (``history``), written in the policy's own file from docs/policy.md
and kept apart from the policy's state on purpose (the rule is the second, plain
implementation the audit compares with), or says why its priority cannot be recomputed
from an entry's own history (``not_audited``).  :func:`kvcxl.firmware.policies.base.register`
refuses a policy that does neither, so no policy passes the audit in silence.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from .config import PolicyConfig
from .table import EntryTable, grow


class HistoryRule:
    """A policy's priority recomputed from an :class:`EntryHistory` (the audit's side).

    Subclasses may keep their own per-entry columns (``columns`` = {name: (dtype, fill)},
    reset to ``fill`` whenever an entry's state starts afresh) and override the event
    hooks they need; :meth:`priority` is the rule itself.
    """

    columns: ClassVar[dict[str, tuple[type, object]]] = {}

    def __init__(self, history: EntryHistory) -> None:
        self.h = history
        for c, (dtype, fill) in self.columns.items():
            setattr(self, c, np.full(16, fill, dtype=dtype))

    def ensure(self, n: int) -> None:
        for c, (_dtype, fill) in self.columns.items():
            setattr(self, c, grow(getattr(self, c), n, fill))

    def fresh(self, ids: NDArray) -> None:
        """``ids``' policy state starts afresh (created, or restarted without persistence)."""
        for c, (_dtype, fill) in self.columns.items():
            getattr(self, c)[ids] = fill

    def born(self, ids: NDArray) -> None:
        """``ids`` were created now (their first admission); :meth:`fresh` already ran."""

    def on_admit(self, ids: NDArray, time: int) -> None:
        """``ids`` became resident at batch ``time`` (after :meth:`fresh` and :meth:`born`)."""

    def on_read(self, ids: NDArray, weights: NDArray, time: int) -> None:
        """``ids`` were read at batch ``time`` with these attention weights."""

    def anchor(self, ids: NDArray) -> NDArray:
        """Which of ``ids`` the policy's pinning rule claims (none by default)."""
        return np.zeros(np.asarray(ids).size, dtype=bool)

    def priority(self, ids: NDArray, time: int) -> NDArray:
        """Each entry's priority by docs/policy.md, from the history alone."""
        raise NotImplementedError

    def tie(self, ids: NDArray, time: int) -> NDArray | None:
        """The policy's order among equal priorities (``Policy.tie``), from the history;
        None: the entry index alone."""
        return None


class EntryHistory:
    """Per-entry history of one cache, and its policy's priority recomputed from it."""

    _COLS: ClassVar[dict[str, tuple[type, object]]] = {
        "admitted": (np.int64, 0),  # batch time of the last admission
        "last_read": (np.int64, 0),  # batch time of the last read (0: never)
        "last_use": (np.int64, 0),  # last admission or read (LRU)
        "reads": (np.int64, 0),
        "weight_sum": (np.float64, 0.0),
        "pinned": (np.bool_, False),
        "known": (np.bool_, False),  # existed before (the table's entries at the start)
    }

    def __init__(self, policy: object, pinned_capacity: int) -> None:
        self.name: str = policy.name  # type: ignore[attr-defined]
        self.config: PolicyConfig = policy.config  # type: ignore[attr-defined]
        self.table: EntryTable = policy.table  # type: ignore[attr-defined]
        self.mode = getattr(policy, "mode", "float")
        self.pinned_capacity = int(pinned_capacity)
        self.n_pinned = 0
        self.k = 0  # completed decode steps (end_step calls)
        self.ctx_len = np.zeros(16, np.int64)  # longest each context has been
        for c, (dtype, fill) in self._COLS.items():
            setattr(self, c, np.full(16, fill, dtype=dtype))
        rule = type(policy).history
        if rule is None:
            raise ValueError(f"policy {self.name!r} has no history rule to audit")
        self.rule: HistoryRule = rule(self)
        table = self.table
        table.observers.append(self.on_lengths)
        if table.n:  # entries that exist before the history starts
            self.ensure(table.n)
            self.known[: table.n] = True
            known = np.flatnonzero(table.ctx_tokens)
            self.on_lengths(known, table.ctx_tokens[known])

    def ensure(self, n: int) -> None:
        for c, (_dtype, fill) in self._COLS.items():
            setattr(self, c, grow(getattr(self, c), n, fill))
        self.rule.ensure(n)

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
        self.rule.fresh(ids)

    def on_admit(self, ids: NDArray, time: int) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self.ensure(int(ids.max()) + 1)
        born = ids[~self.known[ids]]  # created now: fresh state from this step
        self._fresh(born)
        self.rule.born(born)
        self.known[born] = True
        if not self.config.persistent_metadata:
            self._fresh(ids)
        self.admitted[ids] = time
        self.last_use[ids] = time
        self.rule.on_admit(ids, time)
        # Pins: in ascending id order, anchors take free slots for good (docs/policy.md).
        free = self.pinned_capacity - self.n_pinned
        if free > 0:
            anchors = ids[self.rule.anchor(ids) & ~self.pinned[ids]][:free]
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
        self.rule.on_read(ids, w, time)

    def on_end_step(self) -> None:
        self.k += 1

    # --- what rules read ---------------------------------------------------------------
    def age_tokens(self, ids: NDArray) -> NDArray:
        """Tokens between an entry's last token and its context's newest (longest seen)."""
        bt = self.table.block_tokens
        last = self.table.block[ids].astype(np.int64) * bt + bt - 1
        return np.maximum(self.ctx_len[self.table.ctx[ids]] - 1 - last, 0)

    def first_token(self, ids: NDArray) -> NDArray:
        return self.table.block[ids].astype(np.int64) * self.table.block_tokens

    def priority(self, ids: NDArray, time: int) -> NDArray:
        """Each entry's priority from its history by its policy's rule (docs/policy.md)."""
        return np.asarray(self.rule.priority(np.asarray(ids, dtype=np.int64), time))

    def tie(self, ids: NDArray, time: int) -> NDArray | None:
        """Each entry's key among equal priorities by its policy's rule (None: the id alone)."""
        t = self.rule.tie(np.asarray(ids, dtype=np.int64), time)
        return None if t is None else np.asarray(t)
