"""SLRU (firmware/policies/slru.py): ``slru_segments`` LRU segments (queue q = segment
q − 1) of capacity / n entries each; a reuse moves an entry one segment up, the overflow
of a segment cascades down, and the victims are the tails of the lowest segments."""

from __future__ import annotations

from numba import njit

from kvcxl.firmware.policies.slru import _MAX_SEGMENTS, _SPAN

from ..hooks import Setup
from . import _queued as Q

COVERS = (("slru", "float"),)
State = Q.state_class(__name__, ("nseg", "share"))


def build(setup: Setup) -> State:
    policy = setup.policy
    return State(
        **Q.base(setup, _MAX_SEGMENTS),
        nseg=int(policy.params.slru_segments),
        share=float(policy.share),  # SlruPolicy.set_capacity's entries per segment
    )


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return Q.arriving_last(ps, e, -(ps.queue[e] * _SPAN + ps.seq[e]))


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if Q.first_read(ps, e):  # SlruPolicy.on_access, one reuse
        top = ps.nseg
        q = ps.queue[e]
        Q.unlink(ps, e)
        Q.push(ps, e, min(q + 1, top))
        s = q + 1
        while 1 < s <= top and ps.count[s] > ps.share:
            x = ps.tail[s]
            Q.unlink(ps, x)
            Q.push(ps, x, s - 1)
            s -= 1
    return False


@njit(cache=True)
def _place(ps, ids, na):  # type: ignore[no-untyped-def]
    """SlruPolicy.place: the lowest segment with room, else segment 0."""
    for j in range(na):
        q = 1
        for s in range(1, ps.nseg + 1):
            if ps.count[s] + 1 <= ps.share:
                q = s
                break
        Q.push(ps, ids[j], q)


@njit(cache=True)
def on_admit(ps, adm, na, t):  # type: ignore[no-untyped-def]
    Q.admit(ps, adm, na)
    _place(ps, ps.arr, na)


@njit(cache=True)
def _choose(ps, m, na, k, out):  # type: ignore[no-untyped-def]
    """SlruPolicy.walk of an offer of ``m`` (``na`` of them arriving): the offered tails,
    lowest segment first."""
    kw = min(k, m - na)
    nv = 0
    for q in range(1, ps.nseg + 1):
        i = Q.next_offered(ps, ps.tail[q])
        while i != Q.NONE and nv < kw:
            out[nv] = i
            nv += 1
            i = Q.next_offered(ps, ps.newer[i])
    return nv


select, select_all = Q.selects(_choose)


@njit(cache=True)
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    if not Q.leave_held(ps):
        return
    na = Q.survivors(ps)
    _place(ps, ps.arrv, na)
