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

from kvcxl.firmware.policies import POLICIES, make_policy
from kvcxl.firmware.policies.base import Policy
from kvcxl.firmware.table import EntryTable

from ...workloads.stream import CREATE, ReadStream
from .sources import drop_stale

if TYPE_CHECKING:
    from ..simulator import _Replay

drop_stale()  # (before anything of the engine is compiled in this process)

ENGINES = ("fast", "numpy")
_noticed: set[str] = set()


def __getattr__(name: str) -> Any:
    """``POLICY_CODES`` ((policy, mode) → the name of the fast module that replays it) and
    ``COVERED`` (their names), derived from the registry on first use: the registry imports
    numba, which a process that never replays fast need not load."""
    if name == "POLICY_CODES":
        from .compose import modules

        return {pair: mod.__name__.rsplit(".", 1)[1] for pair, mod in modules().items()}
    if name == "COVERED":
        return ", ".join(sorted({p for p, _ in __getattr__("POLICY_CODES")}))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unsupported(opts: Any) -> str | None:
    """Why the fast engine cannot replay ``opts`` (None: it can)."""
    try:
        from .compose import modules  # (imports numba)
    except ImportError:
        have_numba = False
    else:
        have_numba = True
    # (the walked registry, cached there: a short replay asks at every run)
    if have_numba and _mode_of(opts) not in modules():
        covered = __getattr__("COVERED")
        return f"the fast engine does not cover policy {opts.policy} (it covers {covered})"
    if opts.audit:
        return "the eviction audit runs on the numpy engine"
    if opts.check:
        return "per-event tier checks run on the numpy engine"
    if not have_numba:
        return "numba is not installed (pip install numba)"
    return None


def _mode_of(opts: Any) -> tuple[str, str]:
    """The run's (policy, mode): a policy with one mode replays it as "float"."""
    cls = POLICIES.get(opts.policy)
    return (opts.policy, opts.mode if cls is not None and "int" in cls.modes else "float")


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
    plan["n_bounds"] = int(np.count_nonzero(np.diff(plan["step"]))) + 2  # step boundaries
    plan["max_batch"] = int(np.diff(plan["off"]).max(initial=0))
    return plan


def _want_pin(stream: ReadStream, fw: Any, policy: str, mode: str) -> NDArray:
    """Pins as the policy itself decides them, on the stream's entry table (a policy that
    keeps Policy.wants_pin pins nothing: no table to build).  A function of its own so that
    the table and the policy built for it (16 bytes an entry and more) are gone before the
    replay starts."""
    n = stream.n_entries
    cls = POLICIES[policy]
    if cls.wants_pin is Policy.wants_pin:
        return np.zeros(n, np.bool_)
    table = EntryTable(block_tokens=stream.shape.block_tokens, capacity=max(n, 16))
    table.append(stream.e_ctx, stream.e_layer, stream.e_head, stream.e_block)
    kwargs: dict[str, Any] = {"mode": mode} if "int" in cls.modes else {}
    if fw.offline:
        kwargs["future"] = fw.policy.future  # type: ignore[attr-defined]
    pins = make_policy(policy, fw.config, table, **kwargs).wants_pin(np.arange(n))
    return np.asarray(pins, np.bool_)


def run(rep: _Replay) -> None:
    """Replay ``rep``'s stream with the loop compiled for its policy; fill its books, tiers,
    stats and dump."""
    from .compose import modules, replay_for
    from .hooks import Media, Plan, Run, Setup, Table, id_dtype, stamp_dtype, trait
    from .prefetch import TOTAL, USEFUL, USEFUL_WARM, WASTED
    from .prefetch import build as prefetch_state
    from .tiers import rules_of
    from .timeline import arrays as log_arrays
    from .timeline import buffer as log_buffer

    opts, stream, fw = rep.opts, rep.stream, rep.fw
    cfg = fw.config
    policy, mode = _mode_of(opts)
    module = modules()[(policy, mode)]
    if hasattr(module, "variant"):  # a module may hand a run's own rules to another
        module = module.variant(fw.policy)
    plan = stream.derived(
        ("fast.flat_plan", opts.granularity), lambda: _kernel_plan(stream, opts.granularity)
    )
    n = stream.n_entries
    books = rep.books
    per_request = opts.granularity == "request"
    want_pin = _want_pin(stream, fw, policy, mode)
    # Weights as the stream holds them (float32, widened exactly where they are read), else
    # float64: the loop's and every policy's (Setup.plan), decided here once.
    w = plan["w"] if plan["w"].dtype == np.float32 else np.asarray(plan["w"], np.float64)
    plan = {**plan, "w": w}
    nvme_below = -np.inf
    if (fw.placement == "policy" and fw.policy.scored and cfg.placement_mode == "thresholds"
            and not fw.managed):  # (managed tiers: every victim lands in CXL DRAM)  # fmt: skip
        nvme_below = float(cfg.evict_threshold)
    # The cache's pinned and stamp columns: the loop writes them, a policy's select_all
    # reads them (Setup hands them to its state).
    n_units = plan["read"].size + (plan["ids"].size if per_request else 0)  # (a bound)
    pinned = np.zeros(n, np.bool_)
    stamp = np.zeros(n, stamp_dtype(plan["read"].size, n_units))
    setup = Setup(fw.policy, cfg, mode, plan, n, per_request, bool(fw.offline), pinned, stamp)
    state = module.build(setup)
    t, tiers = opts.timing, rep.tiers
    ctx_tokens = np.zeros(plan["n_ctx"] if trait(module, "BY_AGE") else 0, np.int64)
    tlog = log_buffer(bool(opts.timeline), plan["read"].size, plan["ids"].size, per_request)
    out = replay_for(module)(
        Plan(plan["read"], plan["step"], plan["tokens"], plan["off"], plan["ids"], w,
             plan["loff"], plan["l_ctx"], plan["l_tok"]),
        Run(n=n, read_steps=np.asarray(books.read_steps, np.int64), npos=max(books.n, 1),
            want_pin=want_pin, lazy=bool(stream.has_lazy_creates),
            capacity=int(fw.cache.capacity), pinned_capacity=int(fw.cache.pinned_capacity),
            persistent=bool(cfg.persistent_metadata), eviction_batch=int(cfg.eviction_batch),
            nvme_below=nvme_below, record=bool(opts.record_victims), per_request=per_request,
            offline=bool(fw.offline), bypass=bool(fw.policy.may_bypass), warm=int(books.warm),
            pinned=pinned, stamp=stamp, ids=np.zeros(0, id_dtype(n))),
        Media(cxl_cap=int(tiers.cap[2]), nvme_cap=int(tiers.cap[3]), entry_bytes=int(rep.eb),
              cxl_lat=float(t.cxl_latency_ns), cxl_gbps=float(t.cxl_gbps),
              nvme_lat=float(t.nvme_latency_ns), nvme_gbps=float(t.nvme_gbps)),
        Table(plan["e_ctx"], plan["e_block"], int(stream.shape.block_tokens), ctx_tokens),
        state,
        tlog,
        rules_of(fw, plan["n_bounds"]),
        prefetch_state(stream, cfg, on=bool(opts.prefetch), int_mode=fw.mode == "int",
                       limit=int(opts.prefetch_limit),
                       max_batch=plan["max_batch"]),
    )  # fmt: skip
    reads, hits, miss, stall, tokens, moved, tier, tcount, stats = out[:9]
    d_id, d_pr, d_key, d_call, d_grp, call_batch, err, pf_cnt = out[9:]
    if err:  # (moves take only free room and a misfit is refused up front: an engine defect)
        raise AssertionError(
            f"NVMe over capacity: {int(tcount[3])} entries placed, capacity {tiers.cap[3]}"
        )
    if opts.timeline:
        rep.tl_arrays = log_arrays(tlog, int(rep.eb))
    rep.pf_total, rep.pf_useful = int(pf_cnt[TOTAL]), int(pf_cnt[USEFUL])
    rep.pf_wasted, rep.pf_useful_warm = int(pf_cnt[WASTED]), int(pf_cnt[USEFUL_WARM])
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
        # Each call's victims in the contract order: pass by pass, layer by layer (managed
        # tiers), each by priority descending (key ascending), then entry id ascending.
        o = np.lexsort((d_id, d_key, d_grp, d_call))
        d_id, d_pr, d_call = d_id[o], d_pr[o], d_call[o]
        cut = np.flatnonzero(np.diff(d_call)) + 1
        for ids_, pr_, c_ in zip(
            np.split(d_id, cut), np.split(d_pr, cut), np.split(d_call, cut), strict=True
        ):
            rep.dump.append((ids_, pr_, int(plan["step"][call_batch[c_[0]]])))
