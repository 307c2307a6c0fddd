"""S3-FIFO (firmware/policies/s3fifo.py): a small FIFO, a main FIFO with a 2-bit CLOCK, and
a ghost FIFO of ids (a linked list over ids: ``gold``/``gnew``, in it where ``gq`` is 1).

The walk keeps its moves to main's head in a FIFO ring (``ext``: the order of their last
moves, as the firmware's plan has them), their counters in ``wval`` (stamped ``wst``), and
the small-queue victims whose ids enter the ghost in ``ghl``; the commit applies them.
The firmware has no closed-form priority: a victim's is minus its rank in a walk over the
pass's victims alone (QueuePolicy.walk_rank), run on the uncommitted state the first time
a dump asks (a second set of scratch arrays, ``*2``, keeps the plan intact).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvcxl.firmware.policies.s3fifo import MAIN, MAIN_CAP, SMALL

from ..hooks import Setup
from . import _queued as Q

COVERS = (("s3fifo", "float"),)
State = Q.state_class(
    __name__,
    ("freq", "gold", "gnew", "gq", "ghead", "gtail", "gcount", "ghin",
     "ext", "wval", "wst", "ghl", "rk", "arrv2", "ext2", "wval2", "wst2", "ghl2",
     "small_share", "main_share", "ghost_len", "threshold"),
)  # fmt: skip
# own scalars: the plan's ring ends and ghosted count, has_evicted, the admissions so far
_LO, _HI, _NG, _EVICTED, _ADMITS = Q.OWN, Q.OWN + 1, Q.OWN + 2, Q.OWN + 3, Q.OWN + 4


def build(setup: Setup) -> State:
    n, policy = setup.n, setup.policy

    def ids() -> np.ndarray:
        return np.zeros(n, np.int64)

    return State(
        **Q.base(setup, 2),
        freq=setup.column(0, np.int64),
        gold=setup.column(Q.NONE, np.int64), gnew=setup.column(Q.NONE, np.int64),
        gq=setup.column(0, np.int64), ghead=np.full(2, Q.NONE, np.int64),
        gtail=np.full(2, Q.NONE, np.int64), gcount=np.zeros(2, np.int64),
        ghin=ids(),
        ext=np.zeros(n + 1, np.int64), wval=ids(), wst=ids(), ghl=ids(),
        rk=ids(), arrv2=ids(), ext2=np.zeros(n + 1, np.int64), wval2=ids(), wst2=ids(),
        ghl2=ids(),
        # S3FifoPolicy.set_capacity's shares (it refused a capacity too small already)
        small_share=float(policy.small_share), main_share=float(policy.main_share),
        ghost_len=int(policy.ghost_len),
        threshold=int(policy.params.s3fifo_move_threshold),
    )  # fmt: skip


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if Q.first_read(ps, e):
        ps.freq[e] += 1
    return False


@njit(cache=True)
def _place(ps, ids, na):  # type: ignore[no-untyped-def]
    """S3FifoPolicy.place: main if the id came back from the ghost, or small is full before
    the first eviction; else small."""
    n_small = Q.live(ps, SMALL)
    for j in range(na):
        i = ids[j]
        warm = ps.sc[_EVICTED] == 0 and n_small >= ps.small_share
        to_main = ps.ghin[i] == ps.sc[_ADMITS] or warm
        Q.push(ps, i, MAIN if to_main else SMALL)
        if not to_main:
            n_small += 1


@njit(cache=True)
def on_admit(ps, adm, na, t):  # type: ignore[no-untyped-def]
    ps.sc[_ADMITS] += 1
    Q.admit(ps, adm, na)
    for j in range(na):
        i = ps.arr[j]
        if ps.gq[i]:  # back from the ghost: out of it, into main
            Q.lunlink(ps.gold, ps.gnew, ps.ghead, ps.gtail, ps.gcount, ps.gq, i)
            ps.ghin[i] = ps.sc[_ADMITS]
    _place(ps, ps.arr, na)


@njit(cache=True)
def _walk(ps, k, out, ext, wval, wst, ghl):  # type: ignore[no-untyped-def]
    """S3FifoPolicy.walk over the offered entries: (victims, ring ends, ghosted)."""
    p = Q.next_pass(ps)
    n_main = Q.live(ps, MAIN)
    small = Q.next_offered(ps, ps.tail[SMALL])
    mi = Q.next_offered(ps, ps.tail[MAIN])  # main's cursor, then the ring
    lo = hi = nv = ng = 0
    while nv < k:
        # from main when over its share or small offers nothing, unless main offers nothing
        if (n_main > ps.main_share or small == Q.NONE) and (mi != Q.NONE or lo < hi):
            if mi != Q.NONE:
                i = mi
                mi = Q.next_offered(ps, ps.newer[mi])
            else:
                i = ext[lo % ext.size]
                lo += 1
            f = wval[i] if wst[i] == p else ps.freq[i]
            if f >= 1:
                wval[i] = min(f, MAIN_CAP) - 1
                wst[i] = p
                hi = Q.ring_push(ext, hi, i)
            else:
                out[nv] = i
                nv += 1
                n_main -= 1
        elif small == Q.NONE:
            raise AssertionError("s3fifo walk ran out of entries")
        else:
            while small != Q.NONE:
                i = small
                small = Q.next_offered(ps, ps.newer[small])
                if ps.freq[i] >= ps.threshold:
                    wval[i] = 0
                    wst[i] = p
                    hi = Q.ring_push(ext, hi, i)
                    n_main += 1
                else:
                    out[nv] = i
                    nv += 1
                    ghl[ng] = i
                    ng += 1
                    break
    return nv, lo, hi, ng


@njit(cache=True)
def _choose(ps, m, na, k, out):  # type: ignore[no-untyped-def]
    """The walk of an offer of ``m`` (``na`` of them arriving): its victims, its plan kept."""
    nv, lo, hi, ng = _walk(ps, min(k, m - na), out, ps.ext, ps.wval, ps.wst, ps.ghl)
    ps.sc[_LO], ps.sc[_HI], ps.sc[_NG] = lo, hi, ng
    return nv


select, select_all = Q.selects(_choose)


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    if ps.sc[Q.RANKED] == 0:  # QueuePolicy.walk_rank of the held victims, once a pass
        nv, na = Q.offer_held(ps)
        got = _walk(ps, nv - na, ps.rk, ps.ext2, ps.wval2, ps.wst2, ps.ghl2)[0]
        Q.keep_ranks(ps, na, got)
    return -ps.rank[e]


@njit(cache=True)
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    if not Q.leave_held(ps):
        return
    nv = ps.sc[Q.NV]
    for j in range(nv):
        ps.freq[ps.vic[j]] = 0
    for x in range(ps.sc[_LO], ps.sc[_HI]):  # the moves to main's head, last ones in order
        i = ps.ext[x % ps.ext.size]
        if ps.seq[i] >= 0:
            Q.unlink(ps, i)
            Q.push(ps, i, MAIN)
            ps.freq[i] = ps.wval[i]
    if nv:
        ps.sc[_EVICTED] = 1
    if ps.ghost_len > 0:
        for j in range(ps.sc[_NG]):  # in eviction order; an id already there keeps its place
            i = ps.ghl[j]
            if ps.gq[i] == 0:
                Q.lpush(ps.gold, ps.gnew, ps.ghead, ps.gtail, ps.gcount, ps.gq, i, 1)
                if ps.gcount[1] > ps.ghost_len:
                    old = ps.gtail[1]
                    Q.lunlink(ps.gold, ps.gnew, ps.ghead, ps.gtail, ps.gcount, ps.gq, old)
    _place(ps, ps.arrv, Q.survivors(ps))
