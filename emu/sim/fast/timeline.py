"""The fast engine's transfer log (docs/timeline.md, "Input"): the rows the compiled loop
emits, the same records as the numpy engine's :class:`kvcxl.emu.timeline.TransferLog`.

The loop calls :func:`open_record` once per write call and per read call (and
:func:`hit_records` for a run of one-read hits the request granularity serves without
calls), and :func:`close` at its end.  A record's eviction moves are not counted where
they happen: a record takes a snapshot of the three eviction counters of ``moved`` at its
read step when it opens, and the next record (or :func:`close`) books the difference.
Only a step boundary moves entries between two calls (managed tiers' background moves),
and no record holds those (the numpy engine settles them before the next call's record
opens): the loop brackets them with :func:`outside` and :func:`inside`.  Prefetch columns
and waits stay empty: the fast engine does not prefetch with the timeline
(:func:`kvcxl.emu.sim.fast.unsupported`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.emu.sim.fast.kernel import CXL, HBM, NVME
from kvcxl.emu.timeline.log import COLUMNS, FETCH_MOVES, LogArrays
from kvcxl.emu.timeline.resources import CXL_NVME, HBM_CXL, HBM_NVME

# The row layout: read, pos, step, tokens, hits, reads, then the log's COLUMNS.
_META = 6
DEMAND_CXL, DEMAND_NVME = (_META + COLUMNS.index(("demand", k)) for k in FETCH_MOVES)
EV_CXL, EV_NVME, EV_SPILL = (
    _META + COLUMNS.index(("evict", k)) for k in (HBM_CXL, HBM_NVME, CXL_NVME)
)
WIDTH = _META + len(COLUMNS)


class Log(NamedTuple):
    """The loop's log: ``rows`` (records × :data:`WIDTH`; no rows: the timeline is off) and
    ``st`` = (records so far, the open record's read step, its three snapshots)."""

    rows: NDArray
    st: NDArray


def buffer(on: bool, n_batches: int, n_reads: int, per_request: bool) -> Log:
    """An empty log with room for every record of the plan: at most a write and a read call
    per batch, per read at the request granularity (none when ``on`` is False)."""
    cap = 2 * (n_batches + (n_reads if per_request else 0)) if on else 0
    return Log(np.empty((cap, WIDTH), np.int64), np.zeros(5, np.int64))


def arrays(log: Log, entry_bytes: int) -> LogArrays:
    """The emitted records as the timeline's array form (compute times not yet filled)."""
    n = int(log.st[0])
    rows = log.rows[:n]
    zeros = np.zeros(n + 1, np.int64)
    return LogArrays(
        entry_bytes, rows[:, 0].astype(np.bool_), rows[:, 1].copy(), rows[:, 2].copy(),
        rows[:, 3].copy(), rows[:, 4].copy(), rows[:, 5].copy(), rows[:, _META:].copy(),
        zeros, zeros[:0], zeros[:0], np.zeros(n, np.float64),
    )  # fmt: skip


@njit(inline="always")
def _book(rows, st, moved):  # type: ignore[no-untyped-def]
    """The open record's eviction moves: the counters now minus its snapshots."""
    k, p = st[0] - 1, st[1]
    rows[k, EV_CXL] = moved[p, HBM, CXL] - st[2]
    rows[k, EV_NVME] = moved[p, HBM, NVME] - st[3]
    rows[k, EV_SPILL] = moved[p, CXL, NVME] - st[4]


@njit(inline="always")
def open_record(log, read, pos, step, tokens, hits, reads, c_cxl, c_nvme, moved):  # type: ignore[no-untyped-def]
    """A call begins (its demand fetches promoted, nothing evicted yet): book the previous
    record's moves, open this one."""
    rows, st = log.rows, log.st
    if rows.shape[0] == 0:
        return
    if st[0] > 0:
        _book(rows, st, moved)
    k = st[0]
    rows[k, :] = 0
    rows[k, 0] = 1 if read else 0
    if read:  # (a write record keeps pos 0, as the numpy engine's)
        rows[k, 1] = pos
        rows[k, 3] = tokens
        rows[k, 4] = hits
        rows[k, 5] = reads
        rows[k, DEMAND_CXL] = c_cxl
        rows[k, DEMAND_NVME] = c_nvme
    rows[k, 2] = step
    st[0] = k + 1
    st[1] = pos
    st[2] = moved[pos, HBM, CXL]
    st[3] = moved[pos, HBM, NVME]
    st[4] = moved[pos, CXL, NVME]


@njit(inline="always")
def hit_records(log, h, pos, step, tokens, moved):  # type: ignore[no-untyped-def]
    """``h`` one-read batches that hit (the first carries the step's ``tokens``)."""
    if log.rows.shape[0] == 0:
        return
    for q in range(h):
        open_record(log, True, pos, step, tokens if q == 0 else 0, 1, 1, 0, 0, moved)


@njit(inline="always")
def outside(log, moved):  # type: ignore[no-untyped-def]
    """Entries are about to move outside every call: book the open record's moves now."""
    if log.rows.shape[0] > 0 and log.st[0] > 0:
        _book(log.rows, log.st, moved)


@njit(inline="always")
def inside(log, moved):  # type: ignore[no-untyped-def]
    """The moves since :func:`outside` are done: move the open record's snapshots past
    them, so that its later booking leaves them out."""
    rows, st = log.rows, log.st
    if rows.shape[0] == 0 or st[0] == 0:
        return
    k, p = st[0] - 1, st[1]
    st[2] = moved[p, HBM, CXL] - rows[k, EV_CXL]
    st[3] = moved[p, HBM, NVME] - rows[k, EV_NVME]
    st[4] = moved[p, CXL, NVME] - rows[k, EV_SPILL]


@njit(inline="always")
def close(log, moved):  # type: ignore[no-untyped-def]
    """The loop ended: book the last record's moves."""
    if log.rows.shape[0] > 0 and log.st[0] > 0:
        _book(log.rows, log.st, moved)
