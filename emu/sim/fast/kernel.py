"""What every policy's compiled replay loop shares (numba): the victim order, the heap and
queue of (key, id) items, the exact top-k selection and an entry's age in tokens.

The loop itself is :mod:`kvcxl.emu.sim.fast.loop`, compiled once per policy module of
:mod:`kvcxl.emu.sim.fast.policies` (:mod:`kvcxl.emu.sim.fast.compose`).  Victim order is
the firmware's contract: priority descending, entry id ascending.  A "key" here is an
int64 ordered as ``-priority`` (:func:`key_of`), so that the smallest (key, id) goes first.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

HBM, CXL, NVME, HOST = 1, 2, 3, 4  # kvcxl.firmware.formulas tier codes; HOST as in tiers.py


@njit(cache=True, inline="always")
def age_tokens(tab, e):  # type: ignore[no-untyped-def]
    """EntryTable.age_tokens of entry ``e`` (``tab``: a :class:`~kvcxl.emu.sim.fast.hooks.Table`):
    how far behind its context's newest token the entry's last token is,
    max(length − 1 − last_token, 0)."""
    last_token = tab.e_block[e] * tab.bt + tab.bt - 1
    return max(tab.ctx_tokens[tab.e_ctx[e]] - 1 - last_token, 0)


@intrinsic
def borrowed(typingctx, tup):  # type: ignore[no-untyped-def]
    """``tup`` (a policy's state, the entry table: a tuple of arrays and scalars) with every
    array's reference count detached (its meminfo null), for the loop's own use.

    numba counts references to the arrays of a tuple that a function receives (an atomic
    increment and decrement per array, per call) and removes the pairs only where the
    function has no branch between them: a per-read hook with an ``if`` (EMA's
    ``on_access``) paid four atomic pairs a read, 1.5-2x the whole replay.  On a null
    meminfo numba's increment is a no-op that an inlined hook folds away.  Safe because the
    caller's tuple keeps every array alive for the whole call, and no hook returns an array
    out of the loop."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        out = args[0]
        for i, ty in enumerate(tup.types):
            if isinstance(ty, types.Array):
                arr = context.make_array(ty)(context, builder, builder.extract_value(out, i))
                arr.meminfo = cgutils.get_null_value(arr.meminfo.type)
                out = builder.insert_value(out, arr._getvalue(), i)
        return out

    return tup(tup), codegen


# --- a min-heap of (key, id) with a version per item (stale items are skipped) -----------
@njit(cache=True, inline="always")
def _less(ka, ia, kb, ib):  # type: ignore[no-untyped-def]
    return ka < kb or (ka == kb and ia < ib)


@njit(cache=True)
def _sift_down(hk, hi, hv, size, pos):  # type: ignore[no-untyped-def]
    k, i, v = hk[pos], hi[pos], hv[pos]
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        if c + 1 < size and _less(hk[c + 1], hi[c + 1], hk[c], hi[c]):
            c += 1
        if _less(hk[c], hi[c], k, i):
            hk[pos], hi[pos], hv[pos] = hk[c], hi[c], hv[c]
            pos = c
        else:
            break
    hk[pos], hi[pos], hv[pos] = k, i, v


@njit(cache=True)
def _push(hk, hi, hv, size, k, i, v):  # type: ignore[no-untyped-def]
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        if _less(k, i, hk[parent], hi[parent]):
            hk[pos], hi[pos], hv[pos] = hk[parent], hi[parent], hv[parent]
            pos = parent
        else:
            break
    hk[pos], hi[pos], hv[pos] = k, i, v
    return size + 1


@njit(cache=True)
def _pop(hk, hi, hv, size):  # type: ignore[no-untyped-def]
    k, i, v = hk[0], hi[0], hv[0]
    size -= 1
    if size > 0:
        hk[0], hi[0], hv[0] = hk[size], hi[size], hv[size]
        _sift_down(hk, hi, hv, size, 0)
    return k, i, v, size


@njit(cache=True)
def _heapify(hk, hi, hv, size):  # type: ignore[no-untyped-def]
    for pos in range(size // 2 - 1, -1, -1):
        _sift_down(hk, hi, hv, size, pos)


# --- for LRU and FIFO: the same items as a queue sorted by (key, id) ------------------------
# Their keys only grow (a read or an insert sets the batch's time, which never goes back), so
# every key pushed is at least every key already queued: a push inserts at the tail (past
# equal keys with a higher id only) and a pop takes the head, both O(1) where the heap pays
# O(log n).  Same items, same validity checks, same order: the same victims.
@njit(cache=True)
def _sort_items(hk, hi, hv, lo, up, ver):  # type: ignore[no-untyped-def]
    """Sort items ``[lo, up)`` by (key, id), each with its entry's current version
    (``ver[id]``: every caller sorts items it has just made current).

    (key − min key)·n + id is one int64 in the same order when the keys' span allows
    (LRU and FIFO keys are batch times): one sort of plain integers, 5x faster than the
    two stable argsorts, which remain for a span too wide to encode."""
    m = up - lo
    if m <= 0:
        return
    n = max(ver.size, 1)
    kmin = hk[lo]
    kmax = kmin
    for j in range(lo, up):
        kmin = min(kmin, hk[j])
        kmax = max(kmax, hk[j])
    if float(kmax) - float(kmin) < float((1 << 62) // n):
        c = np.empty(m, np.int64)
        for j in range(m):
            c[j] = (hk[lo + j] - kmin) * n + hi[lo + j]
        c.sort()
        for j in range(m):
            e = c[j] % n
            hk[lo + j] = kmin + c[j] // n
            hi[lo + j] = e
            hv[lo + j] = ver[e]
    else:
        o = np.argsort(hi[lo:up], kind="mergesort")
        k, i = hk[lo:up][o], hi[lo:up][o]
        o = np.argsort(k, kind="mergesort")
        hk[lo:up], hi[lo:up] = k[o], i[o]
        for j in range(lo, up):
            hv[j] = ver[hi[j]]


@njit(cache=True)
def _enqueue(hk, hi, hv, head, size, k, i, v):  # type: ignore[no-untyped-def]
    pos = size
    while pos > head and _less(k, i, hk[pos - 1], hi[pos - 1]):
        hk[pos], hi[pos], hv[pos] = hk[pos - 1], hi[pos - 1], hv[pos - 1]
        pos -= 1
    hk[pos], hi[pos], hv[pos] = k, i, v
    return size + 1


@njit(cache=True)
def _compact(hk, hi, hv, head, size, ver, resident, pinned):  # type: ignore[no-untyped-def]
    """Drop the consumed head and the stale items, keeping the order; returns the size."""
    m = 0
    for j in range(head, size):
        e = hi[j]
        if resident[e] and not pinned[e] and hv[j] == ver[e]:
            hk[m], hi[m], hv[m] = hk[j], hi[j], hv[j]
            m += 1
    return m


# --- keys: -priority as an int64 whose order is the victim order ------------------------
@njit(cache=True, inline="always")
def float_key(x):  # type: ignore[no-untyped-def]
    """An int64 ordered as the float ``x`` (IEEE order; -0.0 and 0.0 equal, as in numpy's
    comparisons)."""
    b = np.float64(x + 0.0).view(np.int64)  # -0.0 + 0.0 is +0.0
    if b < 0:
        b ^= 0x7FFFFFFFFFFFFFFF
    return b


def key_of(p):  # type: ignore[no-untyped-def]
    """The int64 key of priority ``p`` (a policy's ``priority``, int or float): ordered as
    ``-p``, so that ascending keys are the victim order.  The one place a priority becomes
    a key (the heap, the queue, the selection and the dump all use it)."""
    raise NotImplementedError("compiled only (numba)")


@overload(key_of)
def _key_of(p):  # type: ignore[no-untyped-def]
    if isinstance(p, types.Integer):
        return lambda p: -np.int64(p)
    return lambda p: float_key(-p)


# --- exact top-k by (key, id) over a candidate list --------------------------------------
@njit(cache=True)
def _select(keys, ids, m, k, kmin, kmax, out_ids, mark):  # type: ignore[no-untyped-def]
    """The ``k`` smallest (key, id) of ``keys[:m]``/``ids[:m]`` into ``out_ids``, in no
    particular order (a dump orders them afterwards).  Returns how many (min(k, m)).
    ``kmin``/``kmax`` bound the keys; ``mark`` is a False bool array over entry ids."""
    sel = np.empty(min(k, m), np.int64)  # candidate positions
    if k >= m:
        n = m
        for j in range(m):
            sel[j] = j
    else:
        if float(kmax) - float(kmin) < max(m, 1024):  # few distinct keys (times, Q0.16)
            span = kmax - kmin + 1
            hist = np.zeros(span, np.int64)
            for j in range(m):
                hist[keys[j] - kmin] += 1
            acc = 0
            kth = kmin
            for v in range(span):
                acc += hist[v]
                if acc >= k:
                    kth = kmin + v
                    break
        else:
            kth = np.partition(keys[:m].copy(), k - 1)[k - 1]  # the k-th smallest key
        n = 0
        tied = 0
        lo = np.iinfo(np.int64).max
        hi = -1
        for j in range(m):
            if keys[j] < kth:
                sel[n] = j
                n += 1
            elif keys[j] == kth:
                tied += 1
                if ids[j] < lo:
                    lo = ids[j]
                if ids[j] > hi:
                    hi = ids[j]
        need = k - n
        if need == tied:
            for j in range(m):
                if keys[j] == kth:
                    sel[n] = j
                    n += 1
        elif tied > 4096 and hi - lo < 8 * tied:
            # among equal priorities the lower entry id goes first: walk the ids in order
            at = np.empty(hi - lo + 1, np.int64)
            for j in range(m):
                if keys[j] == kth:
                    mark[ids[j]] = True
                    at[ids[j] - lo] = j
            for e in range(lo, hi + 1):
                if mark[e]:
                    mark[e] = False
                    if need > 0:
                        sel[n] = at[e - lo]
                        n += 1
                        need -= 1
        else:
            tpos = np.empty(tied, np.int64)
            t = 0
            for j in range(m):
                if keys[j] == kth:
                    tpos[t] = j
                    t += 1
            tpos = tpos[np.argsort(ids[tpos])]
            for j in range(need):
                sel[n] = tpos[j]
                n += 1
    for j in range(n):
        out_ids[j] = ids[sel[j]]
    return n
