"""The transfer log the replay records for the timeline (docs/timeline.md, "Input")."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..timing import TierTiming
from .resources import CXL_HBM, CXL_NVME, HBM_CXL, HBM_NVME, MOVES, NVME_CXL, NVME_HBM

#: The moves an eviction makes, in the order a record issues them.
EVICT_MOVES = (HBM_CXL, HBM_NVME, CXL_NVME)
#: A prefetch's fetches, in issue order.
FETCH_MOVES = (CXL_HBM, NVME_HBM)
#: A step boundary's moves (managed tiers' background moves and the CXL DRAM overflow they
#: cause), in issue order.
BACKGROUND_MOVES = (HBM_CXL, CXL_NVME, NVME_CXL)
#: The count columns of the array form (:class:`LogArrays`), in a record's issue order:
#: its demand fetches, its eviction's moves, its prefetch (fetches, then its eviction's),
#: a step boundary's moves.
COLUMNS = (
    tuple(("demand", k) for k in FETCH_MOVES)
    + tuple(("evict", k) for k in EVICT_MOVES)
    + tuple(("prefetch", k) for k in FETCH_MOVES + EVICT_MOVES)
    + tuple(("background", k) for k in BACKGROUND_MOVES)
)
#: Where each role's columns start and end in :data:`COLUMNS`.
PREFETCH_COLS = (COLUMNS.index(("prefetch", CXL_HBM)), COLUMNS.index(("prefetch", CXL_NVME)) + 1)
BACKGROUND_COLS = (COLUMNS.index(("background", HBM_CXL)), len(COLUMNS))
#: Each column's move code (an index into :data:`~.resources.MOVES`).
COLUMN_MOVE = tuple(MOVES.index(k) for _role, k in COLUMNS)


@dataclass
class Record:
    """One batch of the replay: a read (a layer batch) or a write (new KV into HBM); a step
    boundary's moves are a write record with only ``background`` moves.

    Counts are entries.  ``waits``: (index of the record whose prefetch brought them,
    entries) for the prefetched entries this read reads first."""

    read: bool
    pos: int = 0  # the read step it belongs to (index among the read steps)
    step: int = 0
    tokens: int = 0
    hits: int = 0
    reads: int = 0
    demand: dict[str, int] = field(default_factory=dict)  # CXL_HBM / NVME_HBM
    evict: dict[str, int] = field(default_factory=dict)  # EVICT_MOVES
    prefetch: dict[str, int] = field(default_factory=dict)  # FETCH_MOVES + EVICT_MOVES
    background: dict[str, int] = field(default_factory=dict)  # BACKGROUND_MOVES
    waits: list[tuple[int, int]] = field(default_factory=list)
    compute_ns: float = 0.0


@dataclass
class TransferLog:
    """Every record of one replay, in order, with the entry size."""

    entry_bytes: int
    records: list[Record] = field(default_factory=list)

    def add(self, rec: Record) -> int:
        """Append ``rec``; returns its index."""
        self.records.append(rec)
        return len(self.records) - 1

    def finish(self, t: TierTiming) -> None:
        """Fill every read record's compute time (:func:`compute_ns`)."""
        a = self.arrays()
        ns = compute_ns(a.read, a.pos, a.hits, a.reads, self.entry_bytes, t)
        for r, x in zip(self.records, ns.tolist(), strict=True):
            if r.read:
                r.compute_ns = x

    def arrays(self) -> LogArrays:
        """The log as arrays (what the fast engine emits, and the compiled scheduler reads)."""
        recs = self.records
        n = len(recs)
        cols = np.zeros((n, len(COLUMNS)), np.int64)
        for i, r in enumerate(recs):
            for c, (role, k) in enumerate(COLUMNS):
                cols[i, c] = getattr(r, role).get(k, 0)
        waits = [w for r in recs for w in r.waits]
        w = np.asarray(waits, np.int64).reshape(-1, 2)
        return LogArrays(
            self.entry_bytes,
            np.fromiter((r.read for r in recs), np.bool_, n),
            np.fromiter((r.pos for r in recs), np.int64, n),
            np.fromiter((r.step for r in recs), np.int64, n),
            np.fromiter((r.tokens for r in recs), np.int64, n),
            np.fromiter((r.hits for r in recs), np.int64, n),
            np.fromiter((r.reads for r in recs), np.int64, n),
            cols,
            np.concatenate([[0], np.cumsum([len(r.waits) for r in recs])]).astype(np.int64),
            w[:, 0].copy(),
            w[:, 1].copy(),
            np.fromiter((r.compute_ns for r in recs), np.float64, n),
        )


@dataclass
class LogArrays:
    """A transfer log as arrays, one row per record: ``moves[i, c]`` the entries of column
    :data:`COLUMNS` ``[c]``; record ``i``'s waits are ``wait_rec``/``wait_n`` over
    ``wait_off[i] : wait_off[i + 1]``.  A write record has pos, tokens, hits, reads 0."""

    entry_bytes: int
    read: NDArray  # bool
    pos: NDArray
    step: NDArray
    tokens: NDArray
    hits: NDArray
    reads: NDArray
    moves: NDArray  # (records, len(COLUMNS))
    wait_off: NDArray
    wait_rec: NDArray
    wait_n: NDArray
    compute_ns: NDArray

    def finish(self, t: TierTiming) -> None:
        """Fill the read records' compute time (:func:`compute_ns`)."""
        self.compute_ns = compute_ns(self.read, self.pos, self.hits, self.reads,
                                     self.entry_bytes, t)  # fmt: skip


def compute_ns(
    read: NDArray, pos: NDArray, hits: NDArray, reads: NDArray, eb: int, t: TierTiming
) -> NDArray:
    """Every read record's compute time ``C`` (docs/timeline.md, "Input"): its hits read from
    HBM, plus the GB10 decode model of its step (with ``compute_model``) spread over the
    step's read records; 0 for a write record."""
    ns = hits * eb / t.hbm_gbps
    if t.compute_model:
        per_step = np.bincount(pos[read], minlength=int(pos.max(initial=0)) + 1)
        k = np.maximum(per_step[pos], 1)  # (a write record's pos may hold no read)
        ns = ns + (t.compute_base_ms / k + t.compute_ms_per_gib * reads * eb / 2**30) * 1e6
    return np.where(read, ns, 0.0)


def moves_of(delta: dict[str, int], eb: int, keys: tuple[str, ...]) -> dict[str, int]:
    """Entries per move among ``keys`` of a bytes-moved delta (pairs with none left out)."""
    return {k: delta[k] // eb for k in keys if delta.get(k, 0) > 0}
