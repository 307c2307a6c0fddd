"""The replay loop's working state, as named bundles of arrays that its phases share.

:mod:`kvcxl.emu.sim.fast.loop` allocates one :class:`Work` per replay and hands it, with
the replay's inputs as one :class:`Env`, to each of its phases, both passed through
:func:`kvcxl.emu.sim.fast.kernel.borrowed` (no reference count per array and call).  The
loop's scalars that outlive a phase (how many entries are resident, the batch time, the
call, ...) are the int64 array ``Work.c``, indexed by the names below; a phase reads the
ones it needs into locals and writes them back once.  The classes live here, not in the
loop's template (compiled once per policy), so that numba's cache can name them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from numpy.typing import NDArray

# Work.c: the loop's scalars
(
    N_RES,  # resident entries (pinned included)
    N_PINNED,
    N_LIST,  # resident, unpinned entries (Cache.res_list; a queue policy: how many)
    N_DESC,  # described entries (1 + the highest id written)
    HSIZE,  # the heap's (or the queue's) items
    HHEAD,  # the queue's head
    STALE,  # the heap must be rebuilt before use
    LSTALE,  # the listed entries' keys (Cache.lkey, .llay) must be recomputed before use
    N_DIRTY,  # entries whose key moved since the heap (or the listed keys) took them in
    CXL_SIZE,  # the CXL DRAM arrivals heap's items
    HITS,  # the cache's stats
    MISSES,
    INSERTS,
    EVICTIONS,
    PASSES,
    N_DUMP,  # victims dumped
    ERR,  # 1: NVMe over its capacity
    TIME,  # the batch time (one per read call)
    CALL,  # PolicyCache calls so far
    POS,  # the books' position of the current step
    T,  # the current call's time
    N_PROT,  # the current call's own entries, resident and unpinned (_make_room's)
    QRUN,  # the queue's sorted boundary run: [c[QRUN], c[QRUN + 1]) (kernel._take's)
    QRUN_END,
    OWN_A,  # the current call's own entries: plan.ids[OWN_A:OWN_Z], or Scratch.adm's
    OWN_Z,
    OWN_ADM,  # (1: adm's, a write's or a prefetch's admissions)
    LBASE,  # the listed keys' buckets (Cache.lhist, loop._bucket): their base key and shift
    LSHIFT,
    COUNTERS,  # (how many)
) = range(30)


class Env(NamedTuple):
    """The replay's inputs (:mod:`kvcxl.emu.sim.fast.hooks`' and the tiers', timeline's and
    prefetch's), as :func:`kvcxl.emu.sim.fast.loop.replay` receives them."""

    plan: Any
    run: Any
    media: Any
    tab: Any
    ps: Any  # the policy's state
    tlog: Any
    rules: Any
    pf: Any


class Books(NamedTuple):
    """Per step position: reads, hits, misses by tier, stall, tokens, moves (from, to)."""

    reads: NDArray
    hits: NDArray
    miss: NDArray
    stall: NDArray
    tokens: NDArray
    moved: NDArray


class Cache(NamedTuple):
    """HBM: who is resident, pinned, created; the resident unpinned list (swap-remove) and
    each one's place in it; the call that last marked each entry (a batch member).  Under
    managed tiers a STATIC policy also keeps each listed entry's key and eviction layer in
    the list's order (``lkey``, ``llay``: moved with it), so that a pass reads them in
    order instead of each entry's state at random, and counts them by layer and key bucket
    (``lhist``, row per layer), so that a pass knows its boundary before it reads them."""

    resident: NDArray
    pinned: NDArray
    created: NDArray
    res_list: NDArray
    res_pos: NDArray
    stamp: NDArray
    lkey: NDArray
    llay: NDArray
    lhist: NDArray


class Heap(NamedTuple):
    """The (key, id) heap of a STATIC policy's small evictions, or a QUEUE policy's queue
    (kernel's items: keys, ids, versions; each entry's version); the entries whose key moved
    since it was built.  Under managed tiers a STATIC policy keeps one such heap per
    eviction layer instead (row g of ``lk``/``li``/``lv``, ``lsz[g]`` items)."""

    hk: NDArray
    hi: NDArray
    hv: NDArray
    ver: NDArray
    dirty: NDArray
    dirty_list: NDArray
    lk: NDArray
    li: NDArray
    lv: NDArray
    lsz: NDArray


class Tiers(NamedTuple):
    """Each entry's tier and the count per tier; CXL DRAM's arrivals (since, and their heap
    by (since, id) with versions); the victims that take NVMe's last free room."""

    tier: NDArray
    tcount: NDArray
    since: NDArray
    cxl_k: NDArray
    cxl_i: NDArray
    cxl_v: NDArray
    cxl_ver: NDArray
    to_nvme: NDArray


class Scratch(NamedTuple):
    """Every scratch array at its largest size up front (an array variable reassigned in
    the loop costs reference counting on every iteration): a call's admissions, the
    candidates' ids and keys, the victims, the heap's stash, each victim's pass and layer,
    a managed pass's eligible entries' layers (``lay_of``, beside ``cand_id``) and how
    many in each (``lay_n``)."""

    adm: NDArray
    cand_id: NDArray
    cand_k: NDArray
    vic: NDArray
    vic2: NDArray
    stash: NDArray
    vgrp: NDArray
    lay_of: NDArray
    lay_n: NDArray


class Dump(NamedTuple):
    """The victims dumped: id, priority, key, call, pass and layer; each call's batch."""

    d_id: NDArray
    d_pr: NDArray
    d_key: NDArray
    d_call: NDArray
    d_grp: NDArray
    call_batch: NDArray


class Marks(NamedTuple):
    """Prefetch: which entries are marked prefetched, the counts (prefetch.TOTAL ...), the
    read record that prefetched each, and a read's useful ones' records."""

    mark: NDArray
    cnt: NDArray
    rec: NDArray
    recs: NDArray


class Work(NamedTuple):
    """Everything the replay keeps: the scalars ``c`` and the bundles above."""

    c: NDArray
    books: Books
    cache: Cache
    heap: Heap
    tiers: Tiers
    scratch: Scratch
    dump: Dump
    marks: Marks
