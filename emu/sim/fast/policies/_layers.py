"""A copy-on-write view of a policy's state, for a walk that must not change it: the fast
engine's counterpart of the clone W-TinyLFU plays its queue-policy main on
(firmware/policies/main_cache.py).  Not a policy (the registry skips ``_`` modules).

The state is layer :data:`LIVE` of stacked arrays held by the policy's state ``ps``
(:func:`fields`): ``lcol[l, f, e]`` per-entry rows (int64), ``lhd[l]`` the heads, tails
and counts of a few linked lists over those rows (list ids 1 to :data:`LISTS`) and int64
scalars from :data:`SCALARS` on, ``lpf[l]`` float scalars.  Layers sit above it: a
*pass* ``v`` (:data:`V1` or :data:`V2`) and the *operation* :data:`U`.  Reads look in
``U``, then ``v``, then ``LIVE``; writes go to ``U``, each entry's whole column copied up
on its first write there (``lst`` stamps it with the layer's epoch, ``ltouch`` lists it).
An operation is kept (:func:`keep`: merged into ``v``) or dropped (:func:`drop`: a new
epoch, nothing copied); a pass is committed into ``LIVE`` (:func:`commit`) or dropped by
the next :func:`begin_pass`.  Every cost is in the entries written, never in those held.
(Flat arrays, not a tuple of layers: the loop detaches the reference counts of its
state's own arrays only, kernel.borrowed.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from . import _queued as Q

LIVE, V1, V2, U = 0, 1, 2, 3
EPOCH, NT = 0, 1  # lmeta[l]: the layer's epoch, the entries listed in ltouch[l]
LISTS = 4
HEAD, TAIL, COUNT = 0, LISTS + 1, 2 * (LISTS + 1)  # lhd[l, HEAD + q] is list q's head, ...
SCALARS = 3 * (LISTS + 1)  # the first scalar slot of lhd
N_HD = SCALARS + 4


def fields(fills: tuple[int, ...], n: int, floats: int = 1) -> dict[str, Any]:
    """The layered state's arrays, rows at ``fills`` over ``n`` entries, lists empty."""
    col = np.empty((4, len(fills), n), np.int64)
    col[:] = np.asarray(fills, np.int64)[None, :, None]
    hd = np.zeros((4, N_HD), np.int64)
    hd[:, HEAD : HEAD + LISTS + 1] = Q.NONE
    hd[:, TAIL : TAIL + LISTS + 1] = Q.NONE
    meta = np.zeros((4, 2), np.int64)
    meta[:, EPOCH] = 1  # (no entry stamped yet: every stamp is 0)
    return {
        "lcol": col, "lst": np.zeros((4, n), np.int64), "ltouch": np.zeros((4, n), np.int64),
        "lhd": hd, "lpf": np.zeros((4, floats), np.float64), "lmeta": meta,
    }  # fmt: skip


@njit(cache=True, inline="always")
def get(ps, v, f, i):  # type: ignore[no-untyped-def]
    """Row ``f`` of entry ``i`` as the operation on pass ``v`` sees it."""
    if ps.lst[U, i] == ps.lmeta[U, EPOCH]:
        return ps.lcol[U, f, i]
    if ps.lst[v, i] == ps.lmeta[v, EPOCH]:
        return ps.lcol[v, f, i]
    return ps.lcol[LIVE, f, i]


@njit(cache=True)
def put(ps, v, f, i, x):  # type: ignore[no-untyped-def]
    """Row ``f`` of entry ``i`` becomes ``x`` in the operation's layer."""
    if ps.lst[U, i] != ps.lmeta[U, EPOCH]:
        src = v if ps.lst[v, i] == ps.lmeta[v, EPOCH] else LIVE
        for g in range(ps.lcol.shape[1]):
            ps.lcol[U, g, i] = ps.lcol[src, g, i]
        ps.lst[U, i] = ps.lmeta[U, EPOCH]
        ps.ltouch[U, ps.lmeta[U, NT]] = i
        ps.lmeta[U, NT] += 1
    ps.lcol[U, f, i] = x


@njit(cache=True)
def _open(ps, below, lay):  # type: ignore[no-untyped-def]
    ps.lmeta[lay, EPOCH] += 1
    ps.lmeta[lay, NT] = 0
    ps.lhd[lay, :] = ps.lhd[below, :]
    ps.lpf[lay, :] = ps.lpf[below, :]


@njit(cache=True)
def _merge(ps, below, lay):  # type: ignore[no-untyped-def]
    """Layer ``lay``'s entries, lists and scalars into ``below`` (then ``lay`` is empty)."""
    for j in range(ps.lmeta[lay, NT]):
        i = ps.ltouch[lay, j]
        ps.lcol[below, :, i] = ps.lcol[lay, :, i]
        if below != LIVE and ps.lst[below, i] != ps.lmeta[below, EPOCH]:
            ps.lst[below, i] = ps.lmeta[below, EPOCH]
            ps.ltouch[below, ps.lmeta[below, NT]] = i
            ps.lmeta[below, NT] += 1
    ps.lhd[below, :] = ps.lhd[lay, :]
    ps.lpf[below, :] = ps.lpf[lay, :]
    ps.lmeta[lay, EPOCH] += 1
    ps.lmeta[lay, NT] = 0


@njit(cache=True)
def begin_pass(ps, v):  # type: ignore[no-untyped-def]
    """Pass ``v`` begins over the live state (an earlier one in ``v`` is dropped)."""
    _open(ps, LIVE, v)


@njit(cache=True)
def begin_op(ps, v):  # type: ignore[no-untyped-def]
    """An operation on pass ``v`` begins."""
    _open(ps, v, U)


@njit(cache=True)
def keep(ps, v):  # type: ignore[no-untyped-def]
    """The operation stands: into pass ``v``."""
    _merge(ps, v, U)


@njit(cache=True)
def drop(ps):  # type: ignore[no-untyped-def]
    """The operation is undone."""
    ps.lmeta[U, EPOCH] += 1
    ps.lmeta[U, NT] = 0


@njit(cache=True)
def commit(ps, v):  # type: ignore[no-untyped-def]
    """Pass ``v`` stands: into the live state."""
    _merge(ps, LIVE, v)


# --- linked lists over rows (older, newer, where) of the layered state --------------------
@njit(cache=True)
def lpush(ps, v, ro, rn, rw, q, i):  # type: ignore[no-untyped-def]
    """Put ``i`` (in no list) at the head (newest end) of list ``q``."""
    h = ps.lhd[U, HEAD + q]
    put(ps, v, ro, i, h)
    put(ps, v, rn, i, Q.NONE)
    if h == Q.NONE:
        ps.lhd[U, TAIL + q] = i
    else:
        put(ps, v, rn, h, i)
    ps.lhd[U, HEAD + q] = i
    ps.lhd[U, COUNT + q] += 1
    put(ps, v, rw, i, q)


@njit(cache=True)
def lunlink(ps, v, ro, rn, rw, i):  # type: ignore[no-untyped-def]
    """Take ``i`` out of its list (no-op in none)."""
    q = get(ps, v, rw, i)
    if q == 0:
        return
    o, n = get(ps, v, ro, i), get(ps, v, rn, i)
    if o == Q.NONE:
        ps.lhd[U, TAIL + q] = n
    else:
        put(ps, v, rn, o, n)
    if n == Q.NONE:
        ps.lhd[U, HEAD + q] = o
    else:
        put(ps, v, ro, n, o)
    put(ps, v, ro, i, Q.NONE)
    put(ps, v, rn, i, Q.NONE)
    ps.lhd[U, COUNT + q] -= 1
    put(ps, v, rw, i, 0)
