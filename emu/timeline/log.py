"""The transfer log the replay records for the timeline (docs/timeline.md, "Input")."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..timing import TierTiming
from .resources import CXL_HBM, CXL_NVME, HBM_CXL, HBM_NVME, NVME_HBM

#: The moves an eviction makes, in the order a record issues them.
EVICT_MOVES = (HBM_CXL, HBM_NVME, CXL_NVME)
#: A prefetch's fetches, in issue order.
FETCH_MOVES = (CXL_HBM, NVME_HBM)


@dataclass
class Record:
    """One batch of the replay: a read (a layer batch) or a write (new KV into HBM).

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
        """Fill every read record's compute time: its hits read from HBM, plus the GB10
        decode model of its step (with ``compute_model``) spread over the step's reads."""
        per_step: dict[int, int] = {}
        for r in self.records:
            if r.read:
                per_step[r.pos] = per_step.get(r.pos, 0) + 1
        eb = self.entry_bytes
        for r in self.records:
            if not r.read:
                continue
            ns = r.hits * eb / t.hbm_gbps
            if t.compute_model:
                ns += (t.compute_base_ms / per_step[r.pos]
                       + t.compute_ms_per_gib * r.reads * eb / 2**30) * 1e6  # fmt: skip
            r.compute_ns = ns


def moves_of(delta: dict[str, int], eb: int, keys: tuple[str, ...]) -> dict[str, int]:
    """Entries per move among ``keys`` of a bytes-moved delta (pairs with none left out)."""
    return {k: delta[k] // eb for k in keys if delta.get(k, 0) > 0}
