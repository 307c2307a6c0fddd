"""The fast engine's transfer log (docs/timeline.md, "Input"): the rows the compiled loop
emits, the same records as the numpy engine's :class:`kvcxl.emu.timeline.TransferLog`.

The loop calls :func:`open_record` once per write call and per read call (and
:func:`hit_records` for a run of one-read hits the request granularity serves without
calls), and :func:`close` at its end.  A record's eviction moves are not counted where
they happen: a record takes a snapshot of the three eviction counters of ``moved`` at its
read step when it opens, and the next record (or :func:`close`) books the difference.
Only a step boundary moves entries between two calls (managed tiers' background moves):
the loop brackets them with :func:`outside` and :func:`inside`, and :func:`boundary`
writes them as a record of their own (a write record with background moves only, sealed),
as the numpy engine settles them before the next call's record opens.  A read's
prefetch belongs to its record: :func:`prefetch_begins` books the read's eviction and
snapshots the prefetch columns (its fetches, then its eviction's moves), which the next
booking fills; :func:`add_waits` gives the read record its waits on earlier prefetches.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.emu.sim.fast.kernel import CXL, HBM, NVME
from kvcxl.emu.timeline.log import BACKGROUND_MOVES, COLUMNS, FETCH_MOVES, LogArrays
from kvcxl.emu.timeline.resources import (
    CXL_HBM,
    CXL_NVME,
    HBM_CXL,
    HBM_NVME,
    NVME_CXL,
    NVME_HBM,
)

# The row layout: read, pos, step, tokens, hits, reads, then the log's COLUMNS.
_META = 6
DEMAND_CXL, DEMAND_NVME = (_META + COLUMNS.index(("demand", k)) for k in FETCH_MOVES)
EV_CXL, EV_NVME, EV_SPILL = (
    _META + COLUMNS.index(("evict", k)) for k in (HBM_CXL, HBM_NVME, CXL_NVME)
)
PF_CXL, PF_NVME, PF_EV_CXL, PF_EV_NVME, PF_EV_SPILL = (
    _META + COLUMNS.index(("prefetch", k)) for k in (CXL_HBM, NVME_HBM, HBM_CXL, HBM_NVME,
                                                      CXL_NVME)
)  # fmt: skip
WIDTH = _META + len(COLUMNS)
_TIER = {HBM_CXL: (HBM, CXL), CXL_NVME: (CXL, NVME), NVME_CXL: (NVME, CXL)}
# A step boundary's moves: (its column, source tier, destination), in BACKGROUND_MOVES order.
_BACKGROUND = np.array(
    [[_META + COLUMNS.index(("background", k)), *_TIER[k]] for k in BACKGROUND_MOVES], np.int64
)
# What a record books, as (its column, the move's source tier, its destination): its
# eviction's moves, and once its prefetch began, the prefetch's fetches and its eviction's.
_EVICT = np.array([[EV_CXL, HBM, CXL], [EV_NVME, HBM, NVME], [EV_SPILL, CXL, NVME]], np.int64)
_PREFETCH = np.array(
    [[PF_CXL, CXL, HBM], [PF_NVME, NVME, HBM], [PF_EV_CXL, HBM, CXL],
     [PF_EV_NVME, HBM, NVME], [PF_EV_SPILL, CXL, NVME]], np.int64,
)  # fmt: skip
# st: records so far, the open record's read step, its three eviction snapshots, whether it
# books its eviction (0), its prefetch (1) or nothing more (2: sealed), the prefetch's five
# snapshots, waits so far, a step boundary's three snapshots
_EV0, _MODE, _PF0, _NW, _BG0 = 2, 5, 6, 11, 12


class Log(NamedTuple):
    """The loop's log: ``rows`` (records × :data:`WIDTH`; no rows: the timeline is off),
    ``st`` (the emission's state, above), and the waits: ``w_cnt`` per record, ``w_rec`` and
    ``w_n`` (the record whose prefetch brought them, how many) in record order."""

    rows: NDArray
    st: NDArray
    w_cnt: NDArray
    w_rec: NDArray
    w_n: NDArray


def buffer(on: bool, n_batches: int, n_reads: int, per_request: bool) -> Log:
    """An empty log with room for every record of the plan: at most a write and a read call
    per batch, per read at the request granularity, a step boundary per batch and one after
    the last, and a wait per read (none when ``on`` is False)."""
    cap = 3 * n_batches + 2 * (n_reads if per_request else 0) + 1 if on else 0
    nw = n_reads if on else 0
    return Log(np.empty((cap, WIDTH), np.int64), np.zeros(15, np.int64), np.zeros(cap, np.int64),
               np.empty(nw, np.int64), np.empty(nw, np.int64))  # fmt: skip


def arrays(log: Log, entry_bytes: int) -> LogArrays:
    """The emitted records as the timeline's array form (compute times not yet filled)."""
    n, nw = int(log.st[0]), int(log.st[_NW])
    rows = log.rows[:n]
    wait_off = np.concatenate([[0], np.cumsum(log.w_cnt[:n])]).astype(np.int64)
    return LogArrays(
        entry_bytes, rows[:, 0].astype(np.bool_), rows[:, 1].copy(), rows[:, 2].copy(),
        rows[:, 3].copy(), rows[:, 4].copy(), rows[:, 5].copy(), rows[:, _META:].copy(),
        wait_off, log.w_rec[:nw].copy(), log.w_n[:nw].copy(), np.zeros(n, np.float64),
    )  # fmt: skip


@njit(inline="always")
def _booking(st):  # type: ignore[no-untyped-def]
    """What the open record books now (its table and where its snapshots start in ``st``)."""
    if st[_MODE] == 1:
        return _PREFETCH, _PF0
    return _EVICT, _EV0


@njit(inline="always")
def _snap(st, at, table, moved, p):  # type: ignore[no-untyped-def]
    for i in range(table.shape[0]):
        st[at + i] = moved[p, table[i, 1], table[i, 2]]


@njit(inline="always")
def _book(rows, st, moved):  # type: ignore[no-untyped-def]
    """The open record's eviction moves (or, once its prefetch began, the prefetch's): the
    counters now minus its snapshots."""
    if st[_MODE] == 2:
        return
    k, p = st[0] - 1, st[1]
    table, at = _booking(st)
    for i in range(table.shape[0]):
        rows[k, table[i, 0]] = moved[p, table[i, 1], table[i, 2]] - st[at + i]


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
    log.w_cnt[k] = 0
    st[0] = k + 1
    st[1] = pos
    st[_MODE] = 0
    _snap(st, _EV0, _EVICT, moved, pos)


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
    if st[_MODE] == 2:
        return
    k, p = st[0] - 1, st[1]
    table, at = _booking(st)
    for i in range(table.shape[0]):
        st[at + i] = moved[p, table[i, 1], table[i, 2]] - rows[k, table[i, 0]]


@njit(inline="always")
def boundary_begins(log, moved, pos):  # type: ignore[no-untyped-def]
    """A step boundary is about to move entries (booked at read step ``pos``): snapshot its
    moves' counters (after :func:`outside`)."""
    if log.rows.shape[0] > 0:
        _snap(log.st, _BG0, _BACKGROUND, moved, pos)


@njit(inline="always")
def boundary(log, moved, pos, step):  # type: ignore[no-untyped-def]
    """The step boundary's moves are done (after :func:`inside`): if it moved anything, a
    record of its own, a write record at ``step`` holding them as background moves, sealed
    (the next record books nothing into it)."""
    rows, st = log.rows, log.st
    if rows.shape[0] == 0:
        return
    any_ = False
    for i in range(_BACKGROUND.shape[0]):
        if moved[pos, _BACKGROUND[i, 1], _BACKGROUND[i, 2]] != st[_BG0 + i]:
            any_ = True
    if not any_:
        return
    k = st[0]
    rows[k, :] = 0
    rows[k, 2] = step
    for i in range(_BACKGROUND.shape[0]):
        rows[k, _BACKGROUND[i, 0]] = moved[pos, _BACKGROUND[i, 1], _BACKGROUND[i, 2]] - st[_BG0 + i]
    log.w_cnt[k] = 0
    st[0] = k + 1
    st[1] = pos
    st[_MODE] = 2


@njit(inline="always")
def close(log, moved):  # type: ignore[no-untyped-def]
    """The loop ended: book the last record's moves."""
    if log.rows.shape[0] > 0 and log.st[0] > 0:
        _book(log.rows, log.st, moved)


@njit(inline="always")
def prefetch_begins(log, moved):  # type: ignore[no-untyped-def]
    """The open read record's prefetch is about to fetch: book its eviction now; what moves
    from here on is its prefetch's."""
    rows, st = log.rows, log.st
    if rows.shape[0] == 0 or st[0] == 0:
        return
    _book(rows, st, moved)
    st[_MODE] = 1
    _snap(st, _PF0, _PREFETCH, moved, st[1])


@njit(inline="always")
def seal(log, moved):  # type: ignore[no-untyped-def]
    """A read call is about to promote its misses: a record that books its prefetch books it
    now (the next record's fetches are not its own)."""
    st = log.st
    if log.rows.shape[0] > 0 and st[0] > 0 and st[_MODE] == 1:
        _book(log.rows, st, moved)
        st[_MODE] = 2


@njit(cache=True)
def add_waits(log, recs, m):  # type: ignore[no-untyped-def]
    """The open read record reads ``m`` prefetched entries first, brought by the records
    ``recs[:m]``: its waits, one per record (ascending), with how many each brought."""
    if log.rows.shape[0] == 0 or m == 0:
        return
    st = log.st
    r = np.sort(recs[:m])
    k = st[0] - 1
    nw = st[_NW]
    j = 0
    while j < m:
        q = j
        while q < m and r[q] == r[j]:
            q += 1
        log.w_rec[nw] = r[j]
        log.w_n[nw] = q - j
        nw += 1
        log.w_cnt[k] += 1
        j = q
    st[_NW] = nw
