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
    _compact,
    _enqueue,
    _heapify,
    _pop,
    _push,
    _select,
    _take,
    borrowed,
    float_key,
    key_of,
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

# The policy's traits and hooks, frozen as constants when numba compiles the loop.
STATIC = hooks.trait(P, "STATIC")
QUEUE = hooks.trait(P, "QUEUE")
TOUCH = hooks.trait(P, "TOUCH")
BY_AGE = hooks.trait(P, "BY_AGE")
ONCE = hooks.trait(P, "ONCE")
STEPS = hooks.has(P, "end_step")
SCORED = hooks.has(P, "score")
SELECT = hooks.has(P, "select")
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
on_admit = hooks.hook(P, "on_admit")  # (once per call that admits)


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


@njit(cache=True)
def _leave(ps, vic, nv, t, pos, persistent, nvme_below, cxl_fifo, n_desc, resident, res_list,
           res_pos, n_list, tier, tcount, moved, since, cxl_k, cxl_i, cxl_v, cxl_ver,
           cxl_size, pf_mark, pf_cnt, nvme_room, to_nvme, keys, ids,
           out):  # type: ignore[no-untyped-def]  # fmt: skip
    """Victims ``vic[:nv]`` leave HBM: placement (as each leaves, before it is forgotten),
    on_evict, tiers.demote, a prefetched one counted wasted; returns (resident list length,
    CXL arrivals heap size).  Static thresholds send a victim scored below ``nvme_below``
    to NVMe while its ``nvme_room`` lasts: the lowest scores first, ties lower id
    (session.place); the rest go to CXL DRAM."""
    ps = borrowed(ps)
    limited = False
    if SCORED and nvme_below > -np.inf and nv > nvme_room:  # (else every one fits)
        m = 0
        for j in range(nv):
            e = vic[j]
            s_ = score(ps, e)
            if s_ < nvme_below:
                keys[m] = float_key(s_)
                ids[m] = e
                m += 1
        if m > nvme_room:
            limited = True
            got = T.smallest(keys, ids, m, nvme_room, out)
            for j in range(got):
                to_nvme[out[j]] = True
    if pf_mark.size:  # (the simulator's _settle: evicted while still marked prefetched)
        for j in range(nv):
            if pf_mark[vic[j]]:
                pf_mark[vic[j]] = False
                pf_cnt[PF_WASTED] += 1
    # many leave: one pass over the list, not a swap each (a queue policy keeps no list)
    compact = nv * 4 > n_list and not QUEUE
    n_nvme = 0
    for j in range(nv):
        e = vic[j]
        dest = CXL  # session.place
        if SCORED and score(ps, e) < nvme_below:
            if not limited:
                dest = NVME
            elif to_nvme[e]:
                dest = NVME
                to_nvme[e] = False
        resident[e] = False
        if QUEUE:
            n_list -= 1
        elif not compact:
            p_ = res_pos[e]
            moved_e = res_list[n_list - 1]
            res_list[p_] = moved_e
            res_pos[moved_e] = p_
            res_pos[e] = -1
            n_list -= 1
        on_evict(ps, e, t)
        if not persistent:  # Policy.on_evict: the policy forgets the entry
            forget(ps, e)
        if dest == NVME:
            n_nvme += 1
        tier[e] = dest  # (from HBM: a resident entry's tier)
        if since.size:
            since[e] = t
            if cxl_fifo and dest == CXL:
                cxl_size = T.fifo_push(e, t, n_desc, tier, since, cxl_k, cxl_i, cxl_v, cxl_ver,
                                       cxl_size)  # fmt: skip
    moved[pos, HBM, CXL] += nv - n_nvme
    moved[pos, HBM, NVME] += n_nvme
    tcount[HBM] -= nv
    tcount[CXL] += nv - n_nvme
    tcount[NVME] += n_nvme
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
    return n_list, cxl_size


@njit(cache=True)
def _spill(ps, tab, rules, t, pos, n_desc, cxl_cap, tier, since, tcount, moved, cxl_k, cxl_i,
           cxl_v, cxl_ver, cxl_size, keys, ids, out):  # type: ignore[no-untyped-def]  # fmt: skip
    """FirmwareSession._spill: CXL DRAM over its capacity sends the surplus to NVMe, by the
    policy's order (cxl_order = "policy", ranked at the latest eviction's time ``t``) or
    the earliest arrivals first; returns the arrivals heap's size."""
    ps = borrowed(ps)
    tab = borrowed(tab)
    spill = tcount[CXL] - cxl_cap
    if spill <= 0:
        return cxl_size
    if rules.cxl_policy:
        now = now_of(ps, t)
        m = 0
        for e in range(n_desc):
            if tier[e] == CXL:
                ids[m] = e
                keys[m] = key_of(priority(ps, tab, e, now))
                m += 1
        got = T.smallest(keys, ids, m, spill, out)
        T.move(out, got, CXL, NVME, t, tier, since, tcount, moved, pos)
        return cxl_size
    while spill > 0 and cxl_size > 0:  # by (arrival, id)
        _, e, v, cxl_size = _pop(cxl_k, cxl_i, cxl_v, cxl_size)
        if tier[e] != CXL or v != cxl_ver[e]:
            continue
        tier[e] = NVME
        since[e] = t
        moved[pos, CXL, NVME] += 1
        tcount[CXL] -= 1
        tcount[NVME] += 1
        spill -= 1
    return cxl_size


@njit(cache=True)
def _value(ps, tab, rules, e):  # type: ignore[no-untyped-def]
    """FirmwareSession.placement_value of entry ``e``."""
    return T.value(rules, score(ps, e), idle_steps(ps, e), tab.e_block[e] * tab.bt)


@njit(cache=True)
def _bg_victims(ps, tab, rules, res_list, n_list, room, keys, ids, out):  # type: ignore[no-untyped-def]  # fmt: skip
    """Weighted managed tiers at a step boundary: the resident, unpinned entries placement
    wants in CXL DRAM (P < low), lowest P first (ties lower id), at most background_moves
    and at most ``room`` (the free entries of CXL DRAM and NVMe); into ``out`` unordered,
    returning how many (the dump orders them by P's key)."""
    ps = borrowed(ps)
    tab = borrowed(tab)
    m = 0
    for j in range(n_list):
        e = res_list[j]
        v = _value(ps, tab, rules, e)
        if T.wants_cxl(rules, v):
            ids[m] = e
            keys[m] = float_key(v)
            m += 1
    return T.smallest(keys, ids, m, min(rules.moves, room), out)


@njit(cache=True)
def _bg_lower(ps, rules, t, pos, n_desc, cxl_cap, nvme_cap, tier, since, tcount, moved,
              cxl_fifo, cxl_k, cxl_i, cxl_v, cxl_ver, cxl_size, keys, ids, down, up,
              scratch):  # type: ignore[no-untyped-def]  # fmt: skip
    """Threshold managed tiers at a step boundary (tiering.background_plan): CXL DRAM
    entries scored below evict_threshold sink into NVMe's free room (lowest first), then
    NVMe entries at or above it rise into CXL DRAM's free room (highest first), at most
    background_moves in all; returns (arrivals heap size, NVMe overflowed)."""
    ps = borrowed(ps)
    n = n_desc
    k2, i2 = scratch[:n], scratch[n : 2 * n]  # the NVMe candidates' keys and ids
    m = 0
    m2 = 0
    n_cxl = 0
    for e in range(n_desc):  # one pass: both sets as they stand before any move
        tr = tier[e]
        if tr == CXL:
            n_cxl += 1
            v = score(ps, e)
            if v < rules.evict:
                ids[m] = e
                keys[m] = float_key(v)
                m += 1
        elif tr == NVME:
            v = score(ps, e)
            if v >= rules.evict:
                i2[m2] = e
                k2[m2] = float_key(-v)
                m2 += 1
    nd = T.smallest(keys, ids, m, min(rules.moves, max(nvme_cap - tcount[NVME], 0)), down)
    nu = T.smallest(k2, i2, m2, min(rules.moves - nd, max(cxl_cap - n_cxl, 0) + nd), up)
    T.move(down, nd, CXL, NVME, t, tier, since, tcount, moved, pos)
    if tcount[NVME] > nvme_cap:
        return cxl_size, True
    T.move(up, nu, NVME, CXL, t, tier, since, tcount, moved, pos)
    if cxl_fifo:
        for j in range(nu):
            cxl_size = T.fifo_push(up[j], t, n_desc, tier, since, cxl_k, cxl_i, cxl_v, cxl_ver,
                                   cxl_size)  # fmt: skip
    return cxl_size, False


@njit(cache=True)
def replay(plan, run, media, tab, ps, tlog, rules, pf):  # type: ignore[no-untyped-def]
    """Replay ``plan`` (a :class:`~kvcxl.emu.sim.fast.hooks.Plan`) with the policy state
    ``ps`` under the tier rules ``rules`` (:class:`~kvcxl.emu.sim.fast.tiers.Rules`),
    prefetching after each read batch as ``pf`` says
    (:class:`~kvcxl.emu.sim.fast.prefetch.Prefetch`), emitting the transfer log into
    ``tlog`` (:mod:`kvcxl.emu.sim.fast.timeline`); returns (books, tiers, stats, victim
    dump, error, prefetch counts)."""
    b_read, b_step, b_off, b_tokens = plan.read, plan.step, plan.off, plan.tokens
    p_ids, p_w = plan.ids, plan.w
    b_loff, l_ctx, l_tok = plan.loff, plan.l_ctx, plan.l_tok
    n, read_steps, want_pin, npos = run.n, run.read_steps, run.want_pin, run.npos
    capacity, pinned_capacity = run.capacity, run.pinned_capacity
    persistent, eviction_batch, nvme_below = run.persistent, run.eviction_batch, run.nvme_below
    record, per_request, offline, bypass = run.record, run.per_request, run.offline, run.bypass
    lazy = run.lazy
    batched, managed = rules.batched, rules.managed
    cxl_cap, nvme_cap, eb = media.cxl_cap, media.nvme_cap, media.entry_bytes
    cxl_lat, cxl_gbps, nvme_lat, nvme_gbps = (
        media.cxl_lat, media.cxl_gbps, media.nvme_lat, media.nvme_gbps
    )  # fmt: skip
    ctx_tokens, e_ctx, e_block, bt = tab.ctx_tokens, tab.e_ctx, tab.e_block, tab.bt
    ps = borrowed(ps)  # (the caller's ps and tab keep their arrays alive)
    tab = borrowed(tab)
    tlog = borrowed(tlog)
    pf = borrowed(pf)
    rules = borrowed(rules)
    pf_on = pf.on
    warm = run.warm
    # prefetch: which entries are marked prefetched, and the counts (prefetch.TOTAL ...)
    pf_mark = np.zeros(n if pf_on else 0, np.bool_)
    pf_cnt = np.zeros(4, np.int64)
    pf_log = pf_on and tlog.rows.shape[0] > 0
    pf_rec = np.full(n if pf_log else 0, -1, np.int64)  # the read record that prefetched each
    pf_recs = np.empty(n if pf_log else 0, np.int64)  # a read's useful ones' pf_rec
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
    # A heap of the resident unpinned entries by (key, id) serves small evictions of a STATIC
    # policy: keys change only by an entry's own events (marked dirty, pushed again before
    # the next pop) and at step ends (the heap is rebuilt).  Large evictions scan.  A QUEUE
    # policy's items join the queue at every touch instead (kernel._enqueue), with room kept
    # by compaction: at most n current items, then at most n admissions and a batch's reads.
    hcap = 2 * n + 64 + p_ids.size if STATIC else 0
    hk = np.empty(hcap, np.int64)
    hi = np.empty(hcap, np.int64)
    hv = np.empty(hcap, np.int64)
    hsize = 0
    hhead = 0  # QUEUE: the queue's head (items before it are consumed)
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
    cxl_fifo = spills and not rules.cxl_policy  # the arrivals heap serves fifo spills only
    # static thresholds: the victims that take NVMe's last free room (session.place)
    to_nvme = np.zeros(n if nvme_below > -np.inf else 0, np.bool_)
    # managed: a pass's eligible entries, layer by layer (row g: layer g's, lay_n[g] of them)
    lay_ids = np.empty((T.LAYERS, n if LAYERED else 0), np.int64)
    lay_n = np.zeros(T.LAYERS, np.int64)
    # scratch, every array at its largest size up front: an array variable reassigned in
    # the loop costs reference counting on every iteration (20x on one-read batches)
    stamp = np.zeros(n, np.int64)  # the call that last marked an entry (a batch member)
    adm = np.empty(n, np.int64)
    cand_id = np.empty(n, np.int64)
    cand_k = np.empty(n, np.int64)
    vic = np.empty(n, np.int64)
    stash = np.empty(2 * n, np.int64)
    vic2 = np.empty(n, np.int64)
    vgrp = np.empty(n if record else 0, np.int64)  # each victim's pass and layer (dump order)
    # dump: victims <= admissions (writes, misses, prefetches: at most limit per read call)
    n_calls = b_step.size + (p_ids.size if per_request else 0)
    d_cap = p_ids.size + n + (min(pf.limit, n) * n_calls if pf_on else 0) if record else 0
    d_id = np.empty(d_cap, np.int64)
    d_pr = np.empty(d_cap, np.float64)
    d_key = np.empty(d_cap, np.int64)
    d_call = np.empty(d_cap, np.int64)  # the call of each victim
    d_grp = np.empty(d_cap, np.int64)  # its pass and layer
    # (three calls per batch, one per step boundary)
    call_batch = np.zeros(4 * (b_step.size + p_ids.size) + 4 if record else 0, np.int64)
    n_dump = 0
    err = 0
    time = 0
    call = 0
    open_step = 0
    pos = 0
    have_open = False

    nb = b_step.size
    pos_step = -1
    step = 0
    for bb in range(nb + 1):  # every batch, then the last step's boundary
        b = min(bb, nb - 1)
        if bb < nb:
            if per_request and b_read[b] and b_off[b + 1] == b_off[b]:
                continue  # a layer without reads is no request at all
            step = b_step[b]
            if b == 0 or step != pos_step:  # _StepBooks.position: the first read step at or
                new_pos = min(np.searchsorted(read_steps, step), npos - 1)  # after this one
                if pos_step >= 0 and new_pos != pos and new_pos == warm:
                    pf_cnt[PF_USEFUL_WARM] = pf_cnt[PF_USEFUL]  # (the warm-up's useful ones)
                pos = new_pos
                pos_step = step
        boundary = have_open and (bb == nb or step != open_step)
        if STEPS and boundary:
            end_step(ps, n_desc)  # of the open step, over every described entry
            stale = True
        if LAYERED and managed and boundary and rules.moves > 0:
            # --- FirmwareSession._background, at the closing step's last read time ---
            log_outside(tlog, moved)  # (the open record's moves end here)
            log_boundary_begins(tlog, moved, pos)
            t = max(time - 1, 0)
            if rules.weighted:  # HBM entries placement wants in CXL DRAM leave
                room = (cxl_cap - tcount[CXL]) + (nvme_cap - tcount[NVME])
                nv = _bg_victims(ps, tab, rules, res_list, n_list, room, cand_k, cand_id, vic)
                if nv:
                    call += 1
                    if record:
                        call_batch[call] = b
                        now = now_of(ps, t)
                        for j in range(nv):
                            e = vic[j]
                            d_id[n_dump + j] = e
                            d_call[n_dump + j] = call
                            d_grp[n_dump + j] = 0
                            d_pr[n_dump + j] = float(priority(ps, tab, e, now))
                            d_key[n_dump + j] = float_key(_value(ps, tab, rules, e))
                        n_dump += nv
                    n_list, cxl_size = _leave(
                        ps, vic, nv, t, pos, persistent, nvme_below, cxl_fifo, n_desc,
                        resident, res_list, res_pos, n_list, tier, tcount, moved, since,
                        cxl_k, cxl_i, cxl_v, cxl_ver, cxl_size, pf_mark, pf_cnt,
                        nvme_cap - tcount[NVME], to_nvme, cand_k, cand_id, vic2,
                    )  # fmt: skip
                    n_res -= nv
                    s_evict += nv
                    cxl_size = _spill(
                        ps, tab, rules, t, pos, n_desc, cxl_cap, tier, since, tcount, moved,
                        cxl_k, cxl_i, cxl_v, cxl_ver, cxl_size, cand_k, cand_id, vic,
                    )  # fmt: skip
                    if tcount[NVME] > nvme_cap:
                        err = 1
            else:  # CXL DRAM and NVMe exchange entries
                cxl_size, full = _bg_lower(
                    ps, rules, t, pos, n_desc, cxl_cap, nvme_cap, tier, since, tcount, moved,
                    cxl_fifo, cxl_k, cxl_i, cxl_v, cxl_ver, cxl_size, cand_k, cand_id, vic,
                    vic2, stash,
                )  # fmt: skip
                if full:
                    err = 1
            log_inside(tlog, moved)
            log_boundary(tlog, moved, pos, step)  # (a record of its own, if it moved any)
            if err:
                break
        if bb == nb:
            break
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
            if sb == 0 and BY_AGE:  # FirmwareSession.lengths before the batch (never shrink)
                for j in range(b_loff[b], b_loff[b + 1]):
                    ctx_tokens[l_ctx[j]] = max(ctx_tokens[l_ctx[j]], l_tok[j])
            if n_sub > 1 and n_res <= capacity and resident[p_ids[a]] and not pf_on:
                # Reads of resident entries, one after another: what the two calls below do
                # for each, without them (most of a mostly-hit request replay): the write call
                # has nothing to write, the read call one hit, on_access, and no room to
                # make.  The run ends at the first non-resident.
                j = a
                while j < z0:
                    e = p_ids[j]
                    if not resident[e]:
                        break
                    call += 2
                    stamp[e] = call
                    changed = on_access(ps, e, j, p_w[j], time)
                    # (this queue-or-dirty step is written out at each of its three sites: an
                    # inlined helper taking the queue's arrays pays their reference counts,
                    # 3x LRU's replay time, Measured)
                    if QUEUE:
                        if hsize == hcap:
                            hsize = _compact(hk, hi, hv, hhead, hsize, ver)
                            hhead = 0
                        if changed and not pinned[e]:
                            k_ = key_of(priority(ps, tab, e, now_of(ps, time)))
                            hsize = _enqueue(hk, hi, hv, hsize, k_, e, ver)
                    elif STATIC and changed and not stale and not dirty[e]:
                        dirty[e] = True
                        dirty_list[n_dirty] = e
                        n_dirty += 1
                    time += 1
                    if STATIC and not QUEUE and n_dirty * 2 > n_list:
                        stale = True
                    j += 1
                h = j - a
                t = time - 1  # (the last hit's time, as its read call left it)
                s_hits += h
                reads[pos] += h
                hits[pos] += h
                tokens[pos] += tok
                log_hits(tlog, h, pos, step, tok, moved)
                nxt_sb = sb + h
                continue
            # Up to three calls per batch: a write (the batch's own, or a trace's entries
            # written just before their first read), the reads, then their prefetch.
            for phase in range(3):
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
                    t = time - 1 if time > 0 or offline else 0  # (offline: −1 first)
                    for j in range(na):
                        e = adm[j]
                        created[e] = True
                        if e + 1 > n_desc:
                            n_desc = e + 1
                        if BY_AGE:  # EntryTable.append: at least its last block's first token
                            # + 1; a trace's entry written on first read: its block full
                            tl = (e_block[e] + 1) * bt if b_read[b] else e_block[e] * bt + 1
                            ctx_tokens[e_ctx[e]] = max(ctx_tokens[e_ctx[e]], tl)
                        tier[e] = HBM
                        stamp[e] = call
                    tcount[HBM] += na
                    moved[pos, HOST, HBM] += na
                    log_open(tlog, False, pos, step, 0, 0, 0, 0, 0, moved)
                elif phase == 1:
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
                    n_w = 0
                    for j in range(a, z):  # hits: resident at the batch's start
                        e = p_ids[j]
                        first = stamp[e] != call
                        stamp[e] = call  # every read entry is protected
                        if resident[e]:
                            nh += 1
                            if first and not pinned[e]:
                                n_prot += 1
                            if pf_on and pf_mark[e]:  # a useful prefetch (counted once)
                                pf_mark[e] = False
                                pf_cnt[PF_USEFUL] += 1
                                if pf_log:  # (the read waits on the record that fetched it)
                                    pf_recs[n_w] = pf_rec[e]
                                    n_w += 1
                        else:
                            tr = tier[e]
                            if tr == CXL:
                                c_cxl += 1
                            elif tr == NVME:
                                c_nvme += 1
                            else:
                                miss[pos, tr] += 1
                            if first:  # the misses to admit, once each
                                adm[na] = e
                                na += 1
                    miss[pos, CXL] += c_cxl
                    miss[pos, NVME] += c_nvme
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
                    log_seal(tlog, moved)
                    _promote(adm, na, pos, tier, tcount, moved)
                    log_open(tlog, True, pos, step, tok, nh, m, c_cxl, c_nvme, moved)
                    if n_w:  # (a call of its own only when there are waits)
                        log_waits(tlog, pf_recs, n_w)
                else:  # FirmwareSession.prefetch_candidates, then .prefetch at the read's time
                    if not pf_on or not b_read[b]:
                        continue
                    mc = pf_gather(pf, p_ids, p_w, a, z, e_ctx, e_block, n_desc, resident)
                    if mc == 0:
                        continue
                    for j in range(mc):
                        e = pf.cand[j]
                        if pf.int_mode:  # (Q0.16 ranks are exact as floats)
                            pf.rank[j] = float(pf_rank_q16(pf, pf.dist[e], score_q16(ps, e)))
                        else:
                            pf.rank[j] = pf_rank_float(pf, pf.dist[e], score(ps, e))
                    na = pf_order(pf, mc, adm)
                    call += 1
                    is_write = True
                    t = time - 1
                    pf_cnt[PF_TOTAL] += na
                    if na > 1:  # PolicyCache.insert admits in ascending id order
                        adm[:na] = np.sort(adm[:na])
                    log_prefetch(tlog, moved)
                    for j in range(na):  # marked before its evictions settle
                        e = adm[j]
                        pf_mark[e] = True
                        if pf_log:
                            pf_rec[e] = tlog.st[0] - 1  # (the open read record)
                        stamp[e] = call
                    _promote(adm, na, pos, tier, tcount, moved)
                # --- PolicyCache._admit(adm[:na]) ---
                if QUEUE and hsize + na + (z - a) > hcap:  # (room for every touch below)
                    hsize = _compact(hk, hi, hv, hhead, hsize, ver)
                    hhead = 0
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
                        if not QUEUE:  # (a queue policy's victims come from its queue)
                            res_list[n_list] = e
                            res_pos[e] = n_list
                        n_list += 1
                        n_prot += 1
                    if not persistent:  # Policy.on_insert
                        forget(ps, e)
                    on_insert(ps, e, t)
                    if QUEUE:  # every insert joins the queue's tail at once (TOUCH: at its read)
                        if not pinned[e] and (is_write or not TOUCH):
                            k_ = key_of(priority(ps, tab, e, now_of(ps, t)))
                            hsize = _enqueue(hk, hi, hv, hsize, k_, e, ver)
                    elif STATIC and not stale and not dirty[e]:  # (a stale heap is rebuilt whole)
                        dirty[e] = True
                        dirty_list[n_dirty] = e
                        n_dirty += 1
                if ADMIT and na:
                    on_admit(ps, adm, na, t)
                # --- on_access (reads only) ---
                if not is_write:
                    for j in range(a, z):
                        e = p_ids[j]
                        if ONCE:  # once per entry: numpy's last write wins
                            if stamp[e] != call:
                                continue
                            stamp[e] = -call
                        changed = on_access(ps, e, j, p_w[j], t)
                        if QUEUE:  # and every touch that moves a key
                            if changed and not pinned[e]:
                                k_ = key_of(priority(ps, tab, e, now_of(ps, t)))
                                hsize = _enqueue(hk, hi, hv, hsize, k_, e, ver)
                        elif STATIC and changed and not stale and not dirty[e]:
                            dirty[e] = True
                            dirty_list[n_dirty] = e
                            n_dirty += 1
                    if ONCE:
                        for j in range(a, z):
                            if stamp[p_ids[j]] == -call:
                                stamp[p_ids[j]] = call
                    time += 1
                # (a heap: cheaper to rebuild than to push them all; a queue appends them)
                if STATIC and not QUEUE and n_dirty * 2 > n_list:
                    stale = True
                # --- PolicyCache._make_room ---
                over = n_res - capacity
                if over <= 0:
                    continue
                # else the call's entries compete too (the bypassing optimum: always)
                protect = n_list - n_prot >= over and not bypass
                left = over
                n_pass = 0
                n_out = 0
                while left > 0:  # one pass (exact: the only one; batched: eviction_batch each)
                    k_pass = eviction_batch if batched else over
                    now = now_of(ps, t)  # what priority reads as the pass's time
                    nv = 0
                    if (STATIC and not SELECT and (QUEUE or k_pass * 16 <= n_list)
                            and not (LAYERED and managed)):  # fmt: skip
                        # the queue (any number of victims), or the heap (few among many)
                        if QUEUE:  # (every touch is queued already, in key order)
                            nv, hhead = _take(
                                hk, hi, hv, hhead, hsize, k_pass, ver, stamp, call, protect, vic
                            )
                        else:
                            if stale or hsize + n_dirty > hcap:
                                hsize = n_list
                                for j in range(n_list):
                                    e = res_list[j]
                                    ver[e] += 1
                                    hi[j] = e
                                    hv[j] = ver[e]
                                    hk[j] = key_of(priority(ps, tab, e, now))
                                _heapify(hk, hi, hv, hsize)
                                for j in range(n_dirty):
                                    dirty[dirty_list[j]] = False
                                n_dirty = 0
                                stale = False
                            else:
                                for j in range(n_dirty):
                                    e = dirty_list[j]
                                    dirty[e] = False
                                    if resident[e] and not pinned[e]:
                                        ver[e] += 1
                                        k_ = key_of(priority(ps, tab, e, now))
                                        hsize = _push(hk, hi, hv, hsize, k_, e, ver[e])
                                n_dirty = 0
                            n_st = 0
                            while nv < k_pass and hsize > 0:
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
                            for j in range(n_st):
                                e = stash[2 * j]
                                hsize = _push(hk, hi, hv, hsize, stash[2 * j + 1], e, ver[e])
                        if record:
                            for j in range(nv):
                                vgrp[j] = n_pass * T.LAYERS
                    elif LAYERED and managed:  # layer by layer, each by the policy's order
                        # (the layers move only with a score or a touch: fixed for the call)
                        lay_n[:] = 0
                        for j in range(n_list):
                            e = res_list[j]
                            if protect and stamp[e] == call:
                                continue
                            s_ = score(ps, e)
                            g = T.layer(rules, s_, T.value(rules, s_, idle_steps(ps, e),
                                                           e_block[e] * bt))  # fmt: skip
                            lay_ids[g, lay_n[g]] = e
                            lay_n[g] += 1
                        for g in range(T.LAYERS):
                            if nv >= k_pass:
                                break
                            mc = lay_n[g]
                            if mc == 0:
                                continue
                            if SELECT:
                                for j in range(mc):
                                    cand_id[j] = lay_ids[g, j]
                                got = select(ps, tab, cand_id, mc, k_pass - nv, now, vic2)
                            elif mc <= k_pass - nv:  # the whole layer leaves: no ranking
                                for j in range(mc):
                                    vic2[j] = lay_ids[g, j]
                                got = mc
                            else:
                                for j in range(mc):
                                    cand_id[j] = lay_ids[g, j]
                                    cand_k[j] = key_of(priority(ps, tab, cand_id[j], now))
                                got = T.smallest(cand_k, cand_id, mc, k_pass - nv, vic2)
                            for j in range(got):
                                vic[nv + j] = vic2[j]
                                if record:
                                    vgrp[nv + j] = n_pass * T.LAYERS + g
                            nv += got
                    else:  # the selection over the eligible resident entries
                        mc = 0
                        for j in range(n_list):
                            e = res_list[j]
                            if protect and stamp[e] == call:
                                continue
                            cand_id[mc] = e
                            mc += 1
                        if SELECT:
                            nv = select(ps, tab, cand_id, mc, k_pass, now, vic)
                        else:
                            kmin = 0
                            kmax = 0
                            for j in range(mc):
                                k = key_of(priority(ps, tab, cand_id[j], now))
                                cand_k[j] = k
                                if j == 0 or k < kmin:
                                    kmin = k
                                if j == 0 or k > kmax:
                                    kmax = k
                            nv = _select(cand_k, cand_id, mc, k_pass, kmin, kmax, vic)
                        if record:
                            for j in range(nv):
                                vgrp[j] = n_pass * T.LAYERS
                    if nv == 0:
                        break
                    if batched:
                        s_pass += 1
                    else:
                        s_pass += (nv + eviction_batch - 1) // eviction_batch
                    # --- the victims leave: dump, placement, on_evict, tiers.demote ---
                    if record:  # each victim with its priority and key (ordered afterwards)
                        call_batch[call] = b
                        for j in range(nv):
                            e = vic[j]
                            p = priority(ps, tab, e, now)
                            d_id[n_dump + j] = e
                            d_call[n_dump + j] = call
                            d_grp[n_dump + j] = vgrp[j]
                            d_pr[n_dump + j] = float(p)
                            # (a policy's own selection orders its victims itself)
                            d_key[n_dump + j] = j if SELECT else key_of(p)
                        n_dump += nv
                    n_list, cxl_size = _leave(
                        ps, vic, nv, t, pos, persistent, nvme_below, cxl_fifo, n_desc,
                        resident, res_list, res_pos, n_list, tier, tcount, moved, since,
                        cxl_k, cxl_i, cxl_v, cxl_ver, cxl_size, pf_mark, pf_cnt,
                        nvme_cap - tcount[NVME], to_nvme, cand_k, cand_id, vic2,
                    )  # fmt: skip
                    n_res -= nv
                    s_evict += nv
                    left -= nv
                    n_out += nv
                    n_pass += 1
                    if not batched:
                        break
                if n_out and tcount[CXL] > cxl_cap:  # (CXL DRAM over its capacity)
                    cxl_size = _spill(
                        ps, tab, rules, t, pos, n_desc, cxl_cap, tier, since, tcount, moved,
                        cxl_k, cxl_i, cxl_v, cxl_ver, cxl_size, cand_k, cand_id, vic,
                    )  # fmt: skip
                    if tcount[NVME] > nvme_cap:
                        err = 1
                        break
            if err:
                break
        if err:
            break
    log_close(tlog, moved)
    stats = np.array([s_hits, s_miss, s_ins, s_evict, s_pass, n_pinned, n_res, n_desc])
    return (
        reads, hits, miss, stall, tokens, moved, tier, tcount, stats,
        d_id[:n_dump], d_pr[:n_dump], d_key[:n_dump], d_call[:n_dump], d_grp[:n_dump],
        call_batch, err, pf_cnt,
    )  # fmt: skip
