"""The compiled replay loop, written once for every policy: one call replays a whole plan.

This is the numpy engine of :mod:`kvcxl.emu.sim.simulator` written as one loop over
batches and entries, so that a batch of one read costs what one read costs.  Everything
a policy decides comes from its module ``P`` (:mod:`kvcxl.emu.sim.fast.hooks` says what it
holds): this file is the template :mod:`kvcxl.emu.sim.fast.compose` copies once per policy
module with the import of ``P`` below replaced, so that numba compiles (and caches) a loop
specialised to that policy, its hooks inlined and its traits constants (no branch on a
policy code).  As written it binds ``lru``, so that it imports and lints as any module.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvcxl.emu.sim.fast import hooks
from kvcxl.emu.sim.fast import tiers as T
from kvcxl.emu.sim.fast.kernel import (
    CXL,
    HBM,
    HOST,
    NVME,
    RADIX_BITS,
    _compact,
    _enqueue,
    _heapify,
    _pop,
    _push,
    _select,
    _take,
    bit_length,
    borrowed,
    float_key,
    key_of,
    sort_ids,
)
from kvcxl.emu.sim.fast.policies import lru as P  # kvcxl-policy-module (compose.py)
from kvcxl.emu.sim.fast.prefetch import TOTAL as PF_TOTAL
from kvcxl.emu.sim.fast.prefetch import USEFUL as PF_USEFUL
from kvcxl.emu.sim.fast.prefetch import USEFUL_WARM as PF_USEFUL_WARM
from kvcxl.emu.sim.fast.prefetch import WASTED as PF_WASTED
from kvcxl.emu.sim.fast.prefetch import gather as pf_gather
from kvcxl.emu.sim.fast.prefetch import order as pf_order
from kvcxl.emu.sim.fast.prefetch import rank_float as pf_rank_float
from kvcxl.emu.sim.fast.prefetch import rank_q16 as pf_rank_q16
from kvcxl.emu.sim.fast.timeline import add_waits as log_waits
from kvcxl.emu.sim.fast.timeline import boundary as log_boundary
from kvcxl.emu.sim.fast.timeline import boundary_begins as log_boundary_begins
from kvcxl.emu.sim.fast.timeline import close as log_close
from kvcxl.emu.sim.fast.timeline import hit_records as log_hits
from kvcxl.emu.sim.fast.timeline import inside as log_inside
from kvcxl.emu.sim.fast.timeline import open_record as log_open
from kvcxl.emu.sim.fast.timeline import outside as log_outside
from kvcxl.emu.sim.fast.timeline import prefetch_begins as log_prefetch
from kvcxl.emu.sim.fast.timeline import seal as log_seal
from kvcxl.emu.sim.fast.work import (
    CALL,
    CXL_SIZE,
    ERR,
    EVICTIONS,
    HHEAD,
    HITS,
    HSIZE,
    INSERTS,
    LBASE,
    LSHIFT,
    LSTALE,
    MISSES,
    N_DESC,
    N_DIRTY,
    N_DUMP,
    N_LIST,
    N_PINNED,
    N_PROT,
    N_RES,
    OWN_A,
    OWN_ADM,
    OWN_Z,
    PASSES,
    POS,
    QRUN,
    QRUN_END,
    STALE,
    TIME,
    Books,
    Cache,
    Dump,
    Env,
    Heap,
    Marks,
    Scratch,
    Tiers,
    Work,
)
from kvcxl.emu.sim.fast.work import COUNTERS as N_COUNTERS
from kvcxl.emu.sim.fast.work import T as T_NOW

# The policy's traits and hooks, frozen as constants when numba compiles the loop.
STATIC = hooks.trait(P, "STATIC")
QUEUE = hooks.trait(P, "QUEUE")
TOUCH = hooks.trait(P, "TOUCH")
BY_AGE = hooks.trait(P, "BY_AGE")
ONCE = hooks.trait(P, "ONCE")
STEPS = hooks.has(P, "end_step")
SCORED = hooks.has(P, "score")
SELECT = hooks.has(P, "select")
SELECT_ALL = hooks.has(P, "select_all")  # (a select over every eligible entry, listless)
LAYERED = SCORED  # managed tiers' eviction layers (FirmwareSession.managed: scored policies)
ADMIT = hooks.has(P, "on_admit")
# The per-read and per-entry hooks are inlined into the loop (numba IR), where the state's
# reference counts are detached (kernel.borrowed): a call of its own would count them.
priority = hooks.inlined(P.priority)
on_access = hooks.inlined(P.on_access)
on_insert = hooks.inlined(hooks.hook(P, "on_insert"))
forget = hooks.inlined(hooks.hook(P, "forget"))
on_evict = hooks.inlined(hooks.hook(P, "on_evict"))
score = hooks.inlined(hooks.hook(P, "score"))
score_q16 = hooks.inlined(hooks.hook(P, "score_q16"))
now_of = hooks.inlined(hooks.hook(P, "now"))
idle_steps = hooks.inlined(hooks.hook(P, "idle_steps"))
end_step = hooks.hook(P, "end_step")  # (once per step and pass: calls)
select = hooks.hook(P, "select")
select_all = hooks.hook(P, "select_all")
on_admit = hooks.hook(P, "on_admit")  # (once per call that admits)


# --- the replay in phases ------------------------------------------------------------------
# Each phase is a function of the replay's inputs ``env`` (work.Env) and its working state
# ``w`` (work.Work), both borrowed (kernel.borrowed: no reference count per array and
# call).  The per-batch and per-read phases are inlined (numba IR) into :func:`_batches`,
# so that they cost what the one loop they were written as cost; a phase keeps the scalars
# of ``w.c`` it updates in locals and writes them back once.


@njit(cache=True, inline="always")
def _promote(adm, na, pos, tier, tcount, moved):  # type: ignore[no-untyped-def]
    """tiers.promote: ``adm[:na]`` come up to HBM from their tiers (step position ``pos``)."""
    n_cxl = 0  # (the usual sources counted aside: no store per entry to the books)
    n_nvme = 0
    for j in range(na):
        e = adm[j]
        src = tier[e]
        if src == CXL:
            n_cxl += 1
        elif src == NVME:
            n_nvme += 1
        else:
            moved[pos, src, HBM] += 1
            tcount[src] -= 1
        tier[e] = HBM
    moved[pos, CXL, HBM] += n_cxl
    moved[pos, NVME, HBM] += n_nvme
    tcount[CXL] -= n_cxl
    tcount[NVME] -= n_nvme
    tcount[HBM] += na


@njit(cache=True, inline="always")
def _compact_queue(h, c, hhead, hsize):  # type: ignore[no-untyped-def]
    """The queue's heap compacted to its front (its size returned; its head is then 0); a
    split run's span is forgotten, since the run moved."""
    hsize = _compact(h.hk, h.hi, h.hv, hhead, hsize, h.ver)
    c[QRUN] = c[QRUN_END] = 0
    return hsize


@njit(cache=True, inline="always")
def _touched(env, w, e, t, changed, hsize, n_dirty, stale):  # type: ignore[no-untyped-def]
    """Entry ``e``'s key may have moved (``changed``) at time ``t``: a queue policy queues
    it again (unless pinned), a heap marks it dirty (unless the heap is ``stale``, rebuilt
    whole) and a listed entry's kept layer and key are taken again (unless stale too: its
    state was just touched, so this reads it in cache); returns (the heap's size, how many
    are dirty)."""
    h, cache = w.heap, w.cache
    if QUEUE:
        if changed and not cache.pinned[e]:
            k_ = key_of(priority(env.ps, env.tab, e, now_of(env.ps, t)))
            hsize = _enqueue(h.hk, h.hi, h.hv, hsize, k_, e, h.ver)
    elif STATIC and changed:
        if cache.lkey.size and not w.c[LSTALE] and cache.res_pos[e] >= 0:
            _rekey(env, w, cache.res_pos[e], e, now_of(env.ps, t))  # (else -1: unlisted)
        if not stale and not h.dirty[e]:
            h.dirty[e] = True
            h.dirty_list[n_dirty] = e
            n_dirty += 1
    return hsize, n_dirty


@njit(cache=True, inline="always")
def _hits(env, w, a, z0, step, tok):  # type: ignore[no-untyped-def]
    """Reads of resident entries from ``a`` on, one after another: what the write, read and
    room calls do for each, without them (most of a mostly-hit request replay): the write
    call has nothing to write, the read call one hit, on_access, and no room to make.  The
    run ends at the first non-resident; returns how many."""
    ps, c, h, cache = env.ps, w.c, w.heap, w.cache
    p_ids, p_w = env.plan.ids, env.plan.w
    call, time, hsize, hhead = c[CALL], c[TIME], c[HSIZE], c[HHEAD]
    n_dirty, stale, n_list = c[N_DIRTY], c[STALE] != 0, c[N_LIST]
    j = a
    while j < z0:
        e = p_ids[j]
        if not cache.resident[e]:
            break
        call += 2
        cache.stamp[e] = call
        changed = on_access(ps, e, j, p_w[j], time)
        if QUEUE and hsize == h.hk.size:
            hsize, hhead = _compact_queue(h, c, hhead, hsize), 0
        hsize, n_dirty = _touched(env, w, e, time, changed, hsize, n_dirty, stale)
        time += 1
        if STATIC and not QUEUE and n_dirty * 2 > n_list:
            stale = True
        j += 1
    c[CALL], c[TIME], c[HSIZE], c[HHEAD] = call, time, hsize, hhead
    c[N_DIRTY], c[STALE] = n_dirty, stale
    c[T_NOW] = time - 1  # (the last hit's time, as its read call left it)
    n = j - a
    pos, b = c[POS], w.books
    c[HITS] += n
    b.reads[pos] += n
    b.hits[pos] += n
    b.tokens[pos] += tok
    log_hits(env.tlog, n, pos, step, tok, b.moved)
    return n


@njit(cache=True, inline="always")
def _write(env, w, b, a, z, step):  # type: ignore[no-untyped-def]
    """The write call of batch ``b`` (its own entries, or a trace's entries written just
    before their first read) into ``adm``: tiers.create, then FirmwareSession.write at the
    last read batch's time; returns how many (−1: no write)."""
    plan, run, tab, c, cache = env.plan, env.run, env.tab, w.c, w.cache
    p_ids, adm, stamp = plan.ids, w.scratch.adm, cache.stamp
    c[CALL] += 1
    call = c[CALL]
    if plan.read[b]:
        if not run.lazy:
            return -1
        na = 0
        for j in range(a, z):
            e = p_ids[j]
            if not cache.created[e] and stamp[e] != call:
                stamp[e] = call
                adm[na] = e
                na += 1
        sort_ids(adm, 0, na)
    else:
        na = z - a
        for j in range(na):
            adm[j] = p_ids[a + j]
    if na == 0:
        return -1
    time = c[TIME]
    c[T_NOW] = time - 1 if time > 0 or run.offline else 0  # (offline: −1 first)
    n_desc, pos, ti, bt = c[N_DESC], c[POS], w.tiers, tab.bt
    for j in range(na):
        e = adm[j]
        cache.created[e] = True
        if e + 1 > n_desc:
            n_desc = e + 1
        if BY_AGE:  # EntryTable.append: at least its last block's first token + 1; a
            # trace's entry written on first read: its block full
            tl = (tab.e_block[e] + 1) * bt if plan.read[b] else tab.e_block[e] * bt + 1
            tab.ctx_tokens[tab.e_ctx[e]] = max(tab.ctx_tokens[tab.e_ctx[e]], tl)
        ti.tier[e] = HBM
        stamp[e] = call
    c[N_DESC] = n_desc
    ti.tcount[HBM] += na
    w.books.moved[pos, HOST, HBM] += na
    log_open(env.tlog, False, pos, step, 0, 0, 0, 0, 0, w.books.moved)
    return na


@njit(cache=True, inline="always")
def _read(env, w, b, a, z, step, tok):  # type: ignore[no-untyped-def]
    """The read call of batch ``b``: hits (resident at the batch's start), misses by tier
    and their stall, the misses to admit into ``adm`` (once each, promoted to HBM); returns
    (how many to admit, −1: no read; the call's protected hits)."""
    plan, media, c, cache, bk = env.plan, env.media, w.c, w.cache, w.books
    mk, adm, tier, p_ids = w.marks, w.scratch.adm, w.tiers.tier, plan.ids
    if not plan.read[b]:
        return -1, 0
    pf_log = env.pf.on and env.tlog.rows.shape[0] > 0
    c[CALL] += 1
    call, pos = c[CALL], c[POS]
    c[T_NOW] = c[TIME]
    m = z - a
    nh = n_prot = c_cxl = c_nvme = na = n_w = 0
    for j in range(a, z):
        e = p_ids[j]
        first = cache.stamp[e] != call
        cache.stamp[e] = call  # every read entry is protected
        if cache.resident[e]:
            nh += 1
            if first and not cache.pinned[e]:
                n_prot += 1
            if env.pf.on and mk.mark[e]:  # a useful prefetch (counted once)
                mk.mark[e] = False
                mk.cnt[PF_USEFUL] += 1
                if pf_log:  # (the read waits on the record that fetched it)
                    mk.recs[n_w] = mk.rec[e]
                    n_w += 1
        else:
            tr = tier[e]
            if tr == CXL:
                c_cxl += 1
            elif tr == NVME:
                c_nvme += 1
            else:
                bk.miss[pos, tr] += 1
            if first:  # the misses to admit, once each
                adm[na] = e
                na += 1
    bk.miss[pos, CXL] += c_cxl
    bk.miss[pos, NVME] += c_nvme
    c[HITS] += nh
    c[MISSES] += m - nh
    bk.reads[pos] += m
    bk.hits[pos] += nh
    bk.tokens[pos] += tok
    if c_cxl:
        bk.stall[pos] += media.cxl_lat + (c_cxl * media.entry_bytes) / media.cxl_gbps
    if c_nvme:
        bk.stall[pos] += media.nvme_lat + (c_nvme * media.entry_bytes) / media.nvme_gbps
    # the order matters only to pinning (ascending ids take free slots)
    if env.run.pinned_capacity - c[N_PINNED] > 0:
        sort_ids(adm, 0, na)
    log_seal(env.tlog, bk.moved)
    _promote(adm, na, pos, tier, w.tiers.tcount, bk.moved)
    log_open(env.tlog, True, pos, step, tok, nh, m, c_cxl, c_nvme, bk.moved)
    if n_w:  # (a call of its own only when there are waits)
        log_waits(env.tlog, mk.recs, n_w)
    return na, n_prot


@njit(cache=True, inline="always")
def _prefetch(env, w, b, a, z):  # type: ignore[no-untyped-def]
    """FirmwareSession.prefetch_candidates of read batch ``b``, then .prefetch at the read's
    time: the chosen ones into ``adm``, marked, promoted; returns how many (−1: none)."""
    pf, ps, c, tab, mk = env.pf, env.ps, w.c, env.tab, w.marks
    adm = w.scratch.adm
    if not pf.on or not env.plan.read[b]:
        return -1
    mc = pf_gather(pf, env.plan.ids, env.plan.w, a, z, tab.e_ctx, tab.e_block, c[N_DESC],
                   w.cache.resident)  # fmt: skip
    if mc == 0:
        return -1
    for j in range(mc):
        e = pf.cand[j]
        if pf.int_mode:  # (Q0.16 ranks are exact as floats)
            pf.rank[j] = float(pf_rank_q16(pf, pf.dist[e], score_q16(ps, e)))
        else:
            pf.rank[j] = pf_rank_float(pf, pf.dist[e], score(ps, e))
    na = pf_order(pf, mc, adm)
    c[CALL] += 1
    call = c[CALL]
    c[T_NOW] = c[TIME] - 1
    mk.cnt[PF_TOTAL] += na
    sort_ids(adm, 0, na)  # PolicyCache.insert admits in ascending id order
    log_prefetch(env.tlog, w.books.moved)
    pf_log = env.tlog.rows.shape[0] > 0
    for j in range(na):  # marked before its evictions settle
        e = adm[j]
        mk.mark[e] = True
        if pf_log:
            mk.rec[e] = env.tlog.st[0] - 1  # (the open read record)
        w.cache.stamp[e] = call
    _promote(adm, na, c[POS], w.tiers.tier, w.tiers.tcount, w.books.moved)
    return na


@njit(cache=True, inline="always")
def _admit(env, w, a, z, na, n_prot, is_write):  # type: ignore[no-untyped-def]
    """PolicyCache._admit(adm[:na]): resident, pinned while pins last, else listed (and
    counted in the call's protected ``n_prot``, returned), on_insert, queued or dirty."""
    ps, run, c, cache, h = env.ps, env.run, w.c, w.cache, w.heap
    adm, t = w.scratch.adm, c[T_NOW]
    hsize, hhead, n_dirty, stale = c[HSIZE], c[HHEAD], c[N_DIRTY], c[STALE] != 0
    n_list, n_pinned = c[N_LIST], c[N_PINNED]
    # Room for every touch below; and compacted once its tail passes twice what it would
    # hold after (half of it stale): an item's page is touched when it is written, so the
    # queue's pages then cover about twice its current items, not the whole room.
    grow = na + (z - a)
    if QUEUE and (hsize + grow > h.hk.size or hsize > 2 * (n_list + grow) + 64):
        hsize, hhead = _compact_queue(h, c, hhead, hsize), 0
    c[N_RES] += na
    c[INSERTS] += na
    free = run.pinned_capacity - n_pinned
    for j in range(na):
        e = adm[j]
        cache.resident[e] = True
        if free > 0 and run.want_pin[e]:
            cache.pinned[e] = True
            n_pinned += 1
            free -= 1
        else:
            if not QUEUE:  # (a queue policy's victims come from its queue)
                cache.res_list[n_list] = e
                cache.res_pos[e] = n_list
                if cache.llay.size:  # (its key taken below, by _touched: not yet counted)
                    cache.llay[n_list] = FRESH
            n_list += 1
            n_prot += 1
        if not run.persistent:  # Policy.on_insert
            forget(ps, e)
        on_insert(ps, e, t)
        # every insert joins a queue's tail at once (TOUCH: at its read); a stale heap is
        # rebuilt whole
        hsize, n_dirty = _touched(env, w, e, t, is_write or not TOUCH, hsize, n_dirty, stale)
    c[HSIZE], c[HHEAD], c[N_DIRTY] = hsize, hhead, n_dirty
    c[N_LIST], c[N_PINNED] = n_list, n_pinned
    if ADMIT and na:
        on_admit(ps, adm, na, t)
    return n_prot


@njit(cache=True, inline="always")
def _touch(env, w, a, z):  # type: ignore[no-untyped-def]
    """on_access of the read call's records ``a:z`` (ONCE: once per entry), each key that
    moved queued or marked dirty; the batch time advances."""
    ps, c, stamp, p_ids, p_w = env.ps, w.c, w.cache.stamp, env.plan.ids, env.plan.w
    call, t = c[CALL], c[T_NOW]
    hsize, n_dirty, stale = c[HSIZE], c[N_DIRTY], c[STALE] != 0
    for j in range(a, z):
        e = p_ids[j]
        if ONCE:  # once per entry: numpy's last write wins
            if stamp[e] != call:
                continue
            stamp[e] = -call
        changed = on_access(ps, e, j, p_w[j], t)
        hsize, n_dirty = _touched(env, w, e, t, changed, hsize, n_dirty, stale)
    if ONCE:
        for j in range(a, z):
            if stamp[p_ids[j]] == -call:
                stamp[p_ids[j]] = call
    c[HSIZE], c[N_DIRTY] = hsize, n_dirty
    c[TIME] += 1


@njit(cache=True, inline="always")
def _pop_victims(w, hk, hi, hv, size, k_pass, nv, call, protect):  # type: ignore[no-untyped-def]
    """Victims popped off a heap into ``vic[nv:]`` until there are ``k_pass`` or it is
    empty: stale items dropped, the call's own (``protect``) stashed and pushed back;
    returns (victims, the heap's size)."""
    cache, ver, vic, stash = w.cache, w.heap.ver, w.scratch.vic, w.scratch.stash
    n_st = 0
    while nv < k_pass and size > 0:
        key, e, v, size = _pop(hk, hi, hv, size)
        if not cache.resident[e] or cache.pinned[e] or v != ver[e]:
            continue
        if protect and cache.stamp[e] == call:
            stash[2 * n_st] = e
            stash[2 * n_st + 1] = key  # (unchanged: the item was current)
            n_st += 1
            continue
        vic[nv] = e
        nv += 1
    for j in range(n_st):
        e = stash[2 * j]
        size = _push(hk, hi, hv, size, stash[2 * j + 1], e, ver[e])
    return nv, size


@njit(cache=True, inline="always")
def _layer_victims(env, w, k_pass, n_pass, protect, now):  # type: ignore[no-untyped-def]
    """Managed tiers: up to ``k_pass`` victims layer by layer, each by the policy's order
    (the layers move only with a score or a touch: fixed for the call); into ``vic``, each
    one's pass and layer into ``vgrp``, returning how many.

    The victims are the ``k_pass`` smallest (layer, key, id): the layers below the one that
    holds the ``k_pass``-th leave whole, and that layer's are selected by key.  A STATIC
    policy's layers and keys are read in the list's order (:func:`_keyed_victims`); else
    one pass over the eligible reads each entry's layer (and key) from its state."""
    ps, tab, c, cache, sc = env.ps, env.tab, w.c, w.cache, w.scratch
    cand_id, cand_k, lay_of, lay_n = sc.cand_id, sc.cand_k, sc.lay_of, sc.lay_n
    call = c[CALL]
    if k_pass <= 0:
        return 0
    if STATIC and not SELECT:
        return _keyed_victims(env, w, k_pass, n_pass, protect, now)
    lay_n[:] = 0
    m = 0
    for j in range(c[N_LIST]):
        e = cache.res_list[j]
        if protect and cache.stamp[e] == call:
            continue
        g = _layer_of(env, e)
        cand_id[m] = e
        lay_of[m] = g
        if not SELECT:
            cand_k[m] = key_of(priority(ps, tab, e, now))
        lay_n[g] += 1
        m += 1
    if SELECT:  # (the policy's select sees each layer's candidates in the list's order)
        return _select_layers(env, w, m, k_pass, n_pass, now)
    bd = _layer_bound(lay_n, k_pass)
    t = kmin = kmax = 0  # the boundary layer's candidates (compacted in place), their keys
    for j in range(m):
        t, kmin, kmax = _sort_in(sc, lay_of[j], cand_k[j], cand_id[j], bd, t, kmin, kmax)
    return _layer_taken(env, w, n_pass, bd, 0, t, kmin, kmax)


@njit(cache=True, inline="always")
def _keyed_victims(env, w, k_pass, n_pass, protect, now):  # type: ignore[no-untyped-def]
    """:func:`_layer_victims` of a STATIC policy, from each listed entry's layer and key
    kept in the list's order and counted by layer and key bucket (:func:`_listed_keys`),
    the call's own marked in their layer byte and taken out of the counts: the counts give
    the boundary layer and, in it, the bucket that holds the last victim; one pass over the
    list then takes the layers below whole, the boundary layer's lower buckets whole and
    gathers that bucket's (key, id) for the selection, clearing the marks."""
    c, cache, sc = w.c, w.cache, w.scratch
    lay_n, lhist = sc.lay_n, cache.lhist
    llay, lkey, res_list, n_list = cache.llay, cache.lkey, cache.res_list, c[N_LIST]
    _listed_keys(env, w, now)
    base, sh = c[LBASE], c[LSHIFT]
    if protect:
        if c[OWN_ADM]:
            _mark_own(w, sc.adm, c[OWN_A], c[OWN_Z])
        else:
            _mark_own(w, env.plan.ids, c[OWN_A], c[OWN_Z])
    got = 0  # (the layers above the boundary are not read: counted as none)
    for g in range(T.LAYERS):
        lay_n[g] = lhist[g].sum() if got < k_pass else 0
        got += lay_n[g]
    bd = _layer_bound(lay_n, k_pass)
    gb, below, need, whole, at = bd
    bb = N_BUCKETS  # the boundary layer's bucket that holds its last victim (else all go)
    if gb < T.LAYERS and not whole:
        bb, acc = _boundary_bucket(lhist[gb], need)
        by_id = sh < 0 and 0 < bb < N_BUCKETS - 1  # (ties split by id: as fine as they go)
        crowd = lhist[gb, bb]
        if not by_id and crowd >= CROWDED and crowd > CROWDED_RATIO * (need - acc):
            _rebucket(w, gb, bb)
            base, sh = c[LBASE], c[LSHIFT]
            bb, acc = _boundary_bucket(lhist[gb], need)
    n_low = 0  # the boundary layer's victims below bucket bb, after the ``below``
    t = kmin = kmax = 0  # bucket bb's candidates, their keys' bounds
    for j in range(n_list):
        g = llay[j]
        if g >= OWN:
            llay[j] = g ^ OWN
            _count(lhist, llay, lkey, j, res_list[j], base, sh, 1)
        elif g < gb:
            sc.vic[at[g]] = res_list[j]
            at[g] += 1
        elif g == gb:
            bk = _bucket(lkey[j], res_list[j], base, sh)
            if bk < bb:
                sc.vic[below + n_low] = res_list[j]
                n_low += 1
            elif bk == bb:
                k = lkey[j]
                if t == 0 or k < kmin:
                    kmin = k
                if t == 0 or k > kmax:
                    kmax = k
                sc.cand_k[t] = k
                sc.cand_id[t] = res_list[j]
                t += 1
    return _layer_taken(env, w, n_pass, bd, n_low, t, kmin, kmax)


# The listed keys' buckets, in (key, id) order, set at each full count from a sample of
# the keys: over the span between its 1/256 and 255/256 quantiles, a key's top RADIX_BITS
# above the lower (``sh`` >= 0; keys beyond share the end buckets: a few far keys do not
# crowd the rest into one); or, where those quantiles are one key ``base`` (most keys
# tied, as a prompt's fresh entries are), that key's entries by their ids' top bits
# (``sh`` = −1 − the ids' shift) between the keys below and above it.  Equal widths of a
# float key are equal ratios of the priority, and the EMA's decayed priorities span many
# binades while most entries sit in one: a pass whose boundary bucket holds CROWDED keys
# and CROWDED_RATIO times its victims sets the buckets again over that bucket's keys
# (not a bucket of tied keys split by id: its sample would give the same buckets).
N_BUCKETS = 1 << RADIX_BITS
SAMPLE = 2048
CROWDED = 8192  # (below this, ranking the bucket costs less than a count again)
CROWDED_RATIO = 4


@njit(cache=True, inline="always")
def _boundary_bucket(hist, need):  # type: ignore[no-untyped-def]
    """The bucket of ``hist`` (a layer's counts) that holds its ``need``-th key, and how
    many keys lie below it."""
    acc = 0
    bb = 0
    while acc + hist[bb] < need:
        acc += hist[bb]
        bb += 1
    return bb, acc


@njit(cache=True, inline="always")
def _rebucket(w, gb, bb):  # type: ignore[no-untyped-def]
    """The buckets set again (``LBASE``, ``LSHIFT``) over the keys in bucket ``bb`` of
    layer ``gb``, and the listed keys counted again in them."""
    c, cache = w.c, w.cache
    llay, lkey, res_list, n_list = cache.llay, cache.lkey, cache.res_list, c[N_LIST]
    base, sh = c[LBASE], c[LSHIFT]
    sample = _bucket_sample(llay, lkey, res_list, n_list, gb, bb, base, sh, cache.lhist[gb, bb])
    base, sh = _buckets_of(sample, c[N_DESC])
    c[LBASE], c[LSHIFT] = base, sh
    _count_listed(cache.lhist, llay, lkey, res_list, n_list, base, sh)


@njit(cache=True)
def _bucket_sample(llay, lkey, res_list, n_list, g, b, base, sh, crowd):  # type: ignore[no-untyped-def]
    """A sorted sample (about :data:`SAMPLE`, at a stride in the list's order) of the keys
    of the ``crowd`` listed entries of layer ``g`` in bucket ``b`` (``base``, ``sh``)."""
    stride = max(crowd // SAMPLE, 1)
    sample = np.empty(crowd // stride + 1, np.int64)
    m = 0
    skip = 0  # (members left to pass over before the next one sampled)
    for j in range(n_list):
        if llay[j] == g and _bucket(lkey[j], res_list[j], base, sh) == b:
            if skip == 0:
                sample[m] = lkey[j]
                m += 1
                skip = stride
            skip -= 1
    return np.sort(sample[:m])


@njit(cache=True)
def _count_listed(lhist, llay, lkey, res_list, n_list, base, sh):  # type: ignore[no-untyped-def]
    """``lhist``: the listed entries counted by layer and bucket (``base``, ``sh``); those
    whose layer byte is marked (the call's own, ``OWN``; ``FRESH``) stay out."""
    lhist[:] = 0
    for j in range(n_list):
        _count(lhist, llay, lkey, j, res_list[j], base, sh, 1)


@njit(cache=True, inline="always")
def _bucket(k, e, base, sh):  # type: ignore[no-untyped-def]
    """Entry ``e`` of key ``k``: its bucket (:data:`N_BUCKETS`) by ``base`` and ``sh``."""
    top = np.int64(N_BUCKETS - 1)
    if sh < 0:  # (by id among the ties at base)
        if k != base:
            return np.int64(0) if k < base else top
        return min(np.int64(1) + (np.int64(e) >> (-1 - sh)), top - 1)
    if k <= base:
        return np.int64(0)
    d = (np.uint64(k) - np.uint64(base)) >> np.uint64(sh)
    return np.int64(d) if d < np.uint64(top) else top


@njit(cache=True)
def _buckets(lkey, n_list, n_desc):  # type: ignore[no-untyped-def]
    """The buckets' ``base`` and ``sh`` (:func:`_bucket`) for the listed keys
    ``lkey[:n_list]`` (ids below ``n_desc``), from a sample of them at a stride."""
    stride = max(n_list // SAMPLE, 1)
    return _buckets_of(np.sort(lkey[0:n_list:stride]), n_desc)


@njit(cache=True)
def _buckets_of(sample, n_desc):  # type: ignore[no-untyped-def]
    """:func:`_buckets` from a sorted ``sample`` of the keys."""
    m = sample.size
    if m == 0:
        return 0, 0
    lo, hi = sample[m // 256], sample[m - 1 - m // 256]
    if lo == hi:  # (ties: by id, N_BUCKETS - 2 of them)
        return lo, -1 - max(bit_length(n_desc) - RADIX_BITS + 1, 0)
    return lo, max(bit_length(np.uint64(hi) - np.uint64(lo)) - RADIX_BITS, 0)


@njit(cache=True, inline="always")
def _count(lhist, llay, lkey, p_, e, base, sh, d):  # type: ignore[no-untyped-def]
    """Entry ``e``, listed at place ``p_``, into (``d`` 1) or out of (−1) the listed keys'
    counts, unless its layer byte is marked (``OWN``, ``FRESH``: not counted)."""
    g = llay[p_]
    if g < T.LAYERS:
        lhist[g, _bucket(lkey[p_], e, base, sh)] += d


@njit(cache=True, inline="always")
def _uncount(cache, p_, e, base, sh):  # type: ignore[no-untyped-def]
    """Entry ``e``, listed at place ``p_``, out of the listed keys' counts (if counted)."""
    _count(cache.lhist, cache.llay, cache.lkey, p_, e, base, sh, -1)


@njit(cache=True, inline="always")
def _rekey(env, w, p_, e, now):  # type: ignore[no-untyped-def]
    """Listed entry ``e`` (at place ``p_``) moved its key: its kept layer and key taken
    again (its state is in cache from the event) and counted again."""
    cache, base, sh = w.cache, w.c[LBASE], w.c[LSHIFT]
    _uncount(cache, p_, e, base, sh)
    g = _layer_of(env, e)
    k = key_of(priority(env.ps, env.tab, e, now))
    cache.llay[p_] = g
    cache.lkey[p_] = k
    _count(cache.lhist, cache.llay, cache.lkey, p_, e, base, sh, 1)


@njit(cache=True, inline="always")
def _sort_in(sc, g, k, e, bd, t, kmin, kmax):  # type: ignore[no-untyped-def]
    """Eligible entry ``e`` of layer ``g`` and key ``k`` sorted into a pass (``bd``:
    :func:`_layer_bound`'s): a layer below the boundary ``gb`` (or the boundary, when it
    leaves ``whole``) puts it among the victims (``vic``: at ``at[g]``, or after the
    ``below`` ones), the boundary layer among its ``t`` candidates (``cand_k``/``cand_id``,
    keys in [kmin, kmax]); returns (t, kmin, kmax)."""
    gb, below, _, whole, at = bd
    if g < gb:
        sc.vic[at[g]] = e
        at[g] += 1
    elif g == gb and whole:
        sc.vic[below + t] = e
        t += 1
    elif g == gb:
        if t == 0 or k < kmin:
            kmin = k
        if t == 0 or k > kmax:
            kmax = k
        sc.cand_k[t] = k
        sc.cand_id[t] = e
        t += 1
    return t, kmin, kmax


@njit(cache=True, inline="always")
def _layer_bound(lay_n, k_pass):  # type: ignore[no-untyped-def]
    """The layer ``gb`` that holds the ``k_pass``-th victim of layers of ``lay_n`` eligible
    entries (T.LAYERS: none), how many are below it, how many it gives (``need``), whether
    it leaves whole, and where each whole layer's victims start (layer order)."""
    gb, below = T.LAYERS, 0
    for g in range(T.LAYERS):
        if below + lay_n[g] >= k_pass:
            gb = g
            break
        below += lay_n[g]
    at = np.empty(T.LAYERS, np.int64)
    acc = 0
    for g in range(T.LAYERS):
        at[g] = acc
        acc += lay_n[g] if g < gb else 0
    need = k_pass - below if gb < T.LAYERS else 0
    whole = gb < T.LAYERS and lay_n[gb] == need  # (the last layer leaves whole too)
    return gb, below, need, whole, at


@njit(cache=True, inline="always")
def _layer_taken(env, w, n_pass, bd, n_low, t, kmin, kmax):  # type: ignore[no-untyped-def]
    """The boundary layer's ``need`` victims: ``n_low`` of them already after the whole
    layers' in ``vic``, the rest selected from its ``t`` candidates (keys in [kmin, kmax])
    after those (``bd``: :func:`_layer_bound`'s; ``at``: where each whole layer's end);
    each victim's pass and layer into ``vgrp`` when recording; returns how many."""
    sc, lay_n = w.scratch, w.scratch.lay_n
    gb, below, need, whole, at = bd
    got = 0
    if gb < T.LAYERS:
        got = need if whole else n_low + _select(
            sc.cand_k, sc.cand_id, t, need - n_low, kmin, kmax, sc.vic[below + n_low :]
        )  # fmt: skip
    if env.run.record:
        for g in range(min(gb + 1, T.LAYERS)):
            lo = at[g] - lay_n[g] if g < gb else below
            hi = at[g] if g < gb else below + got
            for j in range(lo, hi):
                sc.vgrp[j] = n_pass * T.LAYERS + g
    return below + got


OWN = np.uint8(0x80)  # a listed layer byte's mark: the call's own entry
FRESH = np.uint8(0x40)  # a listed layer byte not yet taken (just listed): not counted
assert T.LAYERS <= FRESH < OWN  # (every layer fits below the marks)


@njit(cache=True, inline="always")
def _mark_own(w, ids, a, z):  # type: ignore[no-untyped-def]
    """The call's own listed entries among ``ids[a:z]`` (stamped with the call) marked
    ``OWN`` in their listed layer byte and out of the counts, for the pass to skip (and
    count again)."""
    cache, call, base, sh = w.cache, w.c[CALL], w.c[LBASE], w.c[LSHIFT]
    for j in range(a, z):
        e = ids[j]
        if cache.stamp[e] == call and cache.resident[e] and not cache.pinned[e]:
            p_ = cache.res_pos[e]
            if cache.llay[p_] < T.LAYERS:  # (once: ids may repeat)
                _uncount(cache, p_, e, base, sh)
                cache.llay[p_] = cache.llay[p_] | OWN


@njit(cache=True, inline="always")
def _listed_keys(env, w, now):  # type: ignore[no-untyped-def]
    """A STATIC policy's layer and key of every listed entry, in the list's order
    (``Cache.llay``, ``.lkey``), and their counts by layer and key bucket (``lhist``, the
    buckets spanning the keys as they are now), taken again whole when stale (a step
    ended, or before the first use); else each moved key was taken as it moved
    (:func:`_touched`)."""
    ps, tab, c, cache = env.ps, env.tab, w.c, w.cache
    if c[LSTALE]:
        n_list = c[N_LIST]
        for j in range(n_list):
            e = cache.res_list[j]
            cache.llay[j] = _layer_of(env, e)
            cache.lkey[j] = key_of(priority(ps, tab, e, now))
        base, sh = _buckets(cache.lkey, n_list, c[N_DESC])
        c[LBASE], c[LSHIFT] = base, sh
        _count_listed(cache.lhist, cache.llay, cache.lkey, cache.res_list, n_list, base, sh)
        c[LSTALE] = False


@njit(cache=True, inline="always")
def _select_layers(env, w, m, k_pass, n_pass, now):  # type: ignore[no-untyped-def]
    """:func:`_layer_victims` of a policy with its own select: each layer's candidates
    (``cand_id[:m]`` of layer ``lay_of``) gathered in the list's order and handed to it,
    lowest layer first, until ``k_pass`` are chosen."""
    sc = w.scratch
    nv = 0
    for g in range(T.LAYERS):
        if nv >= k_pass:
            break
        mc = 0
        for j in range(m):
            if sc.lay_of[j] == g:
                sc.vic2[mc] = sc.cand_id[j]
                mc += 1
        if mc == 0:
            continue
        got = select(env.ps, env.tab, sc.vic2, mc, k_pass - nv, now, sc.vic[nv:])
        if env.run.record:
            for j in range(nv, nv + got):
                sc.vgrp[j] = n_pass * T.LAYERS + g
        nv += got
    return nv


@njit(cache=True, inline="always")
def _layer_of(env, e):  # type: ignore[no-untyped-def]
    """FirmwareSession._layer of entry ``e``: its eviction layer under managed tiers."""
    return T.layer(env.rules, score(env.ps, e), _value(env, e))


@njit(cache=True, inline="always")
def _heap_victims(env, w, k_pass, n_pass, protect, now, layered):  # type: ignore[no-untyped-def]
    """Up to ``k_pass`` victims, few among many, from a (key, id) heap: under managed tiers
    (``layered``) one heap per eviction layer, lowest first, each victim's pass and layer
    into ``vgrp`` (:func:`_layer_victims`' victims); else the one heap.  A STATIC policy's
    key, and so its layer (a function of its score and idle count), moves only by the
    entry's own events, which mark it dirty (pushed again here), or at a step's end (the
    heaps are rebuilt, as when one is full).  The call's own are stashed and pushed back
    when ``protect``.  Into ``vic``, returning how many."""
    ps, tab, c, h, cache, sc = env.ps, env.tab, w.c, w.heap, w.cache, w.scratch
    if layered:
        lk, li, lv, lsz, n_heaps = h.lk, h.li, h.lv, h.lsz[0 : T.LAYERS], T.LAYERS
    else:  # (the one heap as a layer of its own; its size is the counter itself)
        n_ = h.hk.size
        lk, li, lv = h.hk.reshape(1, n_), h.hi.reshape(1, n_), h.hv.reshape(1, n_)
        lsz, n_heaps = c[HSIZE : HSIZE + 1], 1
    ver = h.ver
    n_dirty, n_list, call = c[N_DIRTY], c[N_LIST], c[CALL]
    full = False
    for g in range(n_heaps):
        full = full or lsz[g] + n_dirty > lk.shape[1]
    if c[STALE] or full:
        lsz[:] = 0
        for j in range(n_list):
            e = cache.res_list[j]
            ver[e] += 1
            g = _layer_of(env, e) if layered else 0
            s_ = lsz[g]
            k_ = key_of(priority(ps, tab, e, now))
            lk[g, s_] = k_
            li[g, s_] = e
            lv[g, s_] = ver[e]
            lsz[g] = s_ + 1
        for g in range(n_heaps):
            _heapify(lk[g], li[g], lv[g], lsz[g])
        for j in range(n_dirty):
            h.dirty[h.dirty_list[j]] = False
        c[STALE] = False
    else:
        for j in range(n_dirty):
            e = h.dirty_list[j]
            h.dirty[e] = False
            if cache.resident[e] and not cache.pinned[e]:
                ver[e] += 1
                g = _layer_of(env, e) if layered else 0
                k_ = key_of(priority(ps, tab, e, now))
                lsz[g] = _push(lk[g], li[g], lv[g], lsz[g], k_, e, ver[e])
    c[N_DIRTY] = 0
    nv = 0
    for g in range(n_heaps):
        if nv >= k_pass:
            break
        first = nv
        nv, lsz[g] = _pop_victims(w, lk[g], li[g], lv[g], lsz[g], k_pass, nv, call, protect)
        if env.run.record:
            for j in range(first, nv):
                sc.vgrp[j] = n_pass * T.LAYERS + g
    return nv


@njit(cache=True, inline="always")
def _scan_victims(env, w, k_pass, protect, now):  # type: ignore[no-untyped-def]
    """Up to ``k_pass`` victims selected over the eligible resident entries (the policy's
    own select, or the key order); into ``vic``, returning how many."""
    ps, tab, c, cache, sc = env.ps, env.tab, w.c, w.cache, w.scratch
    cand_id, cand_k = sc.cand_id, sc.cand_k
    call = c[CALL]
    if SELECT_ALL:  # (the eligible are the unprotected ones of the listed: no list needed)
        m = c[N_LIST] - c[N_PROT] if protect else c[N_LIST]
        return select_all(ps, tab, m, call, protect, k_pass, now, sc.vic)
    mc = 0
    for j in range(c[N_LIST]):
        e = cache.res_list[j]
        if protect and cache.stamp[e] == call:
            continue
        cand_id[mc] = e
        mc += 1
    if SELECT:
        return select(ps, tab, cand_id, mc, k_pass, now, sc.vic)
    kmin = 0
    kmax = 0
    for j in range(mc):
        k = key_of(priority(ps, tab, cand_id[j], now))
        cand_k[j] = k
        if j == 0 or k < kmin:
            kmin = k
        if j == 0 or k > kmax:
            kmax = k
    return _select(cand_k, cand_id, mc, k_pass, kmin, kmax, sc.vic)


# A managed pass that evicts fewer than a FEW-th of the listed entries takes them off the
# layers' heaps (a push and a pop each, at random); more, and it reads every listed entry's
# kept layer and key in order.  At S1's shape a victim off the heaps cost about what 40
# listed entries' reading did (docs/results.md).
FEW = 32


@njit(cache=True, inline="always")
def _victims(env, w, k_pass, n_pass, protect, now):  # type: ignore[no-untyped-def]
    """One pass's victims (at most ``k_pass``) into ``vic``, each one's pass and layer into
    ``vgrp`` when recording: the queue (any number of victims), the heap (few among many),
    the managed layers, or a selection; returns how many."""
    c, h, sc = w.c, w.heap, w.scratch
    if (STATIC and not SELECT and (QUEUE or k_pass * 16 <= c[N_LIST])
            and not (LAYERED and env.rules.managed)):  # fmt: skip
        if QUEUE:  # (every touch is queued already, in key order)
            nv, head = _take(
                (h.hk, h.hi, h.hv, h.ver), c[HHEAD], c[HSIZE], k_pass, w.cache.stamp,
                c[CALL], protect, sc.vic, c[QRUN : QRUN_END + 1],
            )  # fmt: skip
            c[HHEAD] = head
        else:  # (the heap records each victim's pass and layer itself)
            return _heap_victims(env, w, k_pass, n_pass, protect, now, False)
    elif LAYERED and env.rules.managed:
        if STATIC and not SELECT and k_pass * FEW <= c[N_LIST]:
            return _heap_victims(env, w, k_pass, n_pass, protect, now, True)
        return _layer_victims(env, w, k_pass, n_pass, protect, now)
    else:
        nv = _scan_victims(env, w, k_pass, protect, now)
    if env.run.record:
        for j in range(nv):
            sc.vgrp[j] = n_pass * T.LAYERS
    return nv


@njit(cache=True, inline="always")
def _dump(env, w, b, nv, now):  # type: ignore[no-untyped-def]
    """The pass's victims ``vic[:nv]`` into the dump, each with its priority and key (ordered
    afterwards; a policy's own selection orders its victims itself)."""
    c, d, vic = w.c, w.dump, w.scratch.vic
    call, n_dump = c[CALL], c[N_DUMP]
    d.call_batch[call] = b
    for j in range(nv):
        e = vic[j]
        p = priority(env.ps, env.tab, e, now)
        d.d_id[n_dump + j] = e
        d.d_call[n_dump + j] = call
        d.d_grp[n_dump + j] = w.scratch.vgrp[j]
        d.d_pr[n_dump + j] = float(p)
        d.d_key[n_dump + j] = j if SELECT else key_of(p)
    c[N_DUMP] = n_dump + nv


@njit(cache=True, inline="always")
def _nvme_bound(env, w, nv):  # type: ignore[no-untyped-def]
    """Static thresholds with NVMe short of room for the victims ``vic[:nv]`` scored below
    ``nvme_below``: marks in ``to_nvme`` the ones that take its room (the lowest scores
    first, ties lower id: session.place); returns whether it is short."""
    ps, sc, nvme_below = env.ps, w.scratch, env.run.nvme_below
    nvme_room = env.media.nvme_cap - w.tiers.tcount[NVME]
    if not (SCORED and nvme_below > -np.inf and nv > nvme_room):  # (else every one fits)
        return False
    m = 0
    for j in range(nv):
        e = sc.vic[j]
        s_ = score(ps, e)
        if s_ < nvme_below:
            sc.cand_k[m] = float_key(s_)
            sc.cand_id[m] = e
            m += 1
    if m <= nvme_room:
        return False
    got = T.smallest(sc.cand_k, sc.cand_id, m, nvme_room, sc.vic2)
    for j in range(got):
        w.tiers.to_nvme[sc.vic2[j]] = True
    return True


@njit(cache=True, inline="always")
def _leave(env, w, nv, t):  # type: ignore[no-untyped-def]
    """Victims ``vic[:nv]`` leave HBM: placement (as each leaves, before it is forgotten),
    on_evict, tiers.demote, a prefetched one counted wasted.  Static thresholds send a
    victim scored below ``nvme_below`` to NVMe while its room lasts (:func:`_nvme_bound`);
    the rest go to CXL DRAM."""
    ps, run, c, cache, ti, vic = env.ps, env.run, w.c, w.cache, w.tiers, w.scratch.vic
    pos, n_desc, nvme_below = c[POS], c[N_DESC], run.nvme_below
    cxl_fifo = env.media.cxl_cap < run.n and not env.rules.cxl_policy
    limited = _nvme_bound(env, w, nv)
    mk = w.marks
    if mk.mark.size:  # (the simulator's _settle: evicted while still marked prefetched)
        for j in range(nv):
            if mk.mark[vic[j]]:
                mk.mark[vic[j]] = False
                mk.cnt[PF_WASTED] += 1
    # many leave: one pass over the list, not a swap each (a queue policy keeps no list)
    n_list, cxl_size = c[N_LIST], c[CXL_SIZE]
    compact = nv * 4 > n_list and not QUEUE
    keyed = cache.lkey.size > 0  # (the listed keys move with the list)
    counted, base, sh = keyed and not c[LSTALE], c[LBASE], c[LSHIFT]  # (lhist)
    n_nvme = 0
    for j in range(nv):
        e = vic[j]
        dest = CXL  # session.place
        if SCORED and score(ps, e) < nvme_below:
            if not limited:
                dest = NVME
            elif ti.to_nvme[e]:
                dest = NVME
                ti.to_nvme[e] = False
        cache.resident[e] = False
        if QUEUE:
            n_list -= 1
        elif not compact:
            p_ = cache.res_pos[e]
            moved_e = cache.res_list[n_list - 1]
            cache.res_list[p_] = moved_e
            cache.res_pos[moved_e] = p_
            if keyed:
                if counted:
                    _uncount(cache, p_, e, base, sh)
                cache.lkey[p_] = cache.lkey[n_list - 1]
                cache.llay[p_] = cache.llay[n_list - 1]
            cache.res_pos[e] = -1
            n_list -= 1
        on_evict(ps, e, t)
        if not run.persistent:  # Policy.on_evict: the policy forgets the entry
            forget(ps, e)
        if dest == NVME:
            n_nvme += 1
        ti.tier[e] = dest  # (from HBM: a resident entry's tier)
        if ti.since.size:
            ti.since[e] = t
            if cxl_fifo and dest == CXL:
                cxl_size = T.fifo_push(e, t, n_desc, ti.tier, ti.since, ti.cxl_k, ti.cxl_i,
                                       ti.cxl_v, ti.cxl_ver, cxl_size)  # fmt: skip
    moved = w.books.moved
    moved[pos, HBM, CXL] += nv - n_nvme
    moved[pos, HBM, NVME] += n_nvme
    ti.tcount[HBM] -= nv
    ti.tcount[CXL] += nv - n_nvme
    ti.tcount[NVME] += n_nvme
    if compact:
        n_list = _relist(cache, n_list, counted, base, sh)
    c[N_LIST], c[CXL_SIZE] = n_list, cxl_size
    c[N_RES] -= nv
    c[EVICTIONS] += nv


@njit(cache=True, inline="always")
def _relist(cache, n_list, counted, base, sh):  # type: ignore[no-untyped-def]
    """The resident list without the entries that left (one pass; ``counted``: they leave
    the listed keys' buckets too); returns its length."""
    k = 0
    keyed = cache.lkey.size > 0  # (the listed keys move with the list)
    for j in range(n_list):
        e = cache.res_list[j]
        if cache.resident[e]:
            cache.res_list[k] = e
            cache.res_pos[e] = k
            if keyed:
                cache.lkey[k] = cache.lkey[j]
                cache.llay[k] = cache.llay[j]
            k += 1
        else:
            cache.res_pos[e] = -1
            if counted:
                _uncount(cache, j, e, base, sh)
    return k


@njit(cache=True, inline="always")
def _spill(env, w, t):  # type: ignore[no-untyped-def]
    """FirmwareSession._spill: CXL DRAM over its capacity sends the surplus to NVMe, by the
    policy's order (cxl_order = "policy", ranked at the latest eviction's time ``t``) or
    the earliest arrivals first; then an NVMe over its capacity is the replay's error."""
    ps, c, ti, sc = env.ps, w.c, w.tiers, w.scratch
    tier, tcount, moved, pos = ti.tier, ti.tcount, w.books.moved, c[POS]
    spill = tcount[CXL] - env.media.cxl_cap
    if spill > 0 and env.rules.cxl_policy:
        now = now_of(ps, t)
        m = 0
        for e in range(c[N_DESC]):
            if tier[e] == CXL:
                sc.cand_id[m] = e
                sc.cand_k[m] = key_of(priority(ps, env.tab, e, now))
                m += 1
        got = T.smallest(sc.cand_k, sc.cand_id, m, spill, sc.vic)
        T.move(sc.vic, got, CXL, NVME, t, tier, ti.since, tcount, moved, pos)
    elif spill > 0:
        cxl_size = c[CXL_SIZE]
        while spill > 0 and cxl_size > 0:  # by (arrival, id)
            _, e, v, cxl_size = _pop(ti.cxl_k, ti.cxl_i, ti.cxl_v, cxl_size)
            if tier[e] != CXL or v != ti.cxl_ver[e]:
                continue
            tier[e] = NVME
            ti.since[e] = t
            moved[pos, CXL, NVME] += 1
            tcount[CXL] -= 1
            tcount[NVME] += 1
            spill -= 1
        c[CXL_SIZE] = cxl_size
    if tcount[NVME] > env.media.nvme_cap:
        c[ERR] = 1


@njit(cache=True, inline="always")
def _make_room(env, w, b, n_prot):  # type: ignore[no-untyped-def]
    """PolicyCache._make_room after a call of batch ``b`` (``n_prot``: its own entries,
    resident and unpinned): passes of victims (exact: the only one; batched:
    eviction_batch each), dumped, leaving; CXL DRAM's overflow spilled."""
    run, c = env.run, w.c
    over = c[N_RES] - run.capacity
    if over <= 0:
        return
    # else the call's entries compete too (the bypassing optimum: always)
    protect = c[N_LIST] - n_prot >= over and not run.bypass
    c[N_PROT] = n_prot
    batched, t = env.rules.batched, c[T_NOW]
    left = over
    n_pass = 0
    n_out = 0
    while left > 0:
        k_pass = run.eviction_batch if batched else over
        now = now_of(env.ps, t)  # what priority reads as the pass's time
        nv = _victims(env, w, k_pass, n_pass, protect, now)
        if nv == 0:
            break
        if batched:
            c[PASSES] += 1
        else:
            c[PASSES] += (nv + run.eviction_batch - 1) // run.eviction_batch
        if run.record:
            _dump(env, w, b, nv, now)
        _leave(env, w, nv, t)
        left -= nv
        n_out += nv
        n_pass += 1
        if not batched:
            break
    if n_out and w.tiers.tcount[CXL] > env.media.cxl_cap:  # (CXL DRAM over its capacity)
        _spill(env, w, t)


@njit(cache=True, inline="always")
def _call(env, w, b, a, z, step, tok, phase):  # type: ignore[no-untyped-def]
    """One of a batch's up to three calls (``phase``: 0 the write, 1 the reads, 2 their
    prefetch): the call's own work, its admissions, on_access (reads), room made."""
    if phase == 0:
        na = _write(env, w, b, a, z, step)
        n_prot = 0
    elif phase == 1:
        na, n_prot = _read(env, w, b, a, z, step, tok)
    else:
        na = _prefetch(env, w, b, a, z)
        n_prot = 0
    if na < 0:
        return
    n_prot = _admit(env, w, a, z, na, n_prot, phase != 1)
    c = w.c
    if phase == 1:
        _touch(env, w, a, z)
        c[OWN_A], c[OWN_Z], c[OWN_ADM] = a, z, 0
    else:  # (a write's or a prefetch's own are its admissions)
        c[OWN_A], c[OWN_Z], c[OWN_ADM] = 0, na, 1
    # (a heap: cheaper to rebuild than to push them all; a queue appends them)
    if STATIC and not QUEUE and c[N_DIRTY] * 2 > c[N_LIST]:
        c[STALE] = True
    _make_room(env, w, b, n_prot)


@njit(cache=True, inline="always")
def _batch(env, w, b, step):  # type: ignore[no-untyped-def]
    """Batch ``b`` of step ``step``: at the request granularity every read its own batch
    (runs of hits at once), each up to three calls."""
    plan, run, c, tab = env.plan, env.run, w.c, env.tab
    a0, z0 = plan.off[b], plan.off[b + 1]
    n_sub = z0 - a0 if run.per_request and plan.read[b] else 1
    nxt_sb = 0
    while nxt_sb < n_sub:
        sb = nxt_sb
        nxt_sb += 1
        if n_sub == 1:
            a, z = a0, z0
        else:
            a, z = a0 + sb, a0 + sb + 1
        tok = plan.tokens[b] if sb == 0 else 0  # (the step's tokens ride on its first)
        if sb == 0 and BY_AGE:  # FirmwareSession.lengths before the batch (never shrink)
            for j in range(plan.loff[b], plan.loff[b + 1]):
                ctx = plan.l_ctx[j]
                tab.ctx_tokens[ctx] = max(tab.ctx_tokens[ctx], plan.l_tok[j])
        if (n_sub > 1 and c[N_RES] <= run.capacity and w.cache.resident[plan.ids[a]]
                and not env.pf.on):  # fmt: skip
            nxt_sb = sb + _hits(env, w, a, z0, step, tok)
            continue
        # Up to three calls per batch: a write (the batch's own, or a trace's entries
        # written just before their first read), the reads, then their prefetch.
        for phase in range(3):
            _call(env, w, b, a, z, step, tok, phase)
            if c[ERR]:
                return


@njit(cache=True)
def _bg_victims(env, w, room):  # type: ignore[no-untyped-def]
    """Weighted managed tiers at a step boundary: the resident, unpinned entries placement
    wants in CXL DRAM (P < low), lowest P first (ties lower id), at most background_moves
    and at most ``room`` (the free entries of CXL DRAM and NVMe); into ``vic`` unordered,
    returning how many (the dump orders them by P's key)."""
    env = borrowed(env)
    w = borrowed(w)
    sc, rules = w.scratch, env.rules
    m = 0
    for j in range(w.c[N_LIST]):
        e = w.cache.res_list[j]
        v = _value(env, e)
        if T.wants_cxl(rules, v):
            sc.cand_id[m] = e
            sc.cand_k[m] = float_key(v)
            m += 1
    return T.smallest(sc.cand_k, sc.cand_id, m, min(rules.moves, room), sc.vic)


@njit(cache=True, inline="always")
def _value(env, e):  # type: ignore[no-untyped-def]
    """FirmwareSession.placement_value of entry ``e``."""
    ps, tab = env.ps, env.tab
    return T.value(env.rules, score(ps, e), idle_steps(ps, e), tab.e_block[e] * tab.bt)


@njit(cache=True, inline="always")
def _bg_weighted(env, w, b, t):  # type: ignore[no-untyped-def]
    """Weighted managed tiers at a step boundary: the HBM entries placement wants in CXL
    DRAM leave (a call of their own, dumped by P), CXL DRAM's overflow spilled."""
    c, ti, media = w.c, w.tiers, env.media
    room = (media.cxl_cap - ti.tcount[CXL]) + (media.nvme_cap - ti.tcount[NVME])
    nv = _bg_victims(env, w, room)
    if nv == 0:
        return
    c[CALL] += 1
    if env.run.record:
        d, call, n_dump = w.dump, c[CALL], c[N_DUMP]
        d.call_batch[call] = b
        now = now_of(env.ps, t)
        for j in range(nv):
            e = w.scratch.vic[j]
            d.d_id[n_dump + j] = e
            d.d_call[n_dump + j] = call
            d.d_grp[n_dump + j] = 0
            d.d_pr[n_dump + j] = float(priority(env.ps, env.tab, e, now))
            d.d_key[n_dump + j] = float_key(_value(env, e))
        c[N_DUMP] = n_dump + nv
    _leave(env, w, nv, t)
    _spill(env, w, t)


@njit(cache=True, inline="always")
def _bg_lower(env, w, t):  # type: ignore[no-untyped-def]
    """Threshold managed tiers at a step boundary (tiering.background_plan): CXL DRAM
    entries scored below evict_threshold sink into NVMe's free room (lowest first), then
    NVMe entries at or above it rise into CXL DRAM's free room (highest first), at most
    background_moves in all; NVMe overflowing is the replay's error."""
    ps, rules, c, ti, sc, media = env.ps, env.rules, w.c, w.tiers, w.scratch, env.media
    keys, ids, down, up, n, pos = sc.cand_k, sc.cand_id, sc.vic, sc.vic2, c[N_DESC], c[POS]
    tier, since, tcount, moved = ti.tier, ti.since, ti.tcount, w.books.moved
    k2, i2 = sc.stash[:n], sc.stash[n : 2 * n]  # the NVMe candidates' keys and ids
    nvme_room = max(media.nvme_cap - tcount[NVME], 0)
    k_down = min(rules.moves, nvme_room)
    m = m2 = n_cxl = 0
    # one pass: both sets as they stand before any move, each kept to the most that can
    # move (the ups: at most background_moves)
    for e in range(n):
        tr = tier[e]
        if tr == CXL:
            n_cxl += 1
            v = score(ps, e)
            if v < rules.evict:
                m = T.keep(keys, ids, m, k_down, float_key(v), e)
        elif tr == NVME:
            v = score(ps, e)
            if v >= rules.evict:
                m2 = T.keep(k2, i2, m2, rules.moves, float_key(-v), e)
    cxl_room = max(media.cxl_cap - n_cxl, 0)
    nd = T.smallest(keys, ids, m, k_down, down)
    nu = T.smallest(k2, i2, m2, min(rules.moves - nd, cxl_room + nd), up)
    T.move(down, nd, CXL, NVME, t, tier, since, tcount, moved, pos)
    if tcount[NVME] > media.nvme_cap:
        c[ERR] = 1
        return
    T.move(up, nu, NVME, CXL, t, tier, since, tcount, moved, pos)
    if media.cxl_cap < env.run.n and not rules.cxl_policy:  # (the arrivals heap: fifo)
        cxl_size = c[CXL_SIZE]
        for j in range(nu):
            cxl_size = T.fifo_push(up[j], t, n, tier, since, ti.cxl_k, ti.cxl_i, ti.cxl_v,
                                   ti.cxl_ver, cxl_size)  # fmt: skip
        c[CXL_SIZE] = cxl_size


@njit(cache=True)
def _boundary(env, w, b, step):  # type: ignore[no-untyped-def]
    """The open step ends (before batch ``b``, of step ``step``, or after the last): the
    policy's end_step over every described entry, then FirmwareSession._background at the
    closing step's last read time (managed tiers)."""
    env = borrowed(env)
    w = borrowed(w)
    c = w.c
    if STEPS:
        end_step(env.ps, c[N_DESC])
        c[STALE] = c[LSTALE] = True
    if not (LAYERED and env.rules.managed and env.rules.moves > 0):
        return
    tlog, moved, pos = env.tlog, w.books.moved, c[POS]
    log_outside(tlog, moved)  # (the open record's moves end here)
    log_boundary_begins(tlog, moved, pos)
    t = max(c[TIME] - 1, 0)
    if env.rules.weighted:  # HBM entries placement wants in CXL DRAM leave
        _bg_weighted(env, w, b, t)
    else:  # CXL DRAM and NVMe exchange entries
        _bg_lower(env, w, t)
    log_inside(tlog, moved)
    log_boundary(tlog, moved, pos, step)  # (a record of its own, if it moved any)


@njit(cache=True)
def _batches(env, w):  # type: ignore[no-untyped-def]
    """Every batch of the plan in order, each step's books position found as it starts,
    and each step's boundary as the next begins (and after the last)."""
    env = borrowed(env)
    w = borrowed(w)
    plan, run, c = env.plan, env.run, w.c
    nb = plan.step.size
    pos_step = -1
    step = 0
    open_step = 0
    have_open = False
    for bb in range(nb + 1):  # every batch, then the last step's boundary
        b = min(bb, nb - 1)
        if bb < nb:
            if run.per_request and plan.read[b] and plan.off[b + 1] == plan.off[b]:
                continue  # a layer without reads is no request at all
            step = plan.step[b]
            if b == 0 or step != pos_step:  # _StepBooks.position: the first read step at
                new_pos = min(np.searchsorted(run.read_steps, step), run.npos - 1)  # or after
                if pos_step >= 0 and new_pos != c[POS] and new_pos == run.warm:
                    w.marks.cnt[PF_USEFUL_WARM] = w.marks.cnt[PF_USEFUL]  # (the warm-up's)
                c[POS] = new_pos
                pos_step = step
        if have_open and (bb == nb or step != open_step):
            _boundary(env, w, b, step)
            if c[ERR]:
                return
        if bb == nb:
            return
        open_step = step
        have_open = True
        _batch(env, w, b, step)
        if c[ERR]:
            return


@njit(cache=True)
def _work(plan, run, media, tlog, pf, rules):  # type: ignore[no-untyped-def]
    """The replay's working state (work.Work), every array at its largest size up front."""
    n, npos, p_ids = run.n, run.npos, plan.ids
    books = Books(np.zeros(npos, np.int64), np.zeros(npos, np.int64),
                  np.zeros((npos, 4), np.int64), np.zeros(npos, np.float64),
                  np.zeros(npos, np.int64), np.zeros((npos, 5, 4), np.int64))  # fmt: skip
    # (pinned and stamp: the run's, shared with the policy's state for its select_all)
    # (a queue policy keeps no resident list: its queue is the list; a managed boundary,
    # which walks the list, needs a scored policy, never a queue one)
    nl = n if not QUEUE or LAYERED else 0
    idt = run.ids.dtype  # (entry ids and versions: hooks.id_dtype)
    # (a managed STATIC policy keeps its layers' heaps and its listed keys and layers)
    layered = LAYERED and STATIC and not SELECT and rules.managed
    nk = nl if layered else 0
    cache = Cache(np.zeros(n, np.bool_), run.pinned, np.zeros(n, np.bool_),
                  np.empty(nl, idt), np.full(nl, -1, idt), run.stamp,
                  np.empty(nk, np.int64), np.empty(nk, np.uint8),
                  np.zeros((T.LAYERS, N_BUCKETS if layered else 0), np.int64))  # fmt: skip
    # A heap of the resident unpinned entries by (key, id) serves small evictions of a STATIC
    # policy: keys change only by an entry's own events (marked dirty, pushed again before
    # the next pop) and at step ends (the heap is rebuilt).  Large evictions scan.  A QUEUE
    # policy's items join the queue at every touch instead (kernel._enqueue), with room kept
    # by compaction to the current items.  Under managed tiers a STATIC policy's small
    # evictions take each layer's heap in turn instead (a call's dirty ones pushed again).
    # Sized by HBM, not by the entries or the reads: a call starts with at most `capacity`
    # listed entries (make_room leaves no more, or none listed), admits at most a batch or
    # a prefetch and touches at most a batch; a full heap is rebuilt (it holds the listed
    # entries: at most capacity and a batch or a prefetch) and a full queue compacted (one
    # current item per listed entry, then the call's admissions and touches).  The room
    # beyond that, at least capacity + 64, amortises both; the pages are touched as items
    # are written, so a prompt written at one batch costs room for it, not twice.
    big = 0
    for b in range(plan.off.size - 1):
        big = max(big, plan.off[b + 1] - plan.off[b])
    room = 2 * (run.capacity + pf.limit + big) + 64
    lcap = min(n + 64, room) if layered else 0
    hcap = min(2 * n + 64 + p_ids.size, room) if STATIC and not layered else 0
    heap = Heap(np.empty(hcap, np.int64), np.empty(hcap, idt), np.empty(hcap, idt),
                np.zeros(n, idt), np.zeros(n, np.bool_), np.empty(n, idt),
                np.empty((T.LAYERS, lcap), np.int64), np.empty((T.LAYERS, lcap), idt),
                np.empty((T.LAYERS, lcap), idt), np.zeros(T.LAYERS, np.int64))  # fmt: skip
    spills = media.cxl_cap < n  # else CXL DRAM has room for every entry
    ccap = 2 * n + 64 if spills else 0
    tiers = Tiers(np.zeros(n, np.uint8), np.zeros(4, np.int64),
                  np.zeros(n if spills else 0, np.int64), np.empty(ccap, np.int64),
                  np.empty(ccap, idt), np.empty(ccap, idt),
                  np.zeros(n if spills else 0, idt),
                  np.zeros(n if run.nvme_below > -np.inf else 0, np.bool_))  # fmt: skip
    scratch = Scratch(np.empty(n, idt), np.empty(n, idt), np.empty(n, np.int64),
                      np.empty(n, idt), np.empty(n, idt), np.empty(2 * n, np.int64),
                      np.empty(n if run.record else 0, np.int64),
                      np.empty(n if LAYERED else 0, np.uint8),
                      np.zeros(T.LAYERS, np.int64))  # fmt: skip
    # dump: victims <= admissions (writes, misses, prefetches: at most limit per read call)
    n_calls = plan.step.size + (p_ids.size if run.per_request else 0)
    d_cap = p_ids.size + n + (min(pf.limit, n) * n_calls if pf.on else 0) if run.record else 0
    # (three calls per batch, one per step boundary)
    nc = 4 * (plan.step.size + p_ids.size) + 4 if run.record else 0
    dump = Dump(np.empty(d_cap, np.int64), np.empty(d_cap, np.float64),
                np.empty(d_cap, np.int64), np.empty(d_cap, np.int64),
                np.empty(d_cap, np.int64), np.zeros(nc, np.int64))  # fmt: skip
    pf_log = pf.on and tlog.rows.shape[0] > 0  # (a prefetch's record: read by the log)
    marks = Marks(np.zeros(n if pf.on else 0, np.bool_), np.zeros(4, np.int64),
                  np.full(n if pf_log else 0, -1, np.int64),
                  np.empty(n if pf_log else 0, np.int64))  # fmt: skip
    c = np.zeros(N_COUNTERS, np.int64)
    c[STALE] = c[LSTALE] = True  # the heap and the listed keys must be built before use
    return Work(c, books, cache, heap, tiers, scratch, dump, marks)


@njit(cache=True)
def replay(plan, run, media, tab, ps, tlog, rules, pf):  # type: ignore[no-untyped-def]
    """Replay ``plan`` (a :class:`~kvcxl.emu.sim.fast.hooks.Plan`) with the policy state
    ``ps`` under the tier rules ``rules`` (:class:`~kvcxl.emu.sim.fast.tiers.Rules`),
    prefetching after each read batch as ``pf`` says
    (:class:`~kvcxl.emu.sim.fast.prefetch.Prefetch`), emitting the transfer log into
    ``tlog`` (:mod:`kvcxl.emu.sim.fast.timeline`); returns (books, tiers, stats, victim
    dump, error, prefetch counts)."""
    w = _work(plan, run, media, tlog, pf, rules)  # (owns the arrays the phases borrow)
    _batches(Env(plan, run, media, tab, ps, tlog, rules, pf), w)
    log_close(tlog, w.books.moved)
    c, bk, d, ti = w.c, w.books, w.dump, w.tiers
    stats = np.array([c[HITS], c[MISSES], c[INSERTS], c[EVICTIONS], c[PASSES], c[N_PINNED],
                      c[N_RES], c[N_DESC]])  # fmt: skip
    k = c[N_DUMP]
    return (
        bk.reads, bk.hits, bk.miss, bk.stall, bk.tokens, bk.moved, ti.tier, ti.tcount, stats,
        d.d_id[:k], d.d_pr[:k], d.d_key[:k], d.d_call[:k], d.d_grp[:k], d.call_batch,
        c[ERR], w.marks.cnt,
    )  # fmt: skip
