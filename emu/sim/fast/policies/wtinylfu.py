"""W-TinyLFU (firmware/policies/wtinylfu.py): a window LRU (queue 1), a main cache of
probation (2) and protected (3) segments, and the TinyLFU sketch that decides whether the
window's victim replaces the main's.

The sketch is the firmware's (:mod:`kvcxl.firmware.sketch`): every entry id's counter
indices are computed at build by its own functions (``idx``, one row an id), so no hash is
compiled here (numba's cache would not see an edit of the firmware's); the counters
(``cnt``) have its dtype.  The walk keeps its increments in ``padd`` (the firmware's ``pending``
Counter), reset when it ends.  A walk's scratch is one row each (``ws``, ``ws2`` for the
rank walk): the entries moved to probation's and protected's heads (FIFO rings read after
each segment's offered entries), the moved ids and their queues, and the counted ids.
The batch's arrivals are counted after the pass (``pend``, the firmware's ``_pending``).
The firmware has no closed-form priority: a victim's is minus its rank in a walk over the
pass's victims alone (QueuePolicy.walk_rank), run on the uncommitted state.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvcxl.firmware.policies.wtinylfu import MAINS, PROBATION, PROTECTED, WINDOW
from kvcxl.firmware.sketch import counter_index, id_hashes

from ..hooks import Setup
from . import _queued as Q

COVERS = (("wtinylfu", "float"),)
State = Q.state_class(
    __name__,
    ("idx", "cnt", "padd", "pend", "ws", "ws2", "arrv2", "rk",
     "main", "p_share", "s_share", "main_share", "period", "hashes", "counters"),
)  # fmt: skip
# own scalars: main-cache reuses since the halving, pending arrivals and their batch time,
# the held walk's moves and counted window victims
_REUSES, _NPEND, _PTIME, _NM, _NC = Q.OWN, Q.OWN + 1, Q.OWN + 2, Q.OWN + 3, Q.OWN + 4
# rows of a walk's scratch
_EXT_P, _EXT_S, _MOVED, _MOVED_Q, _COUNTED = 0, 1, 2, 3, 4
_SLRU, _LRU = MAINS.index("slru"), MAINS.index("lru")


def build(setup: Setup) -> State:
    n, policy = setup.n, setup.policy
    sketch = policy.sketch  # WTinyLfuPolicy.set_capacity's, its counters all 0
    ha, hb = id_hashes(np.arange(n, dtype=np.int64))
    idx = counter_index(ha[:, None], hb[:, None], np.arange(sketch.k), sketch.n)
    small = np.int32 if sketch.n <= np.iinfo(np.int32).max else np.int64  # (half the bytes)
    st = State(
        **Q.base(setup, 3),
        idx=idx.astype(small), cnt=np.zeros_like(sketch.count),
        padd=np.zeros(sketch.n, np.int64), pend=np.zeros(n, np.int64),
        ws=np.zeros((5, n), np.int64), ws2=np.zeros((5, n), np.int64),
        arrv2=np.zeros(n, np.int64), rk=np.zeros(n, np.int64),
        main=MAINS.index(policy.params.wtinylfu_main),
        p_share=int(policy.shares[0]), s_share=int(policy.shares[1]),
        main_share=int(policy.main_share), period=int(policy.period),
        hashes=int(sketch.k), counters=int(sketch.n),
    )  # fmt: skip
    st.sc[_PTIME] = -1  # (the firmware's _pending_time before any admission)
    return st


# --- the sketch -----------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _add(ps, i):  # type: ignore[no-untyped-def]
    """FrequencySketch.add: every one of ``i``'s counters (a repeated index twice)."""
    for h in range(ps.hashes):
        ps.cnt[ps.idx[i, h]] += np.uint32(1)


@njit(cache=True, inline="always")
def _estimate(ps, i):  # type: ignore[no-untyped-def]
    """FrequencySketch.estimate with the walk's increments (``padd``)."""
    best = np.int64(-1)
    for h in range(ps.hashes):
        j = ps.idx[i, h]
        v = np.int64(ps.cnt[j]) + ps.padd[j]
        if best < 0 or v < best:
            best = v
    return best


@njit(cache=True)
def _flush(ps):  # type: ignore[no-untyped-def]
    """The arrivals are counted (WTinyLfuPolicy._flush)."""
    for j in range(ps.sc[_NPEND]):
        _add(ps, ps.pend[j])
    ps.sc[_NPEND] = 0


# --- events -------------------------------------------------------------------------------
@njit(cache=True)
def on_admit(ps, adm, na, t):  # type: ignore[no-untyped-def]
    _flush(ps)  # an earlier call's arrivals
    Q.admit(ps, adm, na)
    for j in range(na):  # WTinyLfuPolicy.place: the window's head, ascending
        Q.push(ps, ps.arr[j], WINDOW)
        ps.pend[j] = ps.arr[j]
    ps.sc[_NPEND] = na
    ps.sc[_PTIME] = t


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if t != ps.sc[_PTIME]:  # arrivals of an earlier batch
        _flush(ps)
    if not Q.first_read(ps, e):
        return False
    if ps.queue[e] == WINDOW:  # to the window's head, not counted
        Q.unlink(ps, e)
        Q.push(ps, e, WINDOW)
        return False
    if ps.main == _SLRU:
        Q.unlink(ps, e)
        Q.push(ps, e, PROTECTED)
        while ps.count[PROTECTED] > ps.s_share:
            x = ps.tail[PROTECTED]
            Q.unlink(ps, x)
            Q.push(ps, x, PROBATION)
    elif ps.main == _LRU:
        Q.unlink(ps, e)
        Q.push(ps, e, PROBATION)
    _add(ps, e)
    ps.sc[_REUSES] += 1
    if ps.sc[_REUSES] >= ps.period:  # TinyLFU's reset
        ps.sc[_REUSES] = 0
        for x in range(ps.counters):
            ps.cnt[x] >>= np.uint32(1)
    return False


# --- the pass -------------------------------------------------------------------------------
@njit(cache=True)
def _main_victim(ps, ws, cur, head, lo, hi, nq, pop):  # type: ignore[no-untyped-def]
    """The main's victim: probation's tail, else protected's (segment s = queue − 2 offers
    its live entries from the tail, then those the walk moved to its head); NONE: none."""
    for s in range(2):
        if head[s] == Q.NONE:
            if cur[s] != Q.NONE:
                head[s] = cur[s]
                cur[s] = Q.next_offered(ps, ps.newer[cur[s]])
            elif lo[s] < hi[s]:
                head[s] = ws[_EXT_P + s, lo[s]]
                lo[s] += 1
        i = head[s]
        if i != Q.NONE:
            if pop:
                head[s] = Q.NONE
                nq[s] -= 1
            return i
    return Q.NONE


@njit(cache=True)
def _walk(ps, k, out, ws):  # type: ignore[no-untyped-def]
    """WTinyLfuPolicy.walk over the offered entries: (victims, moves, counted) in ``ws``."""
    cur = np.empty(2, np.int64)
    head = np.full(2, Q.NONE, np.int64)
    lo = np.zeros(2, np.int64)
    hi = np.zeros(2, np.int64)
    nq = np.empty(2, np.int64)
    for s in range(2):
        cur[s] = Q.next_offered(ps, ps.tail[PROBATION + s])
        nq[s] = Q.live(ps, PROBATION + s)
    win = Q.next_offered(ps, ps.tail[WINDOW])
    nv = nm = nc = 0
    while nv < k:
        w = win
        if w == Q.NONE:
            out[nv] = _main_victim(ps, ws, cur, head, lo, hi, nq, True)
            nv += 1
            continue
        win = Q.next_offered(ps, ps.newer[w])
        to_main = nq[0] + nq[1] < ps.main_share
        if not to_main:
            m = _main_victim(ps, ws, cur, head, lo, hi, nq, False)
            if m != Q.NONE and _estimate(ps, w) > _estimate(ps, m):  # strictly more frequent
                out[nv] = _main_victim(ps, ws, cur, head, lo, hi, nq, True)
                to_main = True
            else:
                out[nv] = w
            nv += 1
        if to_main:  # the lowest segment with room, else probation
            s = 0 if nq[0] < ps.p_share else 1 if nq[1] < ps.s_share else 0
            ws[_EXT_P + s, hi[s]] = w
            hi[s] += 1
            nq[s] += 1
            ws[_MOVED, nm] = w
            ws[_MOVED_Q, nm] = PROBATION + s
            nm += 1
        ws[_COUNTED, nc] = w  # counted once more, whatever became of it
        nc += 1
        for h in range(ps.hashes):
            ps.padd[ps.idx[w, h]] += 1
    for c in range(nc):  # the walk's increments, back to none
        w = ws[_COUNTED, c]
        for h in range(ps.hashes):
            ps.padd[ps.idx[w, h]] = 0
    return nv, nm, nc


@njit(cache=True)
def select(ps, tab, cand, m, k, now, out):  # type: ignore[no-untyped-def]
    na = Q.offer(ps, cand, m, ps.arrv)
    k = min(k, m)
    nv, nm, nc = _walk(ps, min(k, m - na), out, ps.ws)
    ps.sc[_NM], ps.sc[_NC] = nm, nc
    Q.withdraw(ps, cand, m)
    nv = Q.take_arriving(ps.arrv, na, out, nv, k)
    Q.hold(ps, out, nv)
    return nv


@njit(cache=True)
def _ranks(ps):  # type: ignore[no-untyped-def]
    """QueuePolicy.walk_rank of the held victims, into ``rank``."""
    nv = ps.sc[Q.NV]
    na = Q.offer(ps, ps.vic, nv, ps.arrv2)
    got = _walk(ps, nv - na, ps.rk, ps.ws2)[0]
    Q.withdraw(ps, ps.vic, nv)
    got = Q.take_arriving(ps.arrv2, na, ps.rk, got, nv)
    for j in range(got):
        ps.rank[ps.rk[j]] = j
    ps.sc[Q.RANKED] = 1


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    if ps.sc[Q.RANKED] == 0:
        _ranks(ps)
    return -ps.rank[e]


@njit(cache=True)
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    if not Q.pending(ps):
        return
    for j in range(ps.sc[Q.NV]):
        Q.leave(ps, ps.vic[j])
    for j in range(ps.sc[_NM]):  # QueuePolicy.commit: the moves, in order (victims left)
        i = ps.ws[_MOVED, j]
        if ps.seq[i] >= 0:
            Q.unlink(ps, i)
            Q.push(ps, i, ps.ws[_MOVED_Q, j])
    for j in range(Q.survivors(ps)):  # the arrivals join the window after the movers
        Q.push(ps, ps.arrv[j], WINDOW)
    for j in range(ps.sc[_NC]):
        _add(ps, ps.ws[_COUNTED, j])
    _flush(ps)  # the batch's arrivals, after the pass
