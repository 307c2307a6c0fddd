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

A queue policy as the main (CLOCK, SIEVE, S3-FIFO, ARC: _tinymains.py) keeps its state in
layers (_layers.py): the pass plays the main's part in a layer over the live state (V1;
V2 for the rank walk), each operation in a layer over that (a peek whose victim stays is
dropped), and the commit merges the pass into the live state.  A reuse in the main and an
admission (ARC's ghosts) change the live state at once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvcxl.firmware.policies.wtinylfu import MAINS, PROBATION, PROTECTED, WINDOW
from kvcxl.firmware.sketch import counter_index, id_hashes

from ..hooks import Setup
from . import _layers as L
from . import _queued as Q
from . import _tinymains as M

COVERS = (("wtinylfu", "float"),)
State = Q.state_class(
    __name__,
    ("idx", "cnt", "padd", "pend", "ws", "ws2", "arrv2", "rk",
     "main", "p_share", "s_share", "main_share", "period", "hashes", "counters",
     "lcol", "lst", "ltouch", "lhd", "lpf", "lmeta",
     "clock_max", "s3_small", "s3_main", "s3_ghost", "s3_threshold", "arc_cap"),
)  # fmt: skip
# own scalars: main-cache reuses since the halving, pending arrivals and their batch time,
# the held walk's moves and counted window victims
_REUSES, _NPEND, _PTIME, _NM, _NC = Q.OWN, Q.OWN + 1, Q.OWN + 2, Q.OWN + 3, Q.OWN + 4
# rows of a walk's scratch
_EXT_P, _EXT_S, _MOVED, _MOVED_Q, _COUNTED = 0, 1, 2, 3, 4
_SLRU, _LRU = MAINS.index("slru"), MAINS.index("lru")
_QUEUE_MAIN = min(M.CLOCK, M.SIEVE, M.S3FIFO, M.ARC)  # codes from here on: a queue policy


def build(setup: Setup) -> State:
    n, policy = setup.n, setup.policy
    sketch = policy.sketch  # WTinyLfuPolicy.set_capacity's, its counters all 0
    ha, hb = id_hashes(np.arange(n, dtype=np.int64))
    idx = counter_index(ha[:, None], hb[:, None], np.arange(sketch.k), sketch.n)
    small = np.int32 if sketch.n <= np.iinfo(np.int32).max else np.int64  # (half the bytes)
    main = policy.main  # the queue-policy main (WTinyLfuPolicy.set_capacity's), or None

    def par(name: str, default: float) -> float:
        return getattr(main, name, default) if main is not None else default

    def own(name: str, default: int) -> int:  # the main's own parameter
        return int(getattr(main.params, name, default)) if main is not None else default

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
        **M.fields(n if main is not None else 1),  # (one entry: never read)
        clock_max=(1 << own("clock_bits", 1)) - 1,
        s3_small=float(par("small_share", 0.0)), s3_main=float(par("main_share", 0.0)),
        s3_ghost=int(par("ghost_len", 0)),
        s3_threshold=own("s3fifo_move_threshold", 1),
        arc_cap=int(par("capacity", 0)),
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
    if ps.main == M.ARC:  # ArcMain.admitted: ids back from its ghosts
        L.begin_pass(ps, L.V1)
        L.begin_op(ps, L.V1)
        M.admitted(ps, L.V1, ps.arr, na)
        L.keep(ps, L.V1)
        L.commit(ps, L.V1)
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
    elif ps.main >= _QUEUE_MAIN:  # the main policy's own reuse
        L.begin_pass(ps, L.V1)
        L.begin_op(ps, L.V1)
        M.reuse(ps, L.V1, e)
        L.keep(ps, L.V1)
        L.commit(ps, L.V1)
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
def _walk_queue_main(ps, k, out, ws, v, cand, m):  # type: ignore[no-untyped-def]
    """WTinyLfuPolicy._walk_main over the offered entries (among ``cand[:m]``): the main's
    part played in layer ``v``; (victims, moves, counted) as :func:`_walk`."""
    L.begin_pass(ps, v)
    n_main = ps.lhd[v, L.COUNT + 1] + ps.lhd[v, L.COUNT + 2]
    n_off = 0  # the main's entries that may leave
    for j in range(m):
        e = cand[j]
        if ps.ok[e] and ps.lcol[L.LIVE, M.WHERE, e] != 0:
            n_off += 1
    win = Q.next_offered(ps, ps.tail[WINDOW])
    peek = Q.NONE  # the main's victim, its pop open in layer U while the main is unchanged
    nv = nm = nc = 0
    while nv < k:
        w = win
        if w == Q.NONE:
            if peek == Q.NONE:
                L.begin_op(ps, v)
                peek = M.pop(ps, v)
            L.keep(ps, v)
            out[nv] = peek
            nv += 1
            n_off -= 1
            n_main -= 1
            peek = Q.NONE
            continue
        win = Q.next_offered(ps, ps.newer[w])
        to_main = n_main < ps.main_share
        if to_main:
            n_main += 1
        else:
            if n_off > 0 and peek == Q.NONE:
                L.begin_op(ps, v)
                peek = M.pop(ps, v)
            if peek != Q.NONE and _estimate(ps, w) > _estimate(ps, peek):  # strictly more
                L.keep(ps, v)
                out[nv] = peek
                n_off -= 1
                peek = Q.NONE
                to_main = True
            else:
                out[nv] = w
            nv += 1
        if to_main:  # MainCache.join
            L.begin_op(ps, v)
            M.join(ps, v, w)
            L.keep(ps, v)
            n_off += 1
            ws[_MOVED, nm] = w
            nm += 1
        ws[_COUNTED, nc] = w  # counted once more, whatever became of it
        nc += 1
        for h in range(ps.hashes):
            ps.padd[ps.idx[w, h]] += 1
    if peek != Q.NONE:  # (its victim stays: the peek is undone)
        L.drop(ps)
    for c in range(nc):  # the walk's increments, back to none
        w = ws[_COUNTED, c]
        for h in range(ps.hashes):
            ps.padd[ps.idx[w, h]] = 0
    return nv, nm, nc


@njit(cache=True)
def select(ps, tab, cand, m, k, now, out):  # type: ignore[no-untyped-def]
    na = Q.offer(ps, cand, m, ps.arrv)
    k = min(k, m)
    if ps.main >= _QUEUE_MAIN:
        nv, nm, nc = _walk_queue_main(ps, min(k, m - na), out, ps.ws, L.V1, cand, m)
    else:
        nv, nm, nc = _walk(ps, min(k, m - na), out, ps.ws)
    ps.sc[_NM], ps.sc[_NC] = nm, nc
    return Q.close_walk(ps, cand, m, na, out, nv, k)


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    if ps.sc[Q.RANKED] == 0:  # QueuePolicy.walk_rank of the held victims, once a pass
        nv, na = Q.offer_held(ps)
        if ps.main >= _QUEUE_MAIN:
            got = _walk_queue_main(ps, nv - na, ps.rk, ps.ws2, L.V2, ps.vic, nv)[0]
        else:
            got = _walk(ps, nv - na, ps.rk, ps.ws2)[0]
        Q.keep_ranks(ps, na, got)
    return -ps.rank[e]


@njit(cache=True)
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    if not Q.leave_held(ps):
        return
    if ps.main >= _QUEUE_MAIN:  # WTinyLfuPolicy.commit: out of the window, the main's pass
        for j in range(ps.sc[_NM]):
            Q.unlink(ps, ps.ws[_MOVED, j])
        L.commit(ps, L.V1)
    for j in range(ps.sc[_NM] if ps.main < _QUEUE_MAIN else 0):
        i = ps.ws[_MOVED, j]  # QueuePolicy.commit: the moves, in order (victims left)
        if ps.seq[i] >= 0:
            Q.unlink(ps, i)
            Q.push(ps, i, ps.ws[_MOVED_Q, j])
    for j in range(Q.survivors(ps)):  # the arrivals join the window after the movers
        Q.push(ps, ps.arrv[j], WINDOW)
    for j in range(ps.sc[_NC]):
        _add(ps, ps.ws[_COUNTED, j])
    _flush(ps)  # the batch's arrivals, after the pass
