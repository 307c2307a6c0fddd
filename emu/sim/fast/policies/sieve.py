"""SIEVE (firmware/policies/sieve.py): one FIFO queue, a visited bit per entry and a hand
that moves from the tail toward the head, clearing the bits it passes and evicting the
first unvisited entry; entries never move.

The walk marks what it evicts (``gone``) and clears (``clr``, listed in ``cleared``) with
its stamp, reading the live queue only; the commit clears the bits and sets the hand.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvcxl.firmware.policies.sieve import _TURN

from ..hooks import Setup
from . import _queued as Q

COVERS = (("sieve", "float"),)
State = Q.state_class(__name__, ("visited", "gone", "clr", "cleared"))
_HAND, _PHAND, _NCLR = Q.OWN, Q.OWN + 1, Q.OWN + 2  # the hand, the plan's, cleared count


def build(setup: Setup) -> State:
    n = setup.n
    ps = State(
        **Q.base(setup, 1),
        visited=setup.column(False, np.bool_),
        gone=np.zeros(n, np.int64),
        clr=np.zeros(n, np.int64),
        cleared=np.zeros(n, np.int64),
    )
    ps.sc[_HAND] = Q.NONE
    return ps


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    hand = ps.sc[_HAND]
    h = 0 if hand == Q.NONE else ps.seq[hand]
    s = ps.seq[e]
    dist = s - h if s >= h else s - h + _TURN
    return Q.arriving_last(ps, e, -(dist + np.int64(ps.visited[e]) * _TURN))


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if Q.first_read(ps, e):
        ps.visited[e] = True
    return False


@njit(cache=True)
def on_admit(ps, adm, na, t):  # type: ignore[no-untyped-def]
    Q.admit(ps, adm, na)
    for j in range(na):
        Q.push(ps, ps.arr[j], 1)


@njit(cache=True)
def _walk(ps, k, out):  # type: ignore[no-untyped-def]
    """SievePolicy.walk: victims into ``out``, the bits to clear and the hand in the plan."""
    p = Q.next_pass(ps)
    hand = ps.sc[_HAND]
    nv = 0
    ncl = 0
    i = ps.tail[1] if hand == Q.NONE else hand
    while nv < k:
        if i == Q.NONE:  # past the head: the hand wraps to the tail
            i = ps.tail[1]
        if Q.offered(ps, i) and ps.gone[i] != p:
            if ps.visited[i] and ps.clr[i] != p:
                ps.clr[i] = p
                ps.cleared[ncl] = i
                ncl += 1
            else:
                out[nv] = i
                nv += 1
                ps.gone[i] = p
        i = ps.newer[i]
    # the hand stops just after the last victim, past entries that leave or have not
    # joined yet
    while i != Q.NONE and (ps.gone[i] == p or ps.isarr[i]):
        i = ps.newer[i]
    ps.sc[_PHAND] = i if nv else hand
    ps.sc[_NCLR] = ncl
    return nv


@njit(cache=True)
def _choose(ps, m, na, k, out):  # type: ignore[no-untyped-def]
    return _walk(ps, min(k, m - na), out)


select, select_all = Q.selects(_choose)


@njit(cache=True)
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    if not Q.pending(ps):
        return
    for j in range(ps.sc[Q.NV]):
        i = ps.vic[j]
        if i == ps.sc[_HAND]:  # SievePolicy.leave: the hand moves on to the next newer
            ps.sc[_HAND] = ps.newer[i]
        Q.leave(ps, i)
        ps.visited[i] = False
    for j in range(ps.sc[_NCLR]):
        ps.visited[ps.cleared[j]] = False
    ps.sc[_HAND] = ps.sc[_PHAND]
    for j in range(Q.survivors(ps)):
        Q.push(ps, ps.arrv[j], 1)
