"""CLOCK (firmware/policies/clock.py): one FIFO queue, an n-bit reference counter; the walk
takes the tail, moves a counted entry to the head one count lower, evicts one at zero.

The walk's moves wait in a FIFO ring (``ext``) in the order they reached the head, their
lowered counters in ``wref`` (stamped ``wst`` by the walk): the walk reads the live queue
only, and the commit makes the moves the firmware's plan does — the last move of each
entry that stays, in order, which is the ring's order at the end of the walk.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvcxl.firmware.policies.clock import _SPAN

from ..hooks import Setup
from . import _queued as Q

COVERS = (("clock", "float"),)
State = Q.state_class(__name__, ("ref", "wref", "wst", "ext", "maxref"))
_LO, _HI, _PU = Q.OWN, Q.OWN + 1, Q.OWN + 2  # the ring's ends; an entry popped, not seen


def build(setup: Setup) -> State:
    n = setup.n
    return State(
        **Q.base(setup, 1),
        ref=setup.column(0, np.int64),
        wref=np.zeros(n, np.int64),
        wst=np.zeros(n, np.int64),
        ext=np.zeros(n + 1, np.int64),
        maxref=(1 << int(setup.policy.params.clock_bits)) - 1,
    )


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return Q.arriving_last(ps, e, -(ps.ref[e] * _SPAN + ps.seq[e]))


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if Q.first_read(ps, e):
        ps.ref[e] = min(ps.ref[e] + 1, ps.maxref)
    return False


@njit(cache=True)
def on_admit(ps, adm, na, t):  # type: ignore[no-untyped-def]
    Q.admit(ps, adm, na)
    for j in range(na):
        Q.push(ps, ps.arr[j], 1)


@njit(cache=True)
def _visit(ps, i, p, out, nv, hi):  # type: ignore[no-untyped-def]
    """One look of the hand at entry ``i``: returns (victims, ring end)."""
    r = ps.wref[i] if ps.wst[i] == p else ps.ref[i]
    if r > 0:
        ps.wref[i] = r - 1
        ps.wst[i] = p
        hi = Q.ring_push(ps.ext, hi, i)
    else:
        out[nv] = i
        nv += 1
    return nv, hi


@njit(cache=True)
def _walk(ps, k, out):  # type: ignore[no-untyped-def]
    """ClockPolicy.walk over the offered entries: victims into ``out``; the moves in the
    ring ``ext[lo:hi]`` (and ``pu``, popped when the walk ended), counters in ``wref``."""
    p = Q.next_pass(ps)
    nv = 0
    lo = hi = 0
    pu = Q.NONE
    i = Q.next_offered(ps, ps.tail[1])
    stop = False
    while i != Q.NONE:
        if nv >= k:
            stop = True
            break
        nv, hi = _visit(ps, i, p, out, nv, hi)
        i = Q.next_offered(ps, ps.newer[i])
    while not stop and lo < hi:
        i = ps.ext[lo % ps.ext.size]
        lo += 1
        if nv >= k:
            pu = i
            break
        nv, hi = _visit(ps, i, p, out, nv, hi)
    ps.sc[_LO], ps.sc[_HI], ps.sc[_PU] = lo, hi, pu
    return nv


@njit(cache=True)
def _choose(ps, m, na, k, out):  # type: ignore[no-untyped-def]
    return _walk(ps, min(k, m - na), out)


select, select_all = Q.selects(_choose)


@njit(cache=True)
def _move(ps, i):  # type: ignore[no-untyped-def]
    if ps.seq[i] >= 0:  # (a victim has left)
        Q.unlink(ps, i)
        Q.push(ps, i, 1)
        ps.ref[i] = ps.wref[i]


@njit(cache=True)
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    if not Q.leave_held(ps):
        return
    for j in range(ps.sc[Q.NV]):
        ps.ref[ps.vic[j]] = 0
    if ps.sc[_PU] != Q.NONE:
        _move(ps, ps.sc[_PU])
    for x in range(ps.sc[_LO], ps.sc[_HI]):
        _move(ps, ps.ext[x % ps.ext.size])
    for j in range(Q.survivors(ps)):
        Q.push(ps, ps.arrv[j], 1)
