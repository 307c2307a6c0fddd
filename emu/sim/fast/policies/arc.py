"""ARC (firmware/policies/arc.py): LRU lists T1 and T2 (queues 1 and 2), their ghosts B1 and
B2 (a linked list over ids each: ``gold``/``gnew``, ``gq`` says which), the target ``p``
(``pf[0]``), and the case of each arriving entry (a B1 return, a B2 return or new) that
the pass's evictions follow in ascending id order.

The walk reads the lists only; the ghosts it adds (``nb1``, ``nb2``) and drops (``drop``)
are its plan, which the commit applies.  The firmware has no closed-form priority: a
victim's is minus its rank in a walk over the pass's victims alone
(QueuePolicy.walk_rank), run on the uncommitted state the first time a dump asks (a
second set of scratch lists, ``*2``, keeps the plan intact).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvcxl.firmware.policies.arc import FROM_B1, FROM_B2, NEW, T1, T2

from ..hooks import Setup
from . import _queued as Q

COVERS = (("arc", "float"),)
State = Q.state_class(
    __name__,
    ("gold", "gnew", "gq", "ghead", "gtail", "gcount", "gmark", "pf", "cases", "case_id",
     "nb1", "nb2", "drop", "rk", "arrv2", "nb12", "nb22", "drop2", "cap"),
)  # fmt: skip
_NCASE, _N1, _N2, _ND = Q.OWN, Q.OWN + 1, Q.OWN + 2, Q.OWN + 3  # cases; the plan's lists


def build(setup: Setup) -> State:
    n = setup.n

    def ids() -> np.ndarray:
        return np.zeros(n, np.int64)

    return State(
        **Q.base(setup, 2),
        gold=setup.column(Q.NONE, np.int64), gnew=setup.column(Q.NONE, np.int64),
        gq=setup.column(0, np.int64), ghead=np.full(3, Q.NONE, np.int64),
        gtail=np.full(3, Q.NONE, np.int64), gcount=np.zeros(3, np.int64), gmark=ids(),
        pf=np.zeros(1, np.float64), cases=ids(), case_id=ids(),
        nb1=ids(), nb2=ids(), drop=ids(), rk=ids(), arrv2=ids(), nb12=ids(), nb22=ids(),
        drop2=ids(), cap=int(setup.policy.capacity),
    )  # fmt: skip


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if Q.first_read(ps, e):  # a reuse: to T2's head
        Q.unlink(ps, e)
        Q.push(ps, e, T2)
    return False


@njit(cache=True)
def _place(ps, ids, na):  # type: ignore[no-untyped-def]
    for j in range(na):
        i = ids[j]
        Q.push(ps, i, T2 if ps.case_id[i] != NEW else T1)


@njit(cache=True)
def on_admit(ps, adm, na, t):  # type: ignore[no-untyped-def]
    """ArcPolicy.on_insert: each arrival's case, in ascending id order, moving p."""
    Q.admit(ps, adm, na)
    g = ps.gcount
    for j in range(na):
        i = ps.arr[j]
        case = NEW
        if ps.gq[i] == 1:
            ps.pf[0] = min(ps.pf[0] + max(g[2] / g[1], 1.0), float(ps.cap))
            case = FROM_B1
        elif ps.gq[i] == 2:
            ps.pf[0] = max(ps.pf[0] - max(g[1] / g[2], 1.0), 0.0)
            case = FROM_B2
        if case != NEW:
            Q.lunlink(ps.gold, ps.gnew, ps.ghead, ps.gtail, ps.gcount, ps.gq, i)
        ps.cases[j] = case
        ps.case_id[i] = case
    ps.sc[_NCASE] = na
    _place(ps, ps.arr, na)


@njit(cache=True, inline="always")
def _next(ps, i):  # type: ignore[no-untyped-def]
    """The next offered entry of a list after ``i`` (none after none)."""
    return i if i == Q.NONE else Q.next_offered(ps, ps.newer[i])


@njit(cache=True)
def _walk(ps, k, out, nb1, nb2, drop):  # type: ignore[no-untyped-def]
    """ArcPolicy.walk over the offered entries: (victims, ghosts added to B1 and B2,
    ghosts dropped)."""
    n1, n2 = Q.live(ps, T1), Q.live(ps, T2)
    nt1 = Q.next_offered(ps, ps.tail[T1])  # offered tails
    nt2 = Q.next_offered(ps, ps.tail[T2])
    nb1c, nb2c = ps.gcount[1], ps.gcount[2]
    g1, g2 = ps.gtail[1], ps.gtail[2]  # the ghosts oldest first, then what the walk adds
    j1 = j2 = 0
    a1 = a2 = nd = nv = 0
    p, cap = ps.pf[0], ps.cap
    while nv < k:
        case = ps.cases[nv] if nv < ps.sc[_NCASE] else NEW
        to_ghost = True
        if case == NEW:
            if n1 + nb1c + 1 > cap:
                if nb1c > 0:
                    if g1 != Q.NONE:
                        drop[nd] = g1
                        g1 = ps.gnew[g1]
                    else:
                        drop[nd] = nb1[j1]
                        j1 += 1
                    nd += 1
                    nb1c -= 1
                else:
                    to_ghost = False
            elif n1 + nb1c + n2 + nb2c >= 2 * cap and nb2c > 0:
                if g2 != Q.NONE:
                    drop[nd] = g2
                    g2 = ps.gnew[g2]
                else:
                    drop[nd] = nb2[j2]
                    j2 += 1
                nd += 1
                nb2c -= 1
        at_p = n1 == p and case == FROM_B2
        from_t1 = (n1 > 0 and (n1 > p or at_p)) or n2 == 0
        if not to_ghost:
            from_t1 = True
        if (from_t1 and nt1 == Q.NONE) or (not from_t1 and nt2 == Q.NONE):
            from_t1 = not from_t1  # the chosen list offers nothing (pinned, read now)
        if from_t1:
            i = nt1
            nt1 = _next(ps, nt1)
            n1 -= 1
            if to_ghost:
                nb1[a1] = i
                a1 += 1
                nb1c += 1
        else:
            i = nt2
            nt2 = _next(ps, nt2)
            n2 -= 1
            nb2[a2] = i
            a2 += 1
            nb2c += 1
        out[nv] = i
        nv += 1
    return nv, a1, a2, nd


@njit(cache=True)
def _choose(ps, m, na, k, out):  # type: ignore[no-untyped-def]
    """The walk of an offer of ``m`` (``na`` of them arriving): its victims, its plan kept."""
    nv, a1, a2, nd = _walk(ps, min(k, m - na), out, ps.nb1, ps.nb2, ps.drop)
    ps.sc[_N1], ps.sc[_N2], ps.sc[_ND] = a1, a2, nd
    return nv


select, select_all = Q.selects(_choose)


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    if ps.sc[Q.RANKED] == 0:  # QueuePolicy.walk_rank of the held victims, once a pass
        nv, na = Q.offer_held(ps)
        got = _walk(ps, nv - na, ps.rk, ps.nb12, ps.nb22, ps.drop2)[0]
        Q.keep_ranks(ps, na, got)
    return -ps.rank[e]


@njit(cache=True)
def _add_ghost(ps, i, q, mark):  # type: ignore[no-untyped-def]
    if ps.gmark[i] != mark and ps.gq[i] == 0:  # (not dropped by the same pass)
        Q.lpush(ps.gold, ps.gnew, ps.ghead, ps.gtail, ps.gcount, ps.gq, i, q)


@njit(cache=True)
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    if not Q.leave_held(ps):
        return
    mark = Q.next_pass(ps)
    for j in range(ps.sc[_ND]):
        i = ps.drop[j]
        ps.gmark[i] = mark
        Q.lunlink(ps.gold, ps.gnew, ps.ghead, ps.gtail, ps.gcount, ps.gq, i)
    for j in range(ps.sc[_N1]):
        _add_ghost(ps, ps.nb1[j], 1, mark)
    for j in range(ps.sc[_N2]):
        _add_ghost(ps, ps.nb2[j], 2, mark)
    _place(ps, ps.arrv, Q.survivors(ps))
