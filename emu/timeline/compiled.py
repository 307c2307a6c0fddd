"""The timeline's scheduler compiled with numba, for the fast engine's logs.

The same rules as :mod:`.engine` (docs/timeline.md), over the array forms
(:class:`~.log.LogArrays` in, :class:`~.engine.ScheduleArrays` out);
``tests/test_timeline_fast.py`` holds the two equal transfer by transfer and stage by
stage, and :mod:`.engine` is held to the SimPy twin.  The stage table is not written
again here: :func:`stage_table` reads it from :func:`.resources.stages`.

Two things differ in how, not in what:

* the waiting stages sit in one heap per resource set (at most six sets).  The engine's
  dispatch walks every waiting stage in (class, ready, transfer, stage) order and starts
  each whose resources are free; free servers only decrease during the walk, so a stage
  behind an unstartable one of the same set is unstartable too, and the walk starts
  exactly what "repeatedly start the least startable head" starts, in the same order
  (so the busy time is summed in the same order, to the bit);
* a read's gate is a list of transfer numbers rechecked whenever the chain is advanced,
  as in the engine.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .engine import ScheduleArrays
from .log import BACKGROUND_COLS, COLUMN_MOVE, COLUMNS, PREFETCH_COLS, LogArrays
from .resources import (
    BACKGROUND,
    CXL_NVME,
    DEMAND,
    MOVES,
    PREFETCH,
    RESOURCE_NAMES,
    Resources,
    stages,
)  # fmt: skip

_ROLE = {"demand": DEMAND, "evict": DEMAND, "prefetch": PREFETCH, "background": BACKGROUND}
#: Per log column: its move code and class (a CXL -> NVMe spill and a step boundary's moves
#: are background; a background transfer gates nothing).
_COL_MOVE = np.asarray(COLUMN_MOVE, np.int64)
_COL_CLS = np.asarray(
    [BACKGROUND if k == CXL_NVME else _ROLE[role] for role, k in COLUMNS], np.int64
)
_READY, _END = 0, 1
_PF_LO, _PF_HI = PREFETCH_COLS
_BG_LO, _BG_HI = BACKGROUND_COLS


def stage_table(res: Resources) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per move code: its number of stages, and per stage its resources (a bit per
    :data:`~.resources.RESOURCE_NAMES`), fixed latency and latency per NVMe round, read
    from :func:`~.resources.stages` (a stage's latency is fixed + rounds × per round)."""
    qd = res.nvme_queue_depth
    nst = np.zeros(len(MOVES), np.int64)
    mask = np.zeros((len(MOVES), 2), np.int64)
    fixed = np.zeros((len(MOVES), 2), np.float64)
    per_round = np.zeros((len(MOVES), 2), np.float64)
    for m, move in enumerate(MOVES):
        one, two = stages(move, 1, res), stages(move, qd + 1, res)  # one round, two rounds
        nst[m] = len(one)
        for k, ((l1, held), (l2, _)) in enumerate(zip(one, two, strict=True)):
            mask[m, k] = sum(1 << RESOURCE_NAMES.index(x) for x in held)
            per_round[m, k] = l2 - l1
            fixed[m, k] = l1 - per_round[m, k]
    return nst, mask, fixed, per_round


def run(log: LogArrays, res: Resources) -> ScheduleArrays:
    """Schedule every transfer of ``log`` on ``res`` (docs/timeline.md): the compiled
    :func:`.engine.run`."""
    nst, mask, fixed, per_round = stage_table(res)
    servers = np.asarray([res.servers()[k] for k in RESOURCE_NAMES], np.int64)
    gbps = np.asarray([res.gbps()[k] for k in RESOURCE_NAMES], np.float64)
    out = _schedule(
        log.read.astype(np.bool_), log.moves, log.wait_off, log.wait_rec,
        np.asarray(log.compute_ns, np.float64), int(log.entry_bytes), _COL_MOVE, _COL_CLS,
        nst, mask, fixed, per_round, int(res.nvme_queue_depth), servers, gbps,
    )  # fmt: skip
    *arrays, horizon, ok = out
    if not ok:
        raise RuntimeError("timeline ended with records or stages unserved")
    return ScheduleArrays(*arrays, horizon_ns=float(horizon))


@njit(cache=True, inline="always")
def _latency(fixed, per_round, m, k, n, qd):  # type: ignore[no-untyped-def]
    """Stage ``k`` of move ``m`` of ``n`` entries: its latency (rounds = ceil(n / qd))."""
    return fixed[m, k] + per_round[m, k] * ((n + qd - 1) // qd)


@njit(cache=True, inline="always")
def _less(cls, ready, a, b):  # type: ignore[no-untyped-def]
    """Stage ``a`` goes before stage ``b``: (class, ready, stage number) — stage numbers
    run in (transfer, stage) order."""
    if cls[a] != cls[b]:
        return cls[a] < cls[b]
    if ready[a] != ready[b]:
        return ready[a] < ready[b]
    return a < b


@njit(cache=True, inline="always")
def _wpush(heap, base, size, sid, cls, ready):  # type: ignore[no-untyped-def]
    i = size
    heap[base + i] = sid
    while i > 0:
        p = (i - 1) // 2
        if _less(cls, ready, heap[base + i], heap[base + p]):
            heap[base + i], heap[base + p] = heap[base + p], heap[base + i]
            i = p
        else:
            break
    return size + 1


@njit(cache=True, inline="always")
def _wpop(heap, base, size, cls, ready):  # type: ignore[no-untyped-def]
    size -= 1
    heap[base] = heap[base + size]
    i = 0
    while True:
        lo = i
        for c in (2 * i + 1, 2 * i + 2):
            if c < size and _less(cls, ready, heap[base + c], heap[base + lo]):
                lo = c
        if lo == i:
            return size
        heap[base + i], heap[base + lo] = heap[base + lo], heap[base + i]
        i = lo


@njit(cache=True, inline="always")
def _epush(et, ev, size, t, x):  # type: ignore[no-untyped-def]
    """The event heap by time (``x`` = stage number × 2 + kind).  The order of the events
    of one instant does not matter: all are handled before the chain moves and dispatch
    runs."""
    i = size
    et[i], ev[i] = t, x
    while i > 0:
        p = (i - 1) // 2
        if et[i] < et[p]:
            et[i], et[p] = et[p], et[i]
            ev[i], ev[p] = ev[p], ev[i]
            i = p
        else:
            break
    return size + 1


@njit(cache=True, inline="always")
def _epop(et, ev, size):  # type: ignore[no-untyped-def]
    size -= 1
    et[0], ev[0] = et[size], ev[size]
    i = 0
    while True:
        lo = i
        c = 2 * i + 1
        if c < size and et[c] < et[lo]:
            lo = c
        if c + 1 < size and et[c + 1] < et[lo]:
            lo = c + 1
        if lo == i:
            return size
        et[i], et[lo] = et[lo], et[i]
        ev[i], ev[lo] = ev[lo], ev[i]
        i = lo


@njit(cache=True, inline="always")
def _issue(tr, st, x, s0, i, m, cls, n, t, nst, fixed, per_round, qd, et, ev, esize):  # type: ignore[no-untyped-def]
    """Issue transfer ``x`` (record ``i``, move ``m``, class ``cls``, ``n`` entries) at ``t``:
    its stages from number ``s0`` on, the first one ready after its latency.  Returns the
    event heap's new size."""
    tr_rec, tr_move, tr_cls, tr_n, tr_issue, tr_st0 = tr
    st_tr, st_k, st_cls, st_ready = st
    tr_rec[x], tr_move[x], tr_cls[x], tr_n[x] = i, m, cls, n
    tr_issue[x] = t
    tr_st0[x] = s0
    for k in range(nst[m]):
        st_tr[s0 + k] = x
        st_k[s0 + k] = k
        st_cls[s0 + k] = cls
    st_ready[s0] = t + _latency(fixed, per_round, m, 0, n, qd)
    return _epush(et, ev, esize, st_ready[s0], 2 * s0 + _READY)


@njit(cache=True)
def _schedule(  # type: ignore[no-untyped-def]
    read, moves, wait_off, wait_rec, compute_ns, eb, col_move, col_cls,
    nst, mask, fixed, per_round, qd, servers, gbps,
):  # fmt: skip
    n_rec, n_col = moves.shape
    # every transfer and stage, counted up front (a transfer per non-zero column)
    n_tr = 0
    n_st = 0
    per_mask = np.zeros(16, np.int64)
    for i in range(n_rec):
        for c in range(n_col):
            if moves[i, c] > 0:
                m = col_move[c]
                n_tr += 1
                n_st += nst[m]
                for k in range(nst[m]):
                    per_mask[mask[m, k]] += 1
    base = np.zeros(16, np.int64)  # each resource set's segment of the waiting heaps
    for s in range(1, 16):
        base[s] = base[s - 1] + per_mask[s - 1]
    wheap = np.empty(n_st, np.int64)
    used = np.flatnonzero(per_mask)  # the resource sets any stage needs
    wsize = np.zeros(16, np.int64)
    # transfers and stages
    tr_rec = np.empty(n_tr, np.int64)
    tr_move = np.empty(n_tr, np.int64)
    tr_cls = np.empty(n_tr, np.int64)
    tr_n = np.empty(n_tr, np.int64)
    tr_issue = np.empty(n_tr, np.float64)
    tr_end = np.full(n_tr, np.nan)
    tr_st0 = np.empty(n_tr, np.int64)  # its first stage's number
    st_tr = np.empty(n_st, np.int64)
    st_k = np.empty(n_st, np.int64)
    st_cls = np.empty(n_st, np.int64)
    st_ready = np.empty(n_st, np.float64)
    st_start = np.empty(n_st, np.float64)
    st_end = np.empty(n_st, np.float64)
    a = np.full(n_rec, np.nan)
    r = np.full(n_rec, np.nan)
    cc = np.full(n_rec, np.nan)
    pf = np.full(n_rec, np.nan)
    grp_lo = np.full(n_rec, -1, np.int64)  # a record's prefetch group: transfers lo .. hi-1
    grp_hi = np.full(n_rec, -1, np.int64)  # (its fetches and write-backs, issued together)
    free = servers.copy()
    busy = np.zeros(4, np.float64)
    nbytes = np.zeros(4, np.int64)
    # events: a READY and an END per stage (a compute's end is the chain's own next time,
    # not an event: the engine's timer only wakes the chain, which this loop does)
    cap = 2 * n_st + 1
    et = np.empty(cap, np.float64)
    ev = np.empty(cap, np.int64)
    esize = 0
    gate = np.empty(n_tr + 1, np.int64)
    n_gate = 0
    pend = np.empty(n_tr + 1, np.int64)
    n_pend = 0
    ntr = 0
    nst_used = 0
    i = 0
    state = 0  # 0 idle, 1 gate, 2 compute
    compute_end = 0.0
    t = 0.0
    while True:
        while True:
            while esize > 0 and et[0] == t:
                kind, x = ev[0] & 1, ev[0] >> 1
                esize = _epop(et, ev, esize)
                if kind == _READY:
                    ms = mask[tr_move[st_tr[x]], st_k[x]]
                    wsize[ms] = _wpush(wheap, base[ms], wsize[ms], x, st_cls, st_ready)
                elif kind == _END:
                    tid, k = st_tr[x], st_k[x]
                    ms = mask[tr_move[tid], k]
                    for q in range(4):
                        if ms >> q & 1:
                            free[q] += 1
                    mv = tr_move[tid]
                    if k + 1 < nst[mv]:
                        y = x + 1
                        st_ready[y] = t + _latency(fixed, per_round, mv, k + 1, tr_n[tid], qd)
                        esize = _epush(et, ev, esize, st_ready[y], 2 * y + _READY)
                    else:
                        tr_end[tid] = t
            # the compute chain, as far as it goes at t
            while True:
                if state == 2:
                    if t < compute_end:
                        break
                    state = 0
                if state == 0:
                    if i == n_rec:
                        break
                    if read[i]:
                        a[i] = t
                    lo_c = 0 if read[i] else 2  # a write record: its eviction's moves
                    # then the background ones (a step boundary's), past the prefetch's
                    for q in range(lo_c, _PF_LO + _BG_HI - _BG_LO):
                        c = q if q < _PF_LO else q - _PF_LO + _BG_LO
                        n = moves[i, c]
                        if n <= 0:
                            continue
                        m = col_move[c]
                        tr = (tr_rec, tr_move, tr_cls, tr_n, tr_issue, tr_st0)
                        st = (st_tr, st_k, st_cls, st_ready)
                        esize = _issue(tr, st, ntr, nst_used, i, m, col_cls[c], n, t, nst,
                                       fixed, per_round, qd, et, ev, esize)  # fmt: skip
                        if col_cls[c] != BACKGROUND:
                            if read[i]:
                                gate[n_gate] = ntr
                                n_gate += 1
                            else:
                                pend[n_pend] = ntr
                                n_pend += 1
                        nst_used += nst[m]
                        ntr += 1
                    if not read[i]:
                        i += 1
                        continue
                    for q in range(n_pend):
                        gate[n_gate] = pend[q]
                        n_gate += 1
                    n_pend = 0
                    for w in range(wait_off[i], wait_off[i + 1]):
                        j = wait_rec[w]
                        if grp_lo[j] >= 0:
                            for x in range(grp_lo[j], grp_hi[j]):
                                if tr_cls[x] != BACKGROUND:
                                    gate[n_gate] = x
                                    n_gate += 1
                    state = 1
                if state == 1:
                    done = True
                    for q in range(n_gate):
                        if np.isnan(tr_end[gate[q]]):
                            done = False
                            break
                    if not done:
                        break
                    n_gate = 0
                    r[i] = t
                    lo = ntr
                    any_gated = False
                    for c in range(_PF_LO, _PF_HI):
                        n = moves[i, c]
                        if n <= 0:
                            continue
                        m = col_move[c]
                        tr = (tr_rec, tr_move, tr_cls, tr_n, tr_issue, tr_st0)
                        st = (st_tr, st_k, st_cls, st_ready)
                        esize = _issue(tr, st, ntr, nst_used, i, m, col_cls[c], n, t, nst,
                                       fixed, per_round, qd, et, ev, esize)  # fmt: skip
                        if col_cls[c] != BACKGROUND:
                            any_gated = True
                        nst_used += nst[m]
                        ntr += 1
                    if any_gated:
                        grp_lo[i], grp_hi[i] = lo, ntr
                    compute_end = t + compute_ns[i]
                    cc[i] = compute_end
                    state = 2
                    i += 1
            if not (esize > 0 and et[0] == t):
                break
        # dispatch: the least startable head, again and again (see the module's docstring)
        while True:
            best = -1
            for ms in used:
                if wsize[ms] == 0:
                    continue
                ok = True
                for q in range(4):
                    if ms >> q & 1 and free[q] <= 0:
                        ok = False
                        break
                if not ok:
                    continue
                h = wheap[base[ms]]
                if best < 0 or _less(st_cls, st_ready, h, best):
                    best = h
            if best < 0:
                break
            tid = st_tr[best]
            ms = mask[tr_move[tid], st_k[best]]
            wsize[ms] = _wpop(wheap, base[ms], wsize[ms], st_cls, st_ready)
            b = tr_n[tid] * eb
            bw = np.inf
            for q in range(4):
                if ms >> q & 1 and gbps[q] < bw:
                    bw = gbps[q]
            dur = b / bw
            for q in range(4):
                if ms >> q & 1:
                    free[q] -= 1
                    busy[q] += dur
                    nbytes[q] += b
            st_start[best] = t
            st_end[best] = t + dur
            esize = _epush(et, ev, esize, t + dur, 2 * best + _END)
        if state == 2 and compute_end > t and (esize == 0 or compute_end < et[0]):
            t = compute_end  # (the chain's next time comes before any event)
        elif esize == 0:
            break
        else:
            t = et[0]
    ok = i == n_rec and wsize.sum() == 0
    for j in range(n_rec):
        if grp_lo[j] >= 0:
            x = -np.inf
            for y in range(grp_lo[j], grp_hi[j]):
                if tr_cls[y] != BACKGROUND and tr_end[y] > x:
                    x = tr_end[y]
            pf[j] = x
    horizon = 0.0
    have = False
    for y in range(n_tr):
        if not have or tr_end[y] > horizon:
            horizon = tr_end[y]
            have = True
    for j in range(n_rec):
        if read[j] and (not have or cc[j] > horizon):
            horizon = cc[j]
            have = True
    return (tr_rec, tr_move, tr_cls, tr_n, tr_issue, tr_end, st_tr, st_k, st_ready,
            st_start, st_end, a, r, cc, pf, busy, nbytes, horizon, ok)  # fmt: skip
