"""The compiled replay loop (numba): one call replays a whole flattened plan.

This is the numpy engine of :mod:`kvcxl.emu.sim.simulator` written as one loop over
batches and entries, so that a batch of one read costs what one read costs.  It holds
no formula of its own that is not checked against :mod:`kvcxl.firmware`:

* the float recency decay arrives as a table computed by
  :func:`kvcxl.firmware.formulas.recency_decay`, the Q0.16 decay table from
  :func:`kvcxl.firmware.fixedpoint.decay_table`, Q0.16 weights from
  :func:`kvcxl.firmware.fixedpoint.to_q16` and the pins from the policy's own
  ``wants_pin`` (all computed before the call);
* the EMA steps, the priorities and the placement rule below are one-line copies of
  ``firmware/formulas.py`` and ``firmware/fixedpoint.py``; ``tests/test_sim_fast.py``
  compares each, bit for bit, with the firmware's function over every Q0.16 value
  (integer mode) and millions of random floats (float mode), and the replay as a whole
  against the numpy engine and ``tests/reference_engine.py``.

Victim order is the firmware's contract: priority descending, entry id ascending.  A
"key" here is ``-priority`` so that the smallest (key, id) goes first.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# Policy codes (kvcxl.emu.sim.fast.POLICY_CODES maps names to them).
LRU, FIFO, LFU, EMA_F, EMA_I, RANDOM, SINK, H2O, BELADY, LRFU = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
HBM, CXL, NVME, HOST = 1, 2, 3, 4  # kvcxl.firmware.formulas tier codes; HOST as in tiers.py
LFU_SPAN = 1 << 40  # firmware/policies/lfu.py _TIME_SPAN: count major, last read minor
Q_MAX, HALF = 65535, 32768


# --- the formulas (each checked against kvcxl.firmware in tests/test_sim_fast.py) --------
@njit(cache=True, inline="always")
def ema_float(s: float, w: float, alpha: float) -> float:
    """EmaPolicy.end_step, float mode: ``s *= 1 − α; s += α·w``."""
    s = s * (1.0 - alpha)
    return s + alpha * w


@njit(cache=True, inline="always")
def ema_q16(s: int, w: int, alpha_q: int) -> int:
    """fixedpoint.ema_update_q16."""
    return (alpha_q * w + (65536 - alpha_q) * s + HALF) >> 16


LOG2E = 1.4426950408889634074  # numpy's NPY_LOG2E


@njit(cache=True, inline="always")
def logaddexp2(x: float, y: float) -> float:
    """numpy's logaddexp2 (npy_logaddexp2: log2(2^x + 2^y) without overflow)."""
    if x == y:
        return x + 1.0
    tmp = x - y
    if tmp > 0:
        return x + LOG2E * math.log1p(2.0 ** (-tmp))
    if tmp <= 0:
        return y + LOG2E * math.log1p(2.0**tmp)
    return tmp


@njit(cache=True, inline="always")
def priority_float(s: float, r: float) -> float:
    """formulas.eviction_priority given r = recency_decay(idle)."""
    return (1.0 - s) * r


@njit(cache=True, inline="always")
def priority_q16(s: int, idle: int, table: np.ndarray, shift: int) -> int:
    """fixedpoint.eviction_priority_q16."""
    i = min(idle, 65535) >> shift
    return ((Q_MAX - s) * table[min(i, 255)] + HALF) >> 16


_GOLD = np.uint64(0x9E3779B97F4A7C15)  # firmware/policies/random.py
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """policies.random.splitmix64 (wrapping uint64 arithmetic)."""
    z = x + _GOLD
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def random_base(seed: np.uint64, time: int) -> np.uint64:
    """RandomPolicy.priority's per-call base: splitmix64(seed·GOLD + time)."""
    return splitmix64(seed * _GOLD + np.uint64(time))


@njit(cache=True, inline="always")
def random_priority(base: np.uint64, e: int) -> int:
    """RandomPolicy.priority of entry ``e``: the top 53 bits of splitmix64(id ^ base)."""
    return np.int64(splitmix64(np.uint64(e) ^ base) >> np.uint64(11))


@njit(cache=True, inline="always")
def age_tokens(e, e_ctx, e_block, bt, ctx_tokens):  # type: ignore[no-untyped-def]
    """EntryTable.age_tokens: how far behind its context's newest token the entry's last
    token is, max(length − 1 − last_token, 0)."""
    last_token = e_block[e] * bt + bt - 1
    return max(ctx_tokens[e_ctx[e]] - 1 - last_token, 0)


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


@njit(cache=True)
def _keys(
    pol,
    ids,
    n,
    out,
    last,
    count,
    s_f,
    s_q,
    idle,
    decay_f,
    decay_q,
    shift,
    lfu_span,
    lfu_minor,
    rbase,
    e_ctx,
    e_block,
    bt,
    ctx_tokens,
    acc,
    recent,
    lcrf,
    lam,
    t,
):  # type: ignore[no-untyped-def]
    """Keys (−priority, as int64s ordered like it) of ``ids[:n]`` into ``out``: one call per
    list, not per entry (a call per entry costs more than the key)."""
    if pol == EMA_F:
        for j in range(n):
            e = ids[j]
            out[j] = float_key(-priority_float(s_f[e], decay_f[idle[e]]))
    elif pol == EMA_I:
        for j in range(n):
            e = ids[j]
            out[j] = -priority_q16(s_q[e], idle[e], decay_q, shift)
    elif pol == LFU:
        for j in range(n):
            e = ids[j]
            out[j] = count[e] * lfu_span + last[e] * lfu_minor
    elif pol == RANDOM:
        for j in range(n):
            out[j] = -random_priority(rbase, ids[j])
    elif pol == SINK:
        for j in range(n):
            out[j] = -age_tokens(ids[j], e_ctx, e_block, bt, ctx_tokens)
    elif pol == BELADY:  # `last` holds each entry's next read (Future.next_use)
        for j in range(n):
            out[j] = -last[ids[j]]
    elif pol == LRFU:  # LrfuPolicy.priority negated: log CRF decayed to now
        for j in range(n):
            e = ids[j]
            out[j] = float_key(lcrf[e] - lam * (t - last[e]))
    elif pol == H2O:
        for j in range(n):
            e = ids[j]
            if age_tokens(e, e_ctx, e_block, bt, ctx_tokens) < recent:
                out[j] = float_key(np.inf)
            else:
                out[j] = float_key(acc[e])
    else:
        for j in range(n):
            out[j] = last[ids[j]]


@njit(cache=True)
def _priorities(
    pol,
    ids,
    n,
    out,
    last,
    count,
    s_f,
    s_q,
    idle,
    decay_f,
    decay_q,
    shift,
    lfu_span,
    lfu_minor,
    rbase,
    e_ctx,
    e_block,
    bt,
    ctx_tokens,
    acc,
    recent,
    lcrf,
    lam,
    t,
):  # type: ignore[no-untyped-def]
    """Priorities of ``ids[:n]`` into ``out`` as the numpy engine reports them (float64)."""
    for j in range(n):
        e = ids[j]
        if pol == EMA_F:
            out[j] = priority_float(s_f[e], decay_f[idle[e]])
        elif pol == EMA_I:
            out[j] = float(priority_q16(s_q[e], idle[e], decay_q, shift))
        elif pol == LFU:
            out[j] = float(-(count[e] * lfu_span + last[e] * lfu_minor))
        elif pol == RANDOM:
            out[j] = float(random_priority(rbase, e))
        elif pol == SINK:
            out[j] = float(age_tokens(e, e_ctx, e_block, bt, ctx_tokens))
        elif pol == BELADY:
            out[j] = float(last[e])
        elif pol == LRFU:
            out[j] = -(lcrf[e] - lam * (t - last[e]))
        elif pol == H2O:
            recent_e = age_tokens(e, e_ctx, e_block, bt, ctx_tokens) < recent
            out[j] = -np.inf if recent_e else -acc[e]
        else:
            out[j] = float(-last[e])


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


@njit(cache=True)
def replay(  # one loop over the plan: no Python call per batch
    pol: int,
    b_read: np.ndarray,
    b_step: np.ndarray,
    b_off: np.ndarray,
    read_steps: np.ndarray,
    b_tokens: np.ndarray,
    p_ids: np.ndarray,
    p_w: np.ndarray,
    p_wq: np.ndarray,
    n_total: int,
    want_pin: np.ndarray,
    lazy: bool,
    capacity: int,
    pinned_capacity: int,
    persistent: bool,
    eviction_batch: int,
    alpha: float,
    touch_f: float,
    alpha_q: int,
    touch_q: int,
    decay_f: np.ndarray,
    decay_q: np.ndarray,
    shift: int,
    nvme_below: float,
    cxl_cap: int,
    nvme_cap: int,
    eb: int,
    cxl_lat: float,
    cxl_gbps: float,
    nvme_lat: float,
    nvme_gbps: float,
    npos: int,
    record: bool,
    lfu_span: int,
    lfu_minor: int,
    per_request: bool,
    seed: np.uint64,
    e_ctx: np.ndarray,
    e_block: np.ndarray,
    bt: int,
    n_ctx: int,
    b_loff: np.ndarray,
    l_ctx: np.ndarray,
    l_tok: np.ndarray,
    recent: int,
    nxt0: np.ndarray,
    rec_next: np.ndarray,
    bypass: bool,
    lam: float,
):  # type: ignore[no-untyped-def]
    """Replay the plan; returns (books, tiers, stats, victim dump, error).  ``nvme_below``:
    a victim whose score is below it goes to NVMe (−inf: never).  LFU's key is
    ``count·lfu_span + last·lfu_minor``: (LFU_SPAN, 1) ties to the least recent read,
    (1, 0) to the lower id alone (its lfu_tie_break)."""
    n = n_total
    ema = pol == EMA_F or pol == EMA_I
    # books
    reads = np.zeros(npos, np.int64)
    hits = np.zeros(npos, np.int64)
    miss = np.zeros((npos, 4), np.int64)
    stall = np.zeros(npos, np.float64)
    tokens = np.zeros(npos, np.int64)
    moved = np.zeros((npos, 5, 4), np.int64)
    # cache
    resident = np.zeros(n, np.bool_)
    pinned = np.zeros(n, np.bool_)
    created = np.zeros(n, np.bool_)
    n_res = 0
    n_pinned = 0
    s_hits = s_miss = s_ins = s_evict = s_pass = 0
    res_list = np.empty(n, np.int64)  # resident, unpinned entries (swap-remove)
    res_pos = np.full(n, -1, np.int64)
    n_list = 0
    n_desc = 0
    # policy state (the columns of firmware/policies/*.py, with their fills); only the
    # policy's own are allocated
    # lru, fifo (fill −1); lfu, lrfu (0); belady (its next read)
    last = np.full(0 if ema else n, 0 if pol == LFU or pol == LRFU else -1, np.int64)
    lcrf = np.full(n if pol == LRFU else 0, -np.inf, np.float64)
    count = np.zeros(n if pol == LFU else 0, np.int64)
    s_f = np.zeros(n if pol == EMA_F else 0, np.float64)
    w_f = np.zeros(n if pol == EMA_F else 0, np.float64)
    s_q = np.zeros(n if pol == EMA_I else 0, np.int64)
    w_q = np.zeros(n if pol == EMA_I else 0, np.int64)
    idle = np.zeros(n if ema else 0, np.int64)
    touched = np.zeros(n if ema else 0, np.bool_)
    acc = np.zeros(n if pol == H2O else 0, np.float64)
    by_age = pol == SINK or pol == H2O  # ranked by age in tokens: context lengths kept
    ctx_tokens = np.zeros(n_ctx if by_age else 0, np.int64)
    # A heap of the resident unpinned entries by (key, id) serves small evictions: keys
    # change only by an entry's own events (marked dirty, pushed again before the next
    # pop) and, for the EMA, at step ends (the heap is rebuilt).  Large evictions scan.
    hcap = 2 * n + 64  # rebuilt (to at most n items) before it would overflow
    hk = np.empty(hcap, np.int64)
    hi = np.empty(hcap, np.int64)
    hv = np.empty(hcap, np.int64)
    hsize = 0
    hhead = 0  # LRU/FIFO: the queue's head (items before it are consumed)
    queue = pol == LRU or pol == FIFO
    plain = queue or pol == LFU  # a hit's only effect: its key (the per-request fast path)
    stale = True  # the heap must be rebuilt before use
    ver = np.zeros(n, np.int64)
    dirty = np.zeros(n, np.bool_)
    dirty_list = np.empty(n, np.int64)
    n_dirty = 0
    # tiers
    tier = np.zeros(n, np.uint8)
    tcount = np.zeros(4, np.int64)
    spills = cxl_cap < n  # else CXL DRAM has room for every entry
    since = np.zeros(n if spills else 0, np.int64)
    ccap = 2 * n + 64 if spills else 0
    cxl_k = np.empty(ccap, np.int64)  # CXL DRAM arrivals by (since, id)
    cxl_i = np.empty(ccap, np.int64)
    cxl_v = np.empty(ccap, np.int64)
    cxl_size = 0
    cxl_ver = np.zeros(n if spills else 0, np.int64)
    # scratch, every array at its largest size up front: an array variable reassigned in
    # the loop costs reference counting on every iteration (20x on one-read batches)
    stamp = np.zeros(n, np.int64)  # the call that last marked an entry (a batch member)
    adm = np.empty(n, np.int64)
    cand_id = np.empty(n, np.int64)
    cand_k = np.empty(n, np.int64)
    vic = np.empty(n, np.int64)
    stash = np.empty(2 * n, np.int64)
    mark = np.zeros(n, np.bool_)
    # dump
    d_id = np.empty(p_ids.size + n if record else 0, np.int64)  # victims <= admissions
    d_pr = np.empty(p_ids.size + n if record else 0, np.float64)
    d_key = np.empty(p_ids.size + n if record else 0, np.int64)
    d_call = np.empty(p_ids.size + n if record else 0, np.int64)  # the call of each victim
    call_batch = np.zeros(2 * (b_step.size + p_ids.size) + 2 if record else 0, np.int64)
    n_dump = 0
    err = 0
    time = 0
    call = 0
    open_step = 0
    pos = 0
    have_open = False

    nb = b_step.size
    pos_step = -1
    for b in range(nb):
        if per_request and b_read[b] and b_off[b + 1] == b_off[b]:
            continue  # a layer without reads is no request at all
        step = b_step[b]
        if b == 0 or step != pos_step:  # _StepBooks.position: the first read step at or
            pos = min(np.searchsorted(read_steps, step), npos - 1)  # after this one
            pos_step = step
        if have_open and step != open_step and ema:
            # end_step of the open step (EmaPolicy.end_step) over every described entry
            if pol == EMA_F:
                for e in range(n_desc):
                    s_f[e] = ema_float(s_f[e], w_f[e], alpha)
                    idle[e] = 0 if touched[e] else idle[e] + 1
                    w_f[e] = 0.0
                    touched[e] = False
            else:
                for e in range(n_desc):
                    s_q[e] = ema_q16(s_q[e], w_q[e], alpha_q)
                    idle[e] = 0 if touched[e] else min(idle[e] + 1, 65535)
                    w_q[e] = 0
                    touched[e] = False
            stale = True
        open_step = step
        have_open = True
        a0, z0 = b_off[b], b_off[b + 1]
        n_sub = z0 - a0 if per_request and b_read[b] else 1
        nxt_sb = 0
        while nxt_sb < n_sub:  # request granularity: every read its own batch
            sb = nxt_sb
            nxt_sb += 1
            if n_sub == 1:
                a, z = a0, z0
            else:
                a, z = a0 + sb, a0 + sb + 1
            tok = b_tokens[b] if sb == 0 else 0  # (the step's tokens ride on its first)
            if sb == 0 and by_age:  # FirmwareSession.lengths before the batch (never shrink)
                for j in range(b_loff[b], b_loff[b + 1]):
                    ctx_tokens[l_ctx[j]] = max(ctx_tokens[l_ctx[j]], l_tok[j])
            if n_sub > 1 and plain and n_res <= capacity and resident[p_ids[a]]:
                # Reads of resident entries (LRU, FIFO, LFU), one after another: what the two
                # calls below do for each, without them (most of a mostly-hit request
                # replay): the write call has nothing to write, the read call one hit,
                # on_access, and no room to make.  The run ends at the first non-resident.
                j = a
                while j < z0:
                    e = p_ids[j]
                    if not resident[e]:
                        break
                    call += 2
                    stamp[e] = call
                    if pol != FIFO:  # on_access (FIFO's key does not change)
                        if pol == LFU:
                            count[e] += 1
                        last[e] = time
                        if not stale and not dirty[e]:
                            dirty[e] = True
                            dirty_list[n_dirty] = e
                            n_dirty += 1
                    time += 1
                    if n_dirty * 2 > n_list:
                        stale = True
                    j += 1
                h = j - a
                t = time - 1  # (the last hit's time, as its read call left it)
                s_hits += h
                reads[pos] += h
                hits[pos] += h
                tokens[pos] += tok
                nxt_sb = sb + h
                continue
            # Up to two calls per batch: a write (the batch's own, or a trace's entries written
            # just before their first read), then the reads.
            for phase in range(2):
                n_prot = 0  # this call's entries, resident and unpinned after admission
                if phase == 0:  # the write
                    call += 1
                    if b_read[b]:
                        if not lazy:
                            continue
                        na = 0
                        for j in range(a, z):
                            e = p_ids[j]
                            if not created[e] and stamp[e] != call:
                                stamp[e] = call
                                adm[na] = e
                                na += 1
                        if na > 1:
                            adm[:na] = np.sort(adm[:na])
                    else:
                        na = z - a
                        for j in range(na):
                            adm[j] = p_ids[a + j]
                    if na == 0:
                        continue
                    is_write = True
                    # tiers.create, then FirmwareSession.write at the last read batch's time
                    t = time - 1 if time > 0 or pol == BELADY else 0  # (offline: −1 first)
                    for j in range(na):
                        e = adm[j]
                        created[e] = True
                        if pol == BELADY:
                            last[e] = nxt0[e]  # its first read
                        if e + 1 > n_desc:
                            n_desc = e + 1
                        if by_age:  # EntryTable.append: at least its last block's first token
                            # + 1; a trace's entry written on first read: its block full
                            tl = (e_block[e] + 1) * bt if b_read[b] else e_block[e] * bt + 1
                            ctx_tokens[e_ctx[e]] = max(ctx_tokens[e_ctx[e]], tl)
                        tier[e] = HBM
                        stamp[e] = call
                    tcount[HBM] += na
                    moved[pos, HOST, HBM] += na
                else:
                    if not b_read[b]:
                        continue
                    call += 1
                    is_write = False
                    t = time
                    m = z - a
                    nh = 0
                    c_cxl = 0
                    c_nvme = 0
                    na = 0
                    for j in range(a, z):  # hits: resident at the batch's start
                        e = p_ids[j]
                        first = stamp[e] != call
                        stamp[e] = call  # every read entry is protected
                        if resident[e]:
                            nh += 1
                            if first and not pinned[e]:
                                n_prot += 1
                        else:
                            tr = tier[e]
                            miss[pos, tr] += 1
                            if tr == CXL:
                                c_cxl += 1
                            elif tr == NVME:
                                c_nvme += 1
                            if first:  # the misses to admit, once each
                                adm[na] = e
                                na += 1
                    s_hits += nh
                    s_miss += m - nh
                    reads[pos] += m
                    hits[pos] += nh
                    tokens[pos] += tok
                    if c_cxl:
                        stall[pos] += cxl_lat + (c_cxl * eb) / cxl_gbps
                    if c_nvme:
                        stall[pos] += nvme_lat + (c_nvme * eb) / nvme_gbps
                    # the order matters only to pinning (ascending ids take free slots)
                    if na > 1 and pinned_capacity - n_pinned > 0:
                        adm[:na] = np.sort(adm[:na])
                    # tiers.promote
                    for j in range(na):
                        e = adm[j]
                        src = tier[e]
                        moved[pos, src, HBM] += 1
                        tcount[src] -= 1
                        tier[e] = HBM
                    tcount[HBM] += na
                # --- PolicyCache._admit(adm[:na]) ---
                n_res += na
                s_ins += na
                free = pinned_capacity - n_pinned
                for j in range(na):
                    e = adm[j]
                    resident[e] = True
                    if free > 0 and want_pin[e]:
                        pinned[e] = True
                        n_pinned += 1
                        free -= 1
                    else:
                        res_list[n_list] = e
                        res_pos[e] = n_list
                        n_list += 1
                        n_prot += 1
                    # on_insert
                    if pol == LRU or pol == FIFO:
                        last[e] = t
                    elif not persistent:
                        if pol == LFU:
                            count[e] = 0
                            last[e] = 0
                        elif pol == EMA_F:
                            s_f[e] = 0.0
                            w_f[e] = 0.0
                            idle[e] = 0
                            touched[e] = False
                        elif pol == EMA_I:
                            s_q[e] = 0
                            w_q[e] = 0
                            idle[e] = 0
                            touched[e] = False
                        elif pol == H2O:
                            acc[e] = 0.0
                        elif pol == LRFU:
                            lcrf[e] = -np.inf
                            last[e] = 0
                    if not stale and not dirty[e]:  # (a stale heap is rebuilt whole)
                        dirty[e] = True
                        dirty_list[n_dirty] = e
                        n_dirty += 1
                # --- on_access (reads only) ---
                if not is_write:
                    for j in range(a, z):
                        e = p_ids[j]
                        key_changed = True
                        if pol == LRU:
                            last[e] = t
                        elif pol == LFU:
                            count[e] += 1
                            last[e] = t
                        elif pol == EMA_F:
                            wv = p_w[j]
                            if wv > w_f[e]:
                                w_f[e] = wv
                            key_changed = wv >= touch_f
                            if key_changed:
                                touched[e] = True
                                idle[e] = 0
                        elif pol == EMA_I:
                            wq = p_wq[j]
                            if wq > w_q[e]:
                                w_q[e] = wq
                            key_changed = wq >= touch_q
                            if key_changed:
                                touched[e] = True
                                idle[e] = 0
                        elif pol == H2O:  # np.add.at: in record order
                            acc[e] += p_w[j]
                            key_changed = False
                        elif pol == BELADY:
                            last[e] = rec_next[j]
                        elif pol == LRFU:
                            if stamp[e] == call:  # once per entry: numpy's last write wins
                                stamp[e] = -call
                                lcrf[e] = logaddexp2(lcrf[e] - lam * (t - last[e]), 0.0)
                                last[e] = t
                        else:
                            key_changed = False
                        if key_changed and not stale and not dirty[e]:
                            dirty[e] = True
                            dirty_list[n_dirty] = e
                            n_dirty += 1
                    if pol == LRFU:
                        for j in range(a, z):
                            if stamp[p_ids[j]] == -call:
                                stamp[p_ids[j]] = call
                    time += 1
                if n_dirty * 2 > n_list:  # cheaper to rebuild than to push them all
                    stale = True
                # --- PolicyCache._make_room ---
                over = n_res - capacity
                if over <= 0:
                    continue
                # else the call's entries compete too (the bypassing optimum: always)
                protect = n_list - n_prot >= over and not bypass
                rbase = random_base(seed, t)  # (random: its keys move with the batch time)
                nv = 0
                if over * 16 <= n_list and (pol < RANDOM or pol == BELADY):  # static keys
                    # the heap: few victims among many
                    if queue and not stale and hsize + n_dirty > hcap:
                        hsize = _compact(hk, hi, hv, hhead, hsize, ver, resident, pinned)
                        hhead = 0
                    if stale or hsize + n_dirty > hcap:
                        hsize = n_list
                        hhead = 0
                        for j in range(n_list):
                            e = res_list[j]
                            ver[e] += 1
                            hi[j] = e
                            hv[j] = ver[e]
                        _keys(
                            pol,
                            hi,
                            hsize,
                            hk,
                            last,
                            count,
                            s_f,
                            s_q,
                            idle,
                            decay_f,
                            decay_q,
                            shift,
                            lfu_span,
                            lfu_minor,
                            rbase,
                            e_ctx,
                            e_block,
                            bt,
                            ctx_tokens,
                            acc,
                            recent,
                            lcrf,
                            lam,
                            t,
                        )
                        if queue:
                            _sort_items(hk, hi, hv, 0, hsize, ver)
                        else:
                            _heapify(hk, hi, hv, hsize)
                        for j in range(n_dirty):
                            dirty[dirty_list[j]] = False
                        n_dirty = 0
                        stale = False
                    else:
                        nd = 0
                        for j in range(n_dirty):
                            e = dirty_list[j]
                            dirty[e] = False
                            if resident[e] and not pinned[e]:
                                dirty_list[nd] = e
                                nd += 1
                        # (inline for the plain keys: a call with arrays costs more than they do)
                        if pol == LRU or pol == FIFO:
                            for j in range(nd):
                                cand_k[j] = last[dirty_list[j]]
                        elif pol == LFU:
                            for j in range(nd):
                                e = dirty_list[j]
                                cand_k[j] = count[e] * lfu_span + last[e] * lfu_minor
                        else:
                            _keys(
                                pol, dirty_list, nd, cand_k, last, count, s_f, s_q, idle, decay_f,
                                decay_q, shift, lfu_span, lfu_minor, rbase, e_ctx, e_block, bt,
                                ctx_tokens, acc, recent, lcrf, lam, t,
                            )  # fmt: skip
                        if queue:
                            if nd > 16:  # sorted first, so that each lands at the tail
                                for j in range(nd):
                                    hk[hsize + j] = cand_k[j]
                                    hi[hsize + j] = dirty_list[j]
                                _sort_items(hk, hi, hv, hsize, hsize + nd, ver)
                                for j in range(nd):
                                    cand_k[j] = hk[hsize + j]
                                    dirty_list[j] = hi[hsize + j]
                            for j in range(nd):
                                e = dirty_list[j]
                                ver[e] += 1
                                hsize = _enqueue(hk, hi, hv, hhead, hsize, cand_k[j], e, ver[e])
                        else:
                            for j in range(nd):
                                e = dirty_list[j]
                                ver[e] += 1
                                hsize = _push(hk, hi, hv, hsize, cand_k[j], e, ver[e])
                        n_dirty = 0
                    n_st = 0
                    while nv < over and hsize > hhead:
                        if queue:
                            key, e, v = hk[hhead], hi[hhead], hv[hhead]
                            hhead += 1
                        else:
                            key, e, v, hsize = _pop(hk, hi, hv, hsize)
                        if not resident[e] or pinned[e] or v != ver[e]:
                            continue
                        if protect and stamp[e] == call:
                            stash[2 * n_st] = e
                            stash[2 * n_st + 1] = key  # (unchanged: the item was current)
                            n_st += 1
                            continue
                        vic[nv] = e
                        nv += 1
                    if queue:  # back to the head, in their order (they were popped from it)
                        for j in range(n_st - 1, -1, -1):
                            e = stash[2 * j]
                            hhead -= 1
                            hk[hhead], hi[hhead], hv[hhead] = stash[2 * j + 1], e, ver[e]
                    else:
                        for j in range(n_st):
                            e = stash[2 * j]
                            hsize = _push(hk, hi, hv, hsize, stash[2 * j + 1], e, ver[e])
                else:
                    mc = 0
                    for j in range(n_list):
                        e = res_list[j]
                        if protect and stamp[e] == call:
                            continue
                        cand_id[mc] = e
                        mc += 1
                    _keys(
                        pol,
                        cand_id,
                        mc,
                        cand_k,
                        last,
                        count,
                        s_f,
                        s_q,
                        idle,
                        decay_f,
                        decay_q,
                        shift,
                        lfu_span,
                        lfu_minor,
                        rbase,
                        e_ctx,
                        e_block,
                        bt,
                        ctx_tokens,
                        acc,
                        recent,
                        lcrf,
                        lam,
                        t,
                    )
                    kmin = cand_k[0] if mc else 0
                    kmax = kmin
                    for j in range(mc):
                        kmin = min(kmin, cand_k[j])
                        kmax = max(kmax, cand_k[j])
                    nv = _select(cand_k, cand_id, mc, over, kmin, kmax, vic, mark)
                s_pass += (nv + eviction_batch - 1) // eviction_batch
                # --- the victims leave: dump, placement, on_evict, tiers.demote ---
                if record:  # each victim with its priority and key (ordered afterwards)
                    d_id[n_dump : n_dump + nv] = vic[:nv]
                    d_call[n_dump : n_dump + nv] = call
                    call_batch[call] = b
                    pr = d_pr[n_dump : n_dump + nv]
                    _priorities(
                        pol, vic, nv, pr, last, count, s_f, s_q, idle, decay_f, decay_q, shift,
                        lfu_span, lfu_minor, rbase, e_ctx, e_block, bt, ctx_tokens, acc,
                        recent,
                        lcrf,
                        lam,
                        t,
                    )  # fmt: skip
                    dk = d_key[n_dump : n_dump + nv]
                    _keys(
                        pol, vic, nv, dk, last, count, s_f, s_q, idle, decay_f, decay_q, shift,
                        lfu_span, lfu_minor, rbase, e_ctx, e_block, bt, ctx_tokens, acc,
                        recent,
                        lcrf,
                        lam,
                        t,
                    )  # fmt: skip
                    n_dump += nv
                compact = nv * 4 > n_list  # many leave: one pass over the list, not a swap each
                for j in range(nv):
                    e = vic[j]
                    dest = CXL  # session.place, as the victim leaves (before it is forgotten)
                    if pol == EMA_F:
                        if s_f[e] < nvme_below:
                            dest = NVME
                    elif pol == EMA_I:
                        if s_q[e] / 65536.0 < nvme_below:
                            dest = NVME
                    resident[e] = False
                    if not compact:
                        p = res_pos[e]
                        moved_e = res_list[n_list - 1]
                        res_list[p] = moved_e
                        res_pos[moved_e] = p
                        res_pos[e] = -1
                        n_list -= 1
                    if not persistent:  # on_evict: the policy forgets the entry
                        if pol == LFU:
                            count[e] = 0
                            last[e] = 0
                        elif pol == LRU or pol == FIFO:
                            last[e] = -1
                        elif pol == EMA_F:
                            s_f[e] = 0.0
                            w_f[e] = 0.0
                            idle[e] = 0
                            touched[e] = False
                        elif pol == EMA_I:
                            s_q[e] = 0
                            w_q[e] = 0
                            idle[e] = 0
                            touched[e] = False
                        elif pol == H2O:
                            acc[e] = 0.0
                        elif pol == LRFU:
                            lcrf[e] = -np.inf
                            last[e] = 0
                    src = tier[e]
                    moved[pos, src, dest] += 1
                    tcount[src] -= 1
                    tcount[dest] += 1
                    tier[e] = dest
                    if spills:
                        since[e] = t
                        if dest == CXL:
                            if cxl_size >= ccap:
                                cxl_size = 0
                                for x in range(n_desc):
                                    if tier[x] == CXL:
                                        cxl_k[cxl_size] = since[x]
                                        cxl_i[cxl_size] = x
                                        cxl_v[cxl_size] = cxl_ver[x]
                                        cxl_size += 1
                                _heapify(cxl_k, cxl_i, cxl_v, cxl_size)
                            else:
                                cxl_ver[e] += 1
                                cxl_size = _push(cxl_k, cxl_i, cxl_v, cxl_size, t, e, cxl_ver[e])
                if compact:
                    k = 0
                    for j in range(n_list):
                        e = res_list[j]
                        if resident[e]:
                            res_list[k] = e
                            res_pos[e] = k
                            k += 1
                        else:
                            res_pos[e] = -1
                    n_list = k
                n_res -= nv
                s_evict += nv
                if nv:
                    # tiers._spill: the earliest arrivals in CXL DRAM go down to NVMe
                    spill = tcount[CXL] - cxl_cap
                    while spill > 0 and cxl_size > 0:
                        key, e, v, cxl_size = _pop(cxl_k, cxl_i, cxl_v, cxl_size)
                        if tier[e] != CXL or v != cxl_ver[e]:
                            continue
                        tier[e] = NVME
                        since[e] = t
                        moved[pos, CXL, NVME] += 1
                        tcount[CXL] -= 1
                        tcount[NVME] += 1
                        spill -= 1
                    if tcount[NVME] > nvme_cap:
                        err = 1
                        break
            if err:
                break
        if err:
            break
    stats = np.array([s_hits, s_miss, s_ins, s_evict, s_pass, n_pinned, n_res, n_desc])
    return (
        reads, hits, miss, stall, tokens, moved, tier, tcount, stats,
        d_id[:n_dump], d_pr[:n_dump], d_key[:n_dump], d_call[:n_dump], call_batch, err,
    )  # fmt: skip
