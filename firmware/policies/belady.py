"""Belady's offline optimum (OPT): evict the entry whose next read is farthest away.

It is given the future of the trace as a :class:`Future`.  An entry never read
again has priority +inf.  With demand paging (prefetch off) no online policy
can beat its hit count on the same request stream.

Two variants: ``belady`` may bypass (evict what it just read or wrote, when that is
read again latest), the upper bound of every online policy here; ``belady-nobypass``
is the classic demand-paging OPT that libCacheSim's ``Belady`` implements (the
entries just read or written are never its victims), so the two can be compared
hit for hit (tests/test_firmware_libcachesim.py).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..config import PolicyConfig
from ..table import EntryTable
from .base import Policy, Tick, register

NEVER = np.iinfo(np.int64).max


class Future:
    """Every (entry id, time) read of a request stream, for next-use look-ups."""

    def __init__(self, ids: NDArray, times: NDArray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        times = np.asarray(times, dtype=np.int64)
        if ids.shape != times.shape:
            raise ValueError("ids and times must have the same length")
        if ids.size and (ids.min() < 0 or times.min() < 0):
            raise ValueError("ids and times must be non-negative")
        # One sorted key per read: id·span + time, so a single searchsorted finds next uses.
        self.span = int(times.max()) + 2 if times.size else 2
        if ids.size and int(ids.max()) >= NEVER // self.span:
            raise ValueError("trace too large for 64-bit next-use keys")
        self.keys = np.sort(ids * self.span + times)

    @classmethod
    def from_batches(cls, batches: list[NDArray]) -> Future:
        """Batch i of the list is read at time i."""
        sizes = [len(b) for b in batches]
        ids = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else []
        times = np.repeat(np.arange(len(batches), dtype=np.int64), sizes)
        return cls(np.asarray(ids, dtype=np.int64), times)

    def next_use(self, ids: NDArray, now: int) -> NDArray:
        """The first time strictly after ``now`` each id is read, or NEVER."""
        ids = np.asarray(ids, dtype=np.int64)
        now = min(int(now), self.span - 1)
        pos = np.searchsorted(self.keys, ids * self.span + now, side="right")
        pos_c = np.minimum(pos, self.keys.size - 1)
        found = (
            (pos < self.keys.size) & (self.keys[pos_c] // self.span == ids)
            if self.keys.size
            else np.zeros(ids.size, bool)
        )
        return np.where(found, self.keys[pos_c] % self.span if self.keys.size else 0, NEVER)


@register
class BeladyPolicy(Policy):
    name = "belady"
    summary = "Belady's offline optimum (sees the future of the trace)"
    online = False
    may_bypass = True
    not_audited = "its key is each entry's next use in the trace: the future, an input, not history"

    def __init__(
        self, config: PolicyConfig, table: EntryTable, future: Future | None = None
    ) -> None:
        super().__init__(config, table)
        if future is None:
            raise ValueError(f"the {self.name} policy needs the future of the trace (future=...)")
        self.future = future

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return self.future.next_use(ids, tick.time)


@register
class BeladyNoBypassPolicy(BeladyPolicy):
    name = "belady-nobypass"
    summary = (
        "Belady's offline optimum without bypass: the classic OPT libCacheSim implements "
        "(never evicts what it just read or wrote)"
    )
    may_bypass = False
