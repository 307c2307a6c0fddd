"""CLOCK, SIEVE, S3-FIFO and ARC as W-TinyLFU's main cache (firmware:
policies/main_cache.py), for the fast module wtinylfu.py.  Not a policy itself.

The main's state is a layered one (_layers.py): per entry, its queue links, its queue, one
value (CLOCK's counter, SIEVE's visited bit, S3-FIFO's counter) and its ghost links;
lists 1 and 2 are the main's queues (CLOCK, SIEVE: 1; S3-FIFO: small, main; ARC: T1, T2),
3 and 4 its ghosts (S3-FIFO's; ARC's B1, B2); scalars: SIEVE's hand, S3-FIFO's "has
evicted", ARC's pending case, and ARC's p.  Each operation changes that state one step
at a time, as libCacheSim's main cache does (its eviction is the firmware's walk of one
victim, committed): :func:`join`, :func:`pop` (in a layer the caller keeps or drops:
a peek is a pop not kept), :func:`reuse` and :func:`admitted`.  ``ps`` is W-TinyLFU's
state: the offered entries ``ps.ok``, the layered arrays and the main's parameters; ``v``
is the pass's layer.
"""

from __future__ import annotations

from typing import Any

from numba import njit

from kvcxl.firmware.policies.arc import FROM_B1, FROM_B2, NEW, T1, T2
from kvcxl.firmware.policies.s3fifo import MAIN, MAIN_CAP, SMALL
from kvcxl.firmware.policies.wtinylfu import MAINS

from . import _layers as L
from . import _queued as Q

CLOCK, SIEVE, S3FIFO, ARC = (MAINS.index(m) for m in ("clock", "sieve", "s3fifo", "arc"))
# rows of the per-entry state: queue links and queue, the value, ghost links and ghost
OLDER, NEWER, WHERE, VAL, GOLDER, GNEWER, GWHERE = range(7)
FILLS = (Q.NONE, Q.NONE, 0, 0, Q.NONE, Q.NONE, 0)
GHOST, B1, B2 = 3, 3, 4  # ghost lists
HAND, EVICTED, PENDING = L.SCALARS, L.SCALARS + 1, L.SCALARS + 2
P = 0  # ARC's p, in pf


def fields(n: int) -> dict[str, Any]:
    """The main's layered state over ``n`` entries, empty (the firmware's column fills)."""
    out = L.fields(FILLS, n)
    out["lhd"][:, HAND] = Q.NONE
    out["lhd"][:, PENDING] = NEW
    return out


@njit(cache=True, inline="always")
def _g(ps, v, f, i):  # type: ignore[no-untyped-def]
    return L.get(ps, v, f, i)


@njit(cache=True, inline="always")
def _p(ps, v, f, i, x):  # type: ignore[no-untyped-def]
    L.put(ps, v, f, i, x)


@njit(cache=True)
def _push(ps, v, i, q):  # type: ignore[no-untyped-def]
    L.lpush(ps, v, OLDER, NEWER, WHERE, q, i)


@njit(cache=True)
def _unlink(ps, v, i):  # type: ignore[no-untyped-def]
    L.lunlink(ps, v, OLDER, NEWER, WHERE, i)


@njit(cache=True)
def _gpush(ps, v, i, g):  # type: ignore[no-untyped-def]
    L.lpush(ps, v, GOLDER, GNEWER, GWHERE, g, i)


@njit(cache=True)
def _gunlink(ps, v, i):  # type: ignore[no-untyped-def]
    L.lunlink(ps, v, GOLDER, GNEWER, GWHERE, i)


@njit(cache=True)
def _offered(ps, v, i):  # type: ignore[no-untyped-def]
    """The first offered entry at or after ``i`` toward its queue's head (NONE: none)."""
    while i != Q.NONE and not ps.ok[i]:
        i = _g(ps, v, NEWER, i)
    return i


@njit(cache=True, inline="always")
def _tail(ps, q):  # type: ignore[no-untyped-def]
    return ps.lhd[L.U, L.TAIL + q]


@njit(cache=True)
def _leaves(ps, v, i):  # type: ignore[no-untyped-def]
    """A victim leaves its queue, its value back to the fill."""
    _unlink(ps, v, i)
    _p(ps, v, VAL, i, 0)


# --- the walk of one victim, committed ----------------------------------------------------
@njit(cache=True)
def _pop_clock(ps, v):  # type: ignore[no-untyped-def]
    """ClockPolicy.walk: from the tail, a counted entry moves to the head one count lower,
    one at zero is the victim."""
    i = _offered(ps, v, _tail(ps, 1))
    while True:
        r = _g(ps, v, VAL, i)
        if r == 0:
            _leaves(ps, v, i)
            return i
        nxt = _g(ps, v, NEWER, i)  # (before it moves)
        _p(ps, v, VAL, i, r - 1)
        _unlink(ps, v, i)
        _push(ps, v, i, 1)
        # past the head: the tail again (what lies before the moved entries is not offered)
        i = _offered(ps, v, nxt if nxt != Q.NONE else _tail(ps, 1))


@njit(cache=True)
def _pop_sieve(ps, v):  # type: ignore[no-untyped-def]
    """SievePolicy.walk: from the hand toward the head (then the tail), a visited entry's
    bit is cleared, the first unvisited one is the victim; the hand stops just after it."""
    hd = ps.lhd[L.U]
    i = _tail(ps, 1) if hd[HAND] == Q.NONE else hd[HAND]
    while True:
        if i == Q.NONE:
            i = _tail(ps, 1)
        if ps.ok[i]:
            if _g(ps, v, VAL, i) == 0:
                break
            _p(ps, v, VAL, i, 0)
        i = _g(ps, v, NEWER, i)
    hd[HAND] = _g(ps, v, NEWER, i)
    _leaves(ps, v, i)
    return i


@njit(cache=True)
def _pop_s3fifo(ps, v):  # type: ignore[no-untyped-def]
    """S3FifoPolicy.walk: from main (over its share, or small offering nothing) a counted
    entry moves to main's head with min(c, 3) − 1, one at zero is the victim; from small an
    entry counted ``threshold`` times moves to main's head (the walk stays in small), else
    it is the victim and its id enters the ghost."""
    hd = ps.lhd[L.U]
    hd[EVICTED] = 1
    n_main = hd[L.COUNT + MAIN]
    small = _offered(ps, v, _tail(ps, SMALL))
    mi = _offered(ps, v, _tail(ps, MAIN))
    while True:
        if mi == Q.NONE:  # past main's head (or none offered): its tail again
            mi = _offered(ps, v, _tail(ps, MAIN))
        if (n_main > ps.s3_main or small == Q.NONE) and mi != Q.NONE:
            i = mi
            f = _g(ps, v, VAL, i)
            if f == 0:
                _leaves(ps, v, i)
                return i
            nxt = _g(ps, v, NEWER, i)
            _p(ps, v, VAL, i, min(f, MAIN_CAP) - 1)
            _unlink(ps, v, i)
            _push(ps, v, i, MAIN)
            mi = Q.NONE if nxt == Q.NONE else _offered(ps, v, nxt)
        elif small == Q.NONE:
            raise AssertionError("s3fifo walk ran out of entries")
        else:
            while small != Q.NONE:
                i = small
                small = _offered(ps, v, _g(ps, v, NEWER, i))
                if _g(ps, v, VAL, i) < ps.s3_threshold:
                    _leaves(ps, v, i)
                    if ps.s3_ghost > 0 and _g(ps, v, GWHERE, i) == 0:
                        _gpush(ps, v, i, GHOST)
                        if hd[L.COUNT + GHOST] > ps.s3_ghost:
                            _gunlink(ps, v, hd[L.TAIL + GHOST])
                    return i
                _p(ps, v, VAL, i, 0)
                _unlink(ps, v, i)
                _push(ps, v, i, MAIN)
                n_main += 1


@njit(cache=True)
def _pop_arc(ps, v):  # type: ignore[no-untyped-def]
    """ArcPolicy.walk of one victim under the pending case (ArcMain.walk_cases)."""
    hd = ps.lhd[L.U]
    case = hd[PENDING]
    n1, n2 = hd[L.COUNT + T1], hd[L.COUNT + T2]
    nb1, nb2 = hd[L.COUNT + B1], hd[L.COUNT + B2]
    p, cap = ps.lpf[L.U, P], ps.arc_cap
    to_ghost = True
    if case == NEW:
        if n1 + nb1 + 1 > cap:
            if nb1 > 0:
                _gunlink(ps, v, hd[L.TAIL + B1])
            else:
                to_ghost = False
        elif n1 + nb1 + n2 + nb2 >= 2 * cap and nb2 > 0:
            _gunlink(ps, v, hd[L.TAIL + B2])
    at_p = n1 == p and case == FROM_B2
    from_t1 = (n1 > 0 and (n1 > p or at_p)) or n2 == 0
    if not to_ghost:
        from_t1 = True
    o1, o2 = _offered(ps, v, _tail(ps, T1)), _offered(ps, v, _tail(ps, T2))
    if (from_t1 and o1 == Q.NONE) or (not from_t1 and o2 == Q.NONE):
        from_t1 = not from_t1  # the chosen list offers nothing (read in this batch)
    i = o1 if from_t1 else o2
    _leaves(ps, v, i)
    if not from_t1:
        _gpush(ps, v, i, B2)
    elif to_ghost:
        _gpush(ps, v, i, B1)
    return i


@njit(cache=True)
def pop(ps, v):  # type: ignore[no-untyped-def]
    """The main's victim among the offered entries (one at least), gone; its walk's changes
    made (in the operation's layer)."""
    if ps.main == CLOCK:
        return _pop_clock(ps, v)
    if ps.main == SIEVE:
        return _pop_sieve(ps, v)
    if ps.main == S3FIFO:
        return _pop_s3fifo(ps, v)
    return _pop_arc(ps, v)


# --- entries moving in, reused, admitted to the cache ---------------------------------------
@njit(cache=True)
def join(ps, v, i):  # type: ignore[no-untyped-def]
    """MainCache.join: window victim ``i`` moves in by the policy's admission rule."""
    hd = ps.lhd[L.U]
    q = 1
    if ps.main == S3FIFO:  # main if back from the ghost, or small is full before an eviction
        back = _g(ps, v, GWHERE, i) != 0
        if back:
            _gunlink(ps, v, i)
        warm = hd[EVICTED] == 0 and hd[L.COUNT + SMALL] >= ps.s3_small
        q = MAIN if back or warm else SMALL
    elif ps.main == ARC:
        q = T2 if hd[PENDING] != NEW else T1
        hd[PENDING] = NEW
    _push(ps, v, i, q)
    _p(ps, v, VAL, i, 0)


@njit(cache=True)
def reuse(ps, v, e):  # type: ignore[no-untyped-def]
    """The policy's on_access for a reuse of ``e`` in the main."""
    if ps.main == CLOCK:
        _p(ps, v, VAL, e, min(_g(ps, v, VAL, e) + 1, ps.clock_max))
    elif ps.main == SIEVE:
        _p(ps, v, VAL, e, 1)
    elif ps.main == S3FIFO:
        _p(ps, v, VAL, e, _g(ps, v, VAL, e) + 1)
    else:  # ARC: to T2's head; a request found in the main clears the pending case
        _unlink(ps, v, e)
        _push(ps, v, e, T2)
        ps.lhd[L.U, PENDING] = NEW


@njit(cache=True)
def admitted(ps, v, ids, na):  # type: ignore[no-untyped-def]
    """ArcMain.admitted: admissions ``ids[:na]`` (ascending) found in B1 or B2 move p, leave
    the ghost and make their case pending."""
    hd, pf = ps.lhd[L.U], ps.lpf[L.U]
    for j in range(na):
        i = ids[j]
        g = _g(ps, v, GWHERE, i)
        if g == 0:
            continue
        nb1, nb2 = hd[L.COUNT + B1], hd[L.COUNT + B2]
        if g == B1:
            pf[P] = min(pf[P] + max(nb2 / nb1, 1.0), float(ps.arc_cap))
            hd[PENDING] = FROM_B1
        else:
            pf[P] = max(pf[P] - max(nb1 / nb2, 1.0), 0.0)
            hd[PENDING] = FROM_B2
        _gunlink(ps, v, i)
