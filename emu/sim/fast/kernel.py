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


def _detached(context, builder, ty, val):  # type: ignore[no-untyped-def]
    """``val`` of type ``ty`` with the meminfo of every array in it null (tuples: each of
    their items, nested tuples included)."""
    if isinstance(ty, types.Array):
        arr = context.make_array(ty)(context, builder, val)
        arr.meminfo = cgutils.get_null_value(arr.meminfo.type)
        return arr._getvalue()
    if isinstance(ty, types.BaseTuple):
        for i, item in enumerate(ty.types):
            part = _detached(context, builder, item, builder.extract_value(val, i))
            val = builder.insert_value(val, part, i)
    return val


@intrinsic
def borrowed(typingctx, tup):  # type: ignore[no-untyped-def]
    """``tup`` (a policy's state, the entry table, a bundle of the loop's arrays: a tuple of
    arrays, scalars and such tuples) with every array's reference count detached (its
    meminfo null), for the loop's own use.

    numba counts references to the arrays of a tuple that a function receives (an atomic
    increment and decrement per array, per call) and removes the pairs only where the
    function has no branch between them: a per-read hook with an ``if`` (EMA's
    ``on_access``) paid four atomic pairs a read, 1.5-2x the whole replay.  On a null
    meminfo numba's increment is a no-op that an inlined hook folds away.  Safe because the
    caller's tuple keeps every array alive for the whole call, and no hook returns an array
    out of the loop."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return _detached(context, builder, tup, args[0])

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


# --- for LRU and FIFO: the same items as a queue in key order --------------------------------
# Their keys only grow (a read or an insert sets the batch's time, which never goes back), so
# an entry joins the tail at every touch that moves its key, already in key order, and the
# victims are taken from the head, O(1) each where the heap pays O(log n).  Items of equal
# key (a run: one batch's touches) sit in any order; a take that ends inside a run picks
# that run's lowest ids, so the victims are the same set as the (key, id) order's.  An item
# is current while its version is its entry's: the loop queues no pinned entry, and an
# entry leaves HBM only by a take, which consumes its current item.
@njit(cache=True, inline="always")
def _enqueue(hk, hi, hv, size, key, e, ver):  # type: ignore[no-untyped-def]
    """Queue entry ``e`` at the tail with ``key`` (at least every queued key) under a new
    version; returns the size.  The caller keeps room (:func:`_compact`: at most one
    current item per queued entry remains)."""
    ver[e] += 1
    hk[size], hi[size], hv[size] = key, e, ver[e]
    return size + 1


@njit(cache=True, inline="always")
def _sort_item(queue, r, w, c, stamp, call, protect, out):  # type: ignore[no-untyped-def]
    """:func:`_take`'s look at item ``r``: a stale one is dropped, the call's own kept at
    ``w`` (``protect``), any other gathered at ``out[c]``; returns (w, c)."""
    hk, hi, hv, ver = queue
    e = hi[r]
    v = hv[r]
    if v == ver[e]:
        if protect and stamp[e] == call:
            hk[w], hi[w], hv[w] = hk[r], e, v
            w += 1
        else:
            out[c] = e
            c += 1
    return w, c


# (inlined into the loop: as a call of its own it cost a one-request LRU replay ~40 ns a
# miss, half its time, Measured)
@njit(cache=True, inline="always")
def _take(queue, head, size, k, stamp, call, protect, out, run):  # type: ignore[no-untyped-def]
    """Up to ``k`` victims from the queue's head into ``out``: the ``k`` smallest (key, id)
    of its current items (``queue``: the items' keys, ids and versions and each entry's
    version, ``(hk, hi, hv, ver)``), skipping the call's own
    entries (``stamp == call``) when ``protect``.  Stale items are dropped; the call's own
    and the boundary run's unchosen ones stay at the head, in key order.  Returns (how
    many, the new head).

    One pass over each run of equal keys: its current items are kept at once (the call's
    own) or gathered in ``out``; all of them leave when the run fits, else its lowest ids
    (a run's order is free: its keys are equal).  ``out`` has room for every current
    item.  A boundary run that stays, once a later key follows it (no item can join it
    then), is left sorted by id with its span in ``run`` (``[run[0], run[1])``, kept by
    the caller; :func:`_compact` ends it): the next take that reaches it takes its first
    eligible items and stops, where a run of millions (a prompt written at one batch
    time) would otherwise be read whole at every take."""
    hk, hi, hv, ver = queue
    nv = 0
    w = head  # kept items so far: [head, w) (w never passes the read position)
    r = head
    s0 = s1 = 0  # the sorted boundary run this take leaves, if any (kept positions)
    while nv < k and r < size:
        key = hk[r]
        w0 = w
        if r == run[0] and r < run[1]:  # a sorted run: its lowest ids first
            while r < run[1] and nv < k:
                w, nv = _sort_item(queue, r, w, nv, stamp, call, protect, out)
                r += 1
            if r < run[1]:  # (it stays: the kept of it, then its unread rest, in id order)
                s0, s1 = w0, -1
            continue
        c = nv  # the run's eligible items: out[nv:c]
        while r < size and hk[r] == key:
            w, c = _sort_item(queue, r, w, c, stamp, call, protect, out)
            r += 1
        if c <= k:
            nv = c
        else:  # the run's lowest ids leave, the rest stay (current)
            _kth(out, nv, c, k - 1)
            for j in range(k, c):
                hi[w] = out[j]
                w += 1
            if r < size:  # a later key follows, so nothing joins the run: sorted by id
                sort_ids(hi, w0, w)
                s0, s1 = w0, w
            for j in range(w0, w):
                hk[j], hv[j] = key, ver[hi[j]]
            nv = k
    kept = w - head
    for j in range(kept - 1, -1, -1):  # the kept items move up against the unread ones
        d = r - kept + j
        hk[d], hi[d], hv[d] = hk[head + j], hi[head + j], hv[head + j]
    if s1 == -1:  # a sorted run read in part: its kept part and its unread rest
        run[0], run[1] = s0 - head + r - kept, run[1]
    elif s1:
        run[0], run[1] = s0 - head + r - kept, s1 - head + r - kept
    elif r > run[0]:  # (a take that stops short of the run leaves it where it is)
        run[0] = run[1] = 0
    return nv, r - kept


@njit(cache=True)
def _kth(a, lo, up, k):  # type: ignore[no-untyped-def]
    """Reorder the distinct ints ``a[lo:up]`` so that the smallest of them come first up to
    index ``k`` (quickselect, median of three); returns ``a[k]``."""
    hi = up - 1
    while hi > lo:
        mid = (lo + hi) >> 1
        if a[mid] < a[lo]:
            a[mid], a[lo] = a[lo], a[mid]
        if a[hi] < a[lo]:
            a[hi], a[lo] = a[lo], a[hi]
        if a[hi] < a[mid]:
            a[hi], a[mid] = a[mid], a[hi]
        a[mid], a[hi] = a[hi], a[mid]
        piv = a[hi]
        p = lo
        for j in range(lo, hi):
            if a[j] < piv:
                a[j], a[p] = a[p], a[j]
                p += 1
        a[p], a[hi] = a[hi], a[p]
        if p == k:
            return a[k]
        if p > k:
            hi = p - 1
        else:
            lo = p + 1
    return a[k]


@njit(cache=True)
def _compact(hk, hi, hv, head, size, ver):  # type: ignore[no-untyped-def]
    """Drop the consumed head and the stale items, keeping the order; returns the size."""
    m = 0
    for j in range(head, size):
        e = hi[j]
        if hv[j] == ver[e]:
            hk[m], hi[m], hv[m] = hk[j], hi[j], hv[j]
            m += 1
    return m


# --- ids in ascending order --------------------------------------------------------------
# Many ids in a span at most BITMAP_SPAN times their number are sorted by a bitmap of the
# span: a bit set per id, then the set bits read in order (a queue's split run of 18.9 M
# entries at S1 took about 4 s sorted by numba's quicksort, a tenth of a second this way).
BITMAP_MIN = 4096
BITMAP_SPAN = 256
_DE_BRUIJN = np.uint64(0x03F79D71B4CB0A89)  # (the lowest set bit's index by one multiply)
_TRAILING = np.zeros(64, np.int64)
for _b in range(64):
    _TRAILING[((1 << _b) * int(_DE_BRUIJN) % (1 << 64)) >> 58] = _b


@njit(cache=True)
def sort_ids(a, lo, up):  # type: ignore[no-untyped-def]
    """``a[lo:up]`` (non-negative ids) in ascending order, in place.  A check first, since
    a batch's ids mostly arrive ascending already (a sort of a million sorted ids costs
    9 ms, the check 0.3); then the bitmap (module note) when they are many, distinct and
    close, else numba's sort."""
    lo_id = hi_id = a[lo] if up > lo else 0
    ordered = True
    for j in range(lo + 1, up):
        x = a[j]
        if x < a[j - 1]:
            ordered = False
        lo_id = min(lo_id, x)
        hi_id = max(hi_id, x)
    if ordered:
        return
    m = up - lo
    span = np.int64(hi_id) - np.int64(lo_id) + 1
    if m < BITMAP_MIN or span > BITMAP_SPAN * m:
        a[lo:up].sort()
        return
    words = np.zeros((span + 63) >> 6, np.uint64)
    one = np.uint64(1)
    for j in range(lo, up):
        d = np.int64(a[j]) - lo_id
        bit = one << np.uint64(d & 63)
        if words[d >> 6] & bit:  # a repeated id: the bitmap would drop it
            a[lo:up].sort()
            return
        words[d >> 6] |= bit
    p = lo
    for i in range(words.size):
        x = words[i]
        while x:
            low = x & (~x + one)
            a[p] = lo_id + (i << 6) + _TRAILING[(low * _DE_BRUIJN) >> np.uint64(58)]
            p += 1
            x ^= low


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
def _select(keys, ids, m, k, kmin, kmax, out_ids):  # type: ignore[no-untyped-def]
    """The ``k`` smallest (key, id) of ``keys[:m]``/``ids[:m]`` into ``out_ids``, in no
    particular order (a dump orders them afterwards).  Returns how many (min(k, m)).
    ``kmin``/``kmax`` bound the keys.
    ``keys[:m]``/``ids[:m]`` are the caller's scratch: a wide span of keys is selected in
    place (their order is not kept)."""
    if k >= m:
        for j in range(m):
            out_ids[j] = ids[j]
        return m
    if float(kmax) - float(kmin) >= max(m, 1024):  # wide keys (floats): select in place
        if m >= RADIX_MIN:
            return _radix_select(keys, ids, m, k, kmin, kmax, out_ids)
        _nth_pair(keys, ids, m, k)
        for j in range(k):
            out_ids[j] = ids[j]
        return k
    # few distinct keys (batch times, Q0.16): the k-th key from a histogram of them
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
    n = 0
    tied = 0
    ascending = True  # the ties' ids (a scan of the entry ids gathers them in order)
    lo = hi = 0  # the ties' smallest and largest id
    for j in range(m):
        if keys[j] < kth:
            out_ids[n] = ids[j]
            n += 1
        elif keys[j] == kth:  # the ties, gathered at the front of the scratch (read already)
            i = ids[j]
            if tied == 0:
                lo = hi = i
            elif i < ids[tied - 1]:
                ascending = False
            lo = min(lo, i)
            hi = max(hi, i)
            keys[tied] = i  # (among equal priorities the lower id goes first: by id)
            ids[tied] = i
            tied += 1
    need = k - n
    if need < tied and not ascending and tied >= RADIX_MIN:  # (many ties: by id's digits)
        return n + _radix_select(keys, ids, tied, need, lo, hi, out_ids[n:])
    if need < tied and not ascending:
        _nth_pair(keys, ids, tied, need)
    for j in range(need):
        out_ids[n + j] = ids[j]
    return k


RADIX_BITS = 11  # a radix round's digit: a 2,048-bucket histogram (16 KB, in L1/L2)
RADIX_MIN = 4096  # below this many candidates quickselect is as fast


@njit(cache=True, inline="always")
def bit_length(u):  # type: ignore[no-untyped-def]
    """How many bits ``u`` (a uint64 span or a non-negative count) takes: 0 for 0."""
    u = np.uint64(u)
    bits = 0
    while bits < 64 and (u >> np.uint64(bits)) != 0:
        bits += 1
    return bits


@njit(cache=True)
def _radix_select(keys, ids, m, k, kmin, kmax, out_ids):  # type: ignore[no-untyped-def]
    """:func:`_select` of wide keys, ``0 < k < m``: a histogram of the keys' top
    ``RADIX_BITS`` (above the smallest) finds the bucket holding the ``k``-th key; the
    buckets below it are victims and the rest is dropped, and the bucket's own keys go
    round again, over their own span (their smallest and largest, found as they are kept),
    until what is left is small or one key (then quickselect by (key, id)).  A few keys far
    from the rest (a float priority's outliers) cost one round, not one per digit of their
    span.  Two passes a round over the candidates where quickselect makes about three, each
    a compare and a swap of pairs.  Keys are offsets from the smallest in uint64 (a span of
    any int64 keys fits)."""
    n = 0  # victims decided
    mm = m  # the candidates still in question, at the front of keys/ids
    need = k
    base = np.uint64(kmin)
    span = np.uint64(kmax) - base
    hist = np.zeros(1 << RADIX_BITS, np.int64)
    while mm > RADIX_MIN // 16 and span != 0:
        sh = np.uint64(max(bit_length(span) - RADIX_BITS, 0))
        hist[:] = 0
        for j in range(mm):
            hist[(np.uint64(keys[j]) - base) >> sh] += 1
        below = 0
        b = 0
        while below + hist[b] < need:
            below += hist[b]
            b += 1
        ub = np.uint64(b)
        t = 0
        lo = hi = np.uint64(0)  # the kept keys' span, as offsets from base
        for j in range(mm):
            o = np.uint64(keys[j]) - base
            d = o >> sh
            if d < ub:
                out_ids[n] = ids[j]
                n += 1
            elif d == ub:  # (t <= j: compacted in place)
                if t == 0 or o < lo:
                    lo = o
                if t == 0 or o > hi:
                    hi = o
                keys[t] = keys[j]
                ids[t] = ids[j]
                t += 1
        mm = t
        need -= below
        if need == mm:  # the whole bucket
            break
        base += lo
        span = hi - lo  # (0: one key, its ties by id below)
    if need < mm:
        _nth_pair(keys, ids, mm, need)
    for j in range(need):
        out_ids[n + j] = ids[j]
    return k


@njit(cache=True, inline="always")
def _pair_less(keys, ids, a, b):  # type: ignore[no-untyped-def]
    return keys[a] < keys[b] or (keys[a] == keys[b] and ids[a] < ids[b])


@njit(cache=True, inline="always")
def _pair_swap(keys, ids, a, b):  # type: ignore[no-untyped-def]
    keys[a], keys[b] = keys[b], keys[a]
    ids[a], ids[b] = ids[b], ids[a]


@njit(cache=True)
def _nth_pair(keys, ids, m, k):  # type: ignore[no-untyped-def]
    """Reorder ``keys[:m]``/``ids[:m]`` so that their ``k`` smallest (key, id) pairs come
    first (in no order): quickselect, median of three (the pairs are distinct: ids are)."""
    lo, hi = 0, m - 1
    while hi > lo:
        mid = (lo + hi) >> 1
        if _pair_less(keys, ids, mid, lo):
            _pair_swap(keys, ids, mid, lo)
        if _pair_less(keys, ids, hi, lo):
            _pair_swap(keys, ids, hi, lo)
        if _pair_less(keys, ids, hi, mid):
            _pair_swap(keys, ids, hi, mid)
        _pair_swap(keys, ids, mid, hi)  # the median of three as the pivot, at hi
        p = lo
        for j in range(lo, hi):
            if _pair_less(keys, ids, j, hi):
                _pair_swap(keys, ids, j, p)
                p += 1
        _pair_swap(keys, ids, p, hi)  # the pivot in place: [lo, p) below it, (p, hi] above
        if p == k - 1 or p == k:
            return
        if p > k:
            hi = p - 1
        else:
            lo = p + 1
