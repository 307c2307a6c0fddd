"""The fast replay engine: the simulator's hot loop compiled with numba.

:func:`unsupported` says why a run needs the numpy engine (or None); :func:`run` replays
a stream and fills the numpy engine's books, tiers and cache statistics, so that the
result dict is built by the same code (:meth:`kvcxl.emu.sim.simulator._Replay._result`).
The numpy engine (``--engine numpy``) stays the readable reference and the RTL's truth;
``tests/test_sim_fast.py`` and ``tests/test_sim_differential.py`` hold the two equal.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.formulas import recency_decay
from kvcxl.firmware.policies import POLICIES, make_policy
from kvcxl.firmware.policies.base import Policy
from kvcxl.firmware.policies.belady import NEVER, Future
from kvcxl.firmware.table import EntryTable

from ...workloads.stream import CREATE, ReadStream

if TYPE_CHECKING:
    from ..simulator import _Replay

ENGINES = ("fast", "numpy")
# Policy (and mode) → kernel code (kernel.py: LRU, FIFO, LFU, EMA_F, EMA_I).
POLICY_CODES = {
    ("lru", "float"): 0,
    ("fifo", "float"): 1,
    ("lfu", "float"): 2,
    ("ema", "float"): 3,
    ("ema", "int"): 4,
    ("random", "float"): 5,
    ("sink-window", "float"): 6,
    ("h2o", "float"): 7,
    ("belady", "float"): 8,
    ("belady-nobypass", "float"): 8,
    ("lrfu", "float"): 9,
    ("lru-anchor", "float"): 0,
}  # fmt: skip  (lru-anchor: LRU, its pins from wants_pin)
COVERED = ", ".join(sorted({p for p, _ in POLICY_CODES}))
_noticed: set[str] = set()


def policy_param(policy: Policy, name: str) -> Any:
    """One of a policy's own parameters (docs/policy.md: ``lfu_tie_break``, ``sink_tokens``,
    ``recent_tokens``, ``lrfu_lambda``, ``seed``): the one place the fast engine reads them."""
    return getattr(policy.params, name)


def unsupported(opts: Any) -> str | None:
    """Why the fast engine cannot replay ``opts`` (None: it can)."""
    mode = opts.mode if opts.policy == "ema" else "float"
    if (opts.policy, mode) not in POLICY_CODES:
        return f"the fast engine does not cover policy {opts.policy} (it covers {COVERED})"
    if opts.prefetch:
        return "the fast engine does not prefetch yet"
    if getattr(opts, "timeline", False):
        return "the transfer timeline runs on the numpy engine"
    cfg = opts.config  # tier rules of docs/policy.md the kernel does not replicate yet
    for name, today in (("eviction_passes", "exact"), ("cxl_order", "fifo"),
                        ("tier_management", "static")):  # fmt: skip
        if getattr(cfg, name) != today:
            return f"the fast engine does not replay {name} = {getattr(cfg, name)!r} yet"
    if opts.audit:
        return "the eviction audit runs on the numpy engine"
    if opts.check:
        return "per-event tier checks run on the numpy engine"
    try:
        import numba  # noqa: F401
    except ImportError:
        return "numba is not installed (pip install numba)"
    return None


def notice(reason: str) -> None:
    """One line on stderr, once per reason and process, when a run falls back to numpy."""
    if reason not in _noticed:
        _noticed.add(reason)
        print(f"kvcxl: replaying with the numpy engine: {reason}", file=sys.stderr)


def flat_plan(stream: ReadStream, granularity: str) -> dict[str, NDArray]:
    """:func:`kvcxl.emu.sim.simulator.plan_batches` as flat arrays: per batch ``read``,
    ``step``, ``tokens`` and ``off`` (offsets into ``ids``/``w``).  The same batches, in
    the same order, with the same reads (tests/test_sim_fast.py compares the two), except
    that ``request`` keeps each layer as one batch: the loop serves its reads one by one
    (a layer without reads is then no batch; its tokens go to its first read)."""
    keep = ~stream.lazy_creates
    ev = np.flatnonzero(keep)
    kinds, steps = stream.ev_kind[ev], stream.ev_step[ev]
    is_read = kinds != CREATE
    sizes = (stream.ev_off[ev + 1] - stream.ev_off[ev]).astype(np.int64)
    lo, hi = int(stream.ev_off[0]), int(stream.ev_off[-1])
    ids, w = stream.ids[lo:hi], stream.w[lo:hi]
    if ev.size != stream.n_events:  # the kept events' records, in order (a mask: one pass)
        rec = np.repeat(keep, np.diff(stream.ev_off))
        ids, w = ids[rec], w[rec]
    ids = ids.astype(np.int64, copy=False)
    ev_rec = np.concatenate([[0], np.cumsum(sizes)])
    first = np.ones(ev.size, dtype=bool)
    if granularity == "step":  # consecutive READ events of a step form one batch
        first[1:] = ~(is_read[1:] & is_read[:-1] & (steps[1:] == steps[:-1]))
    g = np.flatnonzero(first)
    off = np.append(ev_rec[g], ev_rec[-1])
    read = is_read[g]
    # Context lengths set before each batch: its events' length records, in order.
    lsz = (stream.len_off[ev + 1] - stream.len_off[ev]).astype(np.int64)
    lstart = np.repeat(stream.len_off[ev].astype(np.int64) - np.cumsum(lsz) + lsz, lsz)
    lrec = lstart + np.arange(int(lsz.sum()), dtype=np.int64)
    ev_lrec = np.concatenate([[0], np.cumsum(lsz)])
    loff = np.append(ev_lrec[g], ev_lrec[-1]).astype(np.int64)
    tok = np.add.reduceat(stream.ev_tokens[ev], g) if g.size else np.zeros(0, np.int64)
    tok = np.where(read, tok, 0).astype(np.int64)
    step = steps[g].astype(np.int64)
    return {"read": read, "step": step, "tokens": tok, "off": off.astype(np.int64),
            "ids": ids, "w": w, "loff": loff,
            "l_ctx": stream.len_ctx[lrec].astype(np.int64),
            "l_tok": stream.len_tokens[lrec].astype(np.int64)}  # fmt: skip


def _kernel_plan(stream: ReadStream, granularity: str) -> dict[str, Any]:
    plan: dict[str, Any] = flat_plan(stream, granularity)
    plan["e_ctx"] = np.asarray(stream.e_ctx, np.int64)
    plan["e_block"] = np.asarray(stream.e_block, np.int64)
    plan["n_ctx"] = int(max(plan["e_ctx"].max(initial=0), plan["l_ctx"].max(initial=0))) + 1
    return plan


def _future(
    plan: dict[str, NDArray], n: int, per_request: bool, offline: bool
) -> tuple[NDArray, NDArray]:
    """For the offline optimum: each entry's first read and, per record, the entry's next
    read after that record's batch (the firmware's Future over the read batches as
    replayed: a batch's time is its index among them)."""
    if not offline:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    size = np.diff(plan["off"])
    read_rec = np.repeat(plan["read"], size)
    if per_request:  # every read its own batch
        time = np.cumsum(read_rec) - 1
    else:
        time = np.repeat(np.cumsum(plan["read"]) - 1, size)
    ids = plan["ids"]
    future = Future(ids[read_rec], time[read_rec])
    nxt0 = np.asarray(future.next_use(np.arange(n), -1), np.int64)
    # Future.next_use with each record's own time (its keys: id·span + time, sorted)
    keys, span = future.keys, future.span
    q = ids * span + np.minimum(time, span - 1)
    at = np.searchsorted(keys, q, side="right")
    at_c = np.minimum(at, max(keys.size - 1, 0))
    found = (at < keys.size) & (keys[at_c] // span == ids) if keys.size else np.zeros(0, bool)
    nxt = np.where(found, keys[at_c] % span if keys.size else 0, NEVER)
    return nxt0, np.where(read_rec, nxt, NEVER).astype(np.int64)


def run(rep: _Replay) -> None:
    """Replay ``rep``'s stream with the kernel; fill its books, tiers, stats and dump."""
    from .kernel import LFU_SPAN, replay

    opts, stream, fw = rep.opts, rep.stream, rep.fw
    cfg = fw.config
    mode = opts.mode if opts.policy == "ema" else "float"
    code = POLICY_CODES[(opts.policy, mode)]
    plan = stream.derived(
        ("fast.flat_plan", opts.granularity), lambda: _kernel_plan(stream, opts.granularity)
    )
    n = stream.n_entries
    books = rep.books
    npos = max(books.n, 1)
    rs = np.asarray(books.read_steps, np.int64)
    # Pins as the policy itself decides them, on the stream's entry table (a policy that
    # keeps Policy.wants_pin pins nothing: no table to build).
    cls = POLICIES[opts.policy]
    if cls.wants_pin is Policy.wants_pin:
        want_pin = np.zeros(n, np.bool_)
    else:
        table = EntryTable(block_tokens=stream.shape.block_tokens, capacity=max(n, 16))
        table.append(stream.e_ctx, stream.e_layer, stream.e_head, stream.e_block)
        kwargs: dict[str, Any] = {"mode": mode} if "int" in cls.modes else {}
        if fw.offline:
            kwargs["future"] = fw.policy.future  # type: ignore[attr-defined]
        want_pin = np.asarray(
            make_policy(opts.policy, cfg, table, **kwargs).wants_pin(np.arange(n))
        )
    # The float decay for every idle count the replay can reach (one per step boundary), and
    # the Q0.16 table: the EMA's alone (no other policy reads them).
    decay_f, decay_q = np.zeros(0, np.float64), np.zeros(0, np.int64)
    if code == POLICY_CODES[("ema", "float")]:
        n_steps = int(np.count_nonzero(np.diff(plan["step"]))) + 2
        decay_f = np.asarray(
            recency_decay(np.arange(n_steps, dtype=np.int64), cfg.beta), np.float64
        )
    elif code == POLICY_CODES[("ema", "int")]:
        decay_q = np.asarray(fx.decay_table(cfg.beta, cfg.decay_shift), np.int64)
    # Weights as the stream holds them (float32, widened exactly in the loop); Q0.16 by the
    # firmware's rounding.
    w = plan["w"] if plan["w"].dtype == np.float32 else np.asarray(plan["w"], np.float64)
    wq = np.asarray(fx.to_q16(w), np.int64) if mode == "int" else np.zeros(0, np.int64)
    nvme_below = -np.inf
    if fw.placement == "policy" and fw.policy.scored and cfg.placement_mode == "thresholds":
        nvme_below = float(cfg.evict_threshold)
    lfu_key = (1, 0)  # lfu_tie_break "index": the count alone (then the lower id)
    if opts.policy == "lfu" and policy_param(fw.policy, "lfu_tie_break") == "lru":
        lfu_key = (LFU_SPAN, 1)
    seed = policy_param(fw.policy, "seed") if opts.policy == "random" else 0
    recent = policy_param(fw.policy, "recent_tokens") if opts.policy == "h2o" else 0
    lam = float(policy_param(fw.policy, "lrfu_lambda")) if opts.policy == "lrfu" else 0.0
    nxt0, rec_next = _future(plan, n, opts.granularity == "request", fw.offline)
    e_ctx, e_block, n_ctx = plan["e_ctx"], plan["e_block"], plan["n_ctx"]
    t = opts.timing
    tiers = rep.tiers
    out = replay(
        code, plan["read"], plan["step"], plan["off"], rs, plan["tokens"],
        plan["ids"], w, wq, n, want_pin.astype(np.bool_), stream.has_lazy_creates,
        fw.cache.capacity, fw.cache.pinned_capacity, bool(cfg.persistent_metadata),
        int(cfg.eviction_batch), float(cfg.alpha), float(cfg.touch_threshold),
        fx.alpha_to_q16(cfg.alpha), int(fx.to_q16(cfg.touch_threshold)), decay_f, decay_q,
        int(cfg.decay_shift), nvme_below, int(tiers.cap[2]), int(tiers.cap[3]), int(rep.eb),
        float(t.cxl_latency_ns), float(t.cxl_gbps), float(t.nvme_latency_ns),
        float(t.nvme_gbps), npos, bool(opts.record_victims), *lfu_key,
        opts.granularity == "request", np.uint64(seed), e_ctx, e_block,
        int(stream.shape.block_tokens), n_ctx, plan["loff"], plan["l_ctx"], plan["l_tok"], recent,
        nxt0, rec_next, bool(fw.policy.may_bypass), lam,
    )  # fmt: skip
    reads, hits, miss, stall, tokens, moved, tier, tcount, stats = out[:9]
    d_id, d_pr, d_key, d_call, call_batch, err = out[9:]
    if err:
        nv, cap = int(tcount[3]), tiers.cap[3]
        raise ValueError(
            f"NVMe tier full: {nv} entries placed, capacity {cap} ({cap * tiers.entry_bytes} B);"
            " raise --nvme or --cxl"
        )
    k = books.n
    books.reads[:] = reads[:k]
    books.hits[:] = hits[:k]
    books.miss[:] = miss[:k]
    books.stall[:] = stall[:k]
    books.tokens[:] = tokens[:k]
    books.bytes[:] = (reads[:k] * rep.eb).astype(np.float64)
    books.moved[:] = moved
    tiers.tier[:n] = tier
    tiers.count[:] = tcount
    tiers.moved[:] = moved.sum(axis=0)
    tiers.n = n
    s = fw.cache.stats
    s.hits, s.misses, s.inserts, s.evictions, s.eviction_passes, s.pinned = (
        int(x) for x in stats[:6]
    )
    fw.cache.n_resident = int(stats[6])
    rep.n_described = int(stats[7])
    if opts.record_victims and d_id.size:
        # Each call's victims in the contract order: priority descending (key ascending),
        # then entry id ascending.
        o = np.lexsort((d_id, d_key, d_call))
        d_id, d_pr, d_call = d_id[o], d_pr[o], d_call[o]
        cut = np.flatnonzero(np.diff(d_call)) + 1
        for ids_, pr_, c_ in zip(
            np.split(d_id, cut), np.split(d_pr, cut), np.split(d_call, cut), strict=True
        ):
            rep.dump.append((ids_, pr_, int(plan["step"][call_batch[c_[0]]])))
