"""The three-tier replay engine: a read stream through one policy, one HBM budget.

HBM residency is :class:`kvcxl.firmware.cache.PolicyCache` (demand paging, pinned
anchors, exact audited eviction); :class:`kvcxl.emu.sim.tiers.Tiers` holds everything
else in CXL DRAM or NVMe.  Per event of the stream:

* CREATE: new entries are written into HBM (``cache.insert``); overflow is evicted.
* READ (one layer of a decode step, or the whole step with ``granularity="step"``):
  ``cache.access`` serves the batch — an entry resident at the batch's start is a
  hit, any other read a miss served from its tier and then promoted into HBM —
  and evicts the overflow, whose entries placement sends to CXL DRAM or NVMe.
  With prefetch on, the batch's strongest touches propose blocks of the same head
  in the next layers (:mod:`kvcxl.firmware.prefetch`); the best ranked
  non-resident candidates are brought into HBM.
* At every step boundary the policy's ``end_step`` runs (the EMA update).

Nothing here re-implements a policy formula: scores, priorities, placement and
prefetch ranks all come from :mod:`kvcxl.firmware`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM, TIER_NVME
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.policies.base import Policy
from kvcxl.firmware.policies.belady import Future
from kvcxl.firmware.session import Decisions, FirmwareSession
from kvcxl.firmware.table import EntryTable, unique_ids

from ..metrics import linear_percentiles
from ..timeline import Record, TransferLog
from ..timeline import engine as timeline_engine
from ..timeline.log import BACKGROUND_MOVES, EVICT_MOVES, FETCH_MOVES, LogArrays, moves_of
from ..timeline.report import report as timeline_report
from ..timeline.resources import Resources
from ..timing import TierTiming
from ..workloads.stream import CREATE, ReadStream
from . import fast
from .tiers import Tiers

GRANULARITIES = ("layer", "step", "request")
AUDIT_KEYS = (
    "audited_victims", "wrong_victims", "misordered_victims", "audited_passes",
    "history_checked", "priority_mismatches", "outranked_by_history", "pin_violations",
)  # fmt: skip


@dataclass
class SimOptions:
    """Everything a replay needs besides the stream."""

    policy: str = "ema"
    budget_bytes: int = 0
    cxl_bytes: int | None = None  # None: room for every entry
    nvme_bytes: int | None = None
    config: PolicyConfig = field(default_factory=PolicyConfig)
    timing: TierTiming = field(default_factory=TierTiming)
    prefetch: bool = False
    prefetch_limit: int = 64  # most entries prefetched per batch (and touches used as sources)
    placement: str = "policy"  # "policy": the firmware's placement rule; "fill": CXL first
    audit: bool = False
    warmup_steps: int = 0
    granularity: str = "layer"  # "layer", "step" or "request"
    mode: str = "float"  # ema: "float" or "int" (the Q0.16 contract)
    check: bool = False  # verify tier invariants after every event (slower)
    record_victims: bool = False
    # "fast" (compiled, kvcxl.emu.sim.fast) or "numpy" (the readable reference); None: fast
    # where it covers the run, else numpy with a one-line notice.
    engine: str | None = None
    # Schedule every transfer on the link, device DRAM and NVMe (docs/timeline.md).
    timeline: bool = False

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity {self.granularity!r}: must be one of {', '.join(GRANULARITIES)}"
            )
        if self.budget_bytes < 0:
            raise ValueError(f"budget {self.budget_bytes} B is negative")
        if self.prefetch_limit < 1:
            raise ValueError(f"prefetch_limit = {self.prefetch_limit}: must be >= 1")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps = {self.warmup_steps}: must be >= 0")
        if self.engine not in (None, "fast", "numpy"):
            raise ValueError(f"engine {self.engine!r}: must be 'fast' or 'numpy'")


@dataclass
class _Batch:
    """One unit of replay: a write (CREATE) or a batch of reads served together."""

    read: bool
    step: int
    ids: NDArray
    w: NDArray | None
    tokens: int  # tokens decoded in the step (counted once, on its first batch)
    lens: tuple[NDArray, NDArray] | None  # (context, tokens) lengths set before the batch


def plan_batches(stream: ReadStream, granularity: str) -> list[_Batch]:
    """The stream's events regrouped as the replay serves them (docs/simulator.md).

    ``layer``: one batch per READ event (one layer of a step); ``step``: the consecutive
    READ events of a step form one batch; ``request``: every read is its own batch.
    A trace's lazy CREATE events are dropped (``stream.lazy_creates``): the replay writes
    the entries no write record created just before the batch that first reads them,
    whatever the grouping; explicit writes (a version-2 trace's, a workload's) stay events.
    """
    kinds, steps, off, loff = stream.ev_kind, stream.ev_step, stream.ev_off, stream.len_off
    ev = np.flatnonzero(~stream.lazy_creates)
    out: list[_Batch] = []

    def lens(a: int, z: int) -> tuple[NDArray, NDArray] | None:
        lo, hi = int(loff[a]), int(loff[z])
        return (stream.len_ctx[lo:hi], stream.len_tokens[lo:hi]) if hi > lo else None

    i, n = 0, ev.size
    while i < n:
        e = int(ev[i])
        step = int(steps[e])
        if kinds[e] == CREATE:
            ids = stream.ids[off[e] : off[e + 1]]
            out.append(_Batch(False, step, ids, None, 0, lens(e, e + 1)))
            i += 1
            continue
        j = i + 1
        if granularity == "step":
            while j < n and kinds[ev[j]] != CREATE and int(steps[ev[j]]) == step:
                j += 1
        group = ev[i:j]
        if group.size == 1 or np.all(np.diff(group) == 1):
            a, z = int(group[0]), int(group[-1]) + 1
            ids, w = stream.ids[off[a] : off[z]], stream.w[off[a] : off[z]]
            ln = lens(a, z)
        else:  # a trace's layer batches with its (dropped) CREATE events between them
            ids = np.concatenate([stream.ids[off[g] : off[g + 1]] for g in group])
            w = np.concatenate([stream.w[off[g] : off[g + 1]] for g in group])
            parts = [x for g in group if (x := lens(int(g), int(g) + 1)) is not None]
            ln = (
                (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
                if parts
                else None
            )
        tokens = int(stream.ev_tokens[group].sum())
        if granularity == "request":
            for k in range(ids.size):
                first = k == 0
                out.append(
                    _Batch(True, step, ids[k : k + 1], w[k : k + 1], tokens if first else 0,
                           ln if first else None)
                )  # fmt: skip
        else:
            out.append(_Batch(True, step, ids, w, tokens, ln))
        i = j
    return out


def simulate(
    stream: ReadStream,
    opts: SimOptions,
    *,
    progress: Callable[[int], None] | None = None,
    policy: Callable[[PolicyConfig, EntryTable], Policy] | None = None,
) -> dict[str, Any]:
    """Replay ``stream`` under ``opts``; returns the metrics of docs/simulator.md, "Timing model
    and metrics" (Simulated).  ``opts.engine`` picks the engine (the result says which).
    ``policy`` builds the policy object in place of ``opts.policy``'s (e.g. one whose
    decisions come from the RTL); it needs the numpy engine."""
    if policy is not None and pick_engine(opts) != "numpy":
        raise ValueError("a policy object needs the numpy engine (engine='numpy')")
    return _Replay(stream, opts, policy).run(progress)


def check_fit(
    n_total: int, hbm: int, cxl: int, nvme: int, entry_bytes: int, config: PolicyConfig
) -> None:
    """Refuse up front a workload the tiers cannot hold (docs/policy.md, "Room below HBM"):
    HBM + CXL DRAM + NVMe must hold every entry it creates, and with batched passes, whose
    last may evict up to ``eviction_batch`` − 1 entries past the overflow, that many more
    (when anything is evicted at all).  Every other move waits for room, so a workload that
    fits runs."""
    extra = 0
    if config.eviction_passes == "batched" and n_total > hbm:
        extra = min(config.eviction_batch - 1, hbm)
    if hbm + cxl + nvme >= n_total + extra:
        return

    def size(n: int) -> str:
        return f"{n} entries ({n * entry_bytes} B)"

    why = (
        f" plus the {extra} entries a batched pass may evict past the overflow "
        f"(eviction_batch {config.eviction_batch})"
        if extra
        else ""
    )
    raise ValueError(
        f"the workload does not fit: it creates {size(n_total)} of KV{why}, but HBM holds "
        f"{size(hbm)}, CXL DRAM {size(cxl)} and NVMe {size(nvme)}, "
        f"{size(hbm + cxl + nvme)} in all: raise --budget, --cxl or --nvme"
    )


def pick_engine(opts: SimOptions) -> str:
    """The engine that replays ``opts``: an explicit choice, else the fast one where it covers
    the run and numpy (with a one-line notice) where it does not; ``engine="fast"`` for a
    run it does not cover is refused."""
    if opts.engine == "numpy":
        return "numpy"
    why = fast.unsupported(opts)
    if why is None:
        return "fast"
    if opts.engine == "fast":
        raise ValueError(f"--engine fast: {why}; use --engine numpy")
    fast.notice(why)
    return "numpy"


class _StepBooks:
    """Per-read-step accounting: reads, hits, misses by source tier, stall, tokens, moves."""

    def __init__(self, read_steps: NDArray, warmup_steps: int, moved_shape: tuple) -> None:
        n = read_steps.size
        self.read_steps, self.n = read_steps, n
        self.reads = np.zeros(n, np.int64)
        self.hits = np.zeros(n, np.int64)
        self.miss = np.zeros((n, 4), np.int64)  # by source tier code
        self.stall = np.zeros(n, np.float64)
        self.tokens = np.zeros(n, np.int64)
        self.bytes = np.zeros(n, np.float64)
        # Entries moved, by the read step an event belongs to (the first read step at or
        # after its own step: a step's writes count with its reads).
        self.moved = np.zeros((max(n, 1), *moved_shape), np.int64)
        self.warm = min(warmup_steps, n)

    def position(self, step: int) -> int:
        """Index among the read steps of the first read step at or after ``step``."""
        return min(int(np.searchsorted(self.read_steps, step)), max(self.n - 1, 0))


class _Replay:
    """One replay: the firmware session decides, the tiers move bytes, the books count."""

    def __init__(
        self,
        stream: ReadStream,
        opts: SimOptions,
        policy: Callable[[PolicyConfig, EntryTable], Policy] | None = None,
    ) -> None:
        self.stream, self.opts = stream, opts
        shape = stream.shape
        self.eb = eb = shape.entry_bytes
        n_total = stream.n_entries
        self.capacity = opts.budget_bytes // eb
        cxl_cap = n_total if opts.cxl_bytes is None else opts.cxl_bytes // eb
        nvme_cap = n_total if opts.nvme_bytes is None else opts.nvme_bytes // eb
        check_fit(n_total, self.capacity, cxl_cap, nvme_cap, eb, opts.config)
        self.engine = pick_engine(opts)
        # The numpy engine's batches (the fast engine flattens the same plan itself).
        self.plan = plan_batches(stream, opts.granularity) if self.engine == "numpy" else []
        # The fast engine keeps its own per-entry state: the session's table, cache and
        # policy columns stay empty (their config, capacities and statistics are used).
        n_rows = n_total if self.engine == "numpy" else 0
        cls = POLICIES.get(opts.policy)
        future = None
        if cls is not None and not cls.online:  # given the future: every read batch as replayed
            if opts.prefetch:
                raise ValueError(
                    f"{opts.policy} is a demand-paging optimum: run it with prefetch off"
                )
            future = Future.from_batches([b.ids for b in self.plan if b.read])
        # Victim order matters only to a dump (compared entry by entry with the device and guest).
        self.fw = fw = FirmwareSession(
            opts.policy,
            self.capacity,
            opts.config,
            mode=opts.mode,
            table=EntryTable(block_tokens=shape.block_tokens, capacity=max(n_rows, 16)),
            audit=opts.audit,
            placement=opts.placement,
            future=future,
            ordered_victims=opts.record_victims,
            victim_priority=opts.record_victims,
            cxl_capacity=cxl_cap,
            nvme_capacity=nvme_cap,
        )
        if policy is not None:
            own = policy(fw.config, fw.table)
            own.set_capacity(self.capacity)  # as the cache tells the policy it builds
            fw.use_policy(own)
        fw.ensure(n_rows)
        for ctx, parent, blocks in stream.prefixes:
            fw.share_prefix(ctx, parent, blocks)
        self.tiers = Tiers(eb, cxl_cap, nvme_cap, size=n_total)
        self.dump: list[tuple[NDArray, NDArray, int]] = []
        self.prefetched = np.zeros(n_rows, dtype=bool)
        self.pf_total = self.pf_useful = self.pf_wasted = self.pf_useful_warm = 0
        self.lazy = stream.has_lazy_creates  # some entries are created on first read
        self.created = np.zeros(n_rows, dtype=bool)
        # The timeline's transfer log (docs/timeline.md), and which record prefetched an entry.
        self.tl = TransferLog(eb) if opts.timeline and self.engine == "numpy" else None
        self.tl_arrays: LogArrays | None = None  # the fast engine's log (its array form)
        self.pf_rec = np.full(n_rows if opts.timeline else 0, -1, np.int64)
        self.books = _StepBooks(
            stream.derived(
                "read_steps", lambda: unique_ids(stream.ev_step[stream.ev_kind != CREATE])
            ),
            opts.warmup_steps,
            self.tiers.moved.shape,
        )
        t = opts.timing
        self.t_batch = {
            TIER_CXL: lambda n: t.cxl_latency_ns + n * eb / t.cxl_gbps,
            TIER_NVME: lambda n: t.nvme_latency_ns + n * eb / t.nvme_gbps,
        }

    # --- the events ----------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None) -> dict[str, Any]:
        if self.engine == "fast":
            fast.run(self)
            if progress is not None:
                progress(len(self.stream.ev_kind))
            self.tiers.check(self.n_described, self.fw.cache.n_resident, self.fw.cache.capacity)
            return self._result()
        fw, tiers, books = self.fw, self.tiers, self.books
        last_step: int | None = None
        pos = 0
        mark = tiers.moved.copy()
        for b in self.plan:
            step = b.step
            if last_step is None:
                pos = books.position(step)
            elif step != last_step:
                new_pos = books.position(step)
                if new_pos != pos:
                    books.moved[pos] += tiers.moved - mark
                    mark = tiers.moved.copy()
                    pos = new_pos
                    if pos == books.warm:
                        self.pf_useful_warm = self.pf_useful
            last_step = step
            fw.at(step)
            self._boundary(step)  # the step boundary's moves, if it closed one
            if b.lens is not None:
                fw.lengths(*b.lens)
            if not b.read:
                self._write(b.ids, step)
            else:
                self._read(b, pos)
            if self.opts.check:
                tiers.check(fw.table.n, fw.cache.n_resident, fw.cache.capacity)
            if progress is not None:
                progress(1)
        fw.end_step()
        self._boundary(last_step or 0)
        books.moved[pos] += tiers.moved - mark
        tiers.check(fw.table.n, fw.cache.n_resident, fw.cache.capacity)
        return self._result()

    def _boundary(self, step: int) -> None:
        """Carry out what a step boundary decided (managed tiers' background moves and the
        CXL DRAM overflow they cause); on the timeline, a record of background moves issued
        beside the next step's compute (docs/timeline.md)."""
        m0 = self._moved()
        self._settle(self.fw.take_decisions(), step)
        if self.tl is not None:
            moves = self._delta(m0, BACKGROUND_MOVES)
            if moves:
                self.tl.add(Record(False, step=step, background=moves))

    def _write(self, ids: NDArray, step: int, on_first_read: bool = False) -> None:
        """The host writes new KV into HBM (entries ``ids``, in creation order)."""
        if ids.size == 0:
            return
        fw, stream = self.fw, self.stream
        n = fw.table.n
        if ids[0] != n or not np.array_equal(ids, np.arange(n, n + ids.size)):
            raise ValueError(f"stream creates entries out of order at step {step}")
        c = stream.e_ctx[ids]
        fw.describe(c, stream.e_layer[ids], stream.e_head[ids], stream.e_block[ids])
        if on_first_read:  # a trace's context is as long as its highest block so far (full)
            bt = stream.shape.block_tokens
            fw.lengths(c, (stream.e_block[ids].astype(np.int64) + 1) * bt)
        self.created[ids] = True
        self.tiers.create(ids)
        m0 = self._moved()
        self._settle(fw.write(step, ids), step)
        if self.tl is not None:
            self.tl.add(Record(False, step=step, evict=self._delta(m0, EVICT_MOVES)))

    def _read(self, b: _Batch, pos: int) -> None:
        """One batch of reads: hits, misses paged in from their tier, victims placed."""
        fw, tiers, books = self.fw, self.tiers, self.books
        ids, w, step = b.ids, b.w, b.step
        if self.lazy:
            new = ids[~self.created[ids]]
            if new.size:
                self._write(unique_ids(new), step, on_first_read=True)
        src_tier = tiers.tier[ids]  # where every read is served from if it misses
        hit, d = fw.read(step, ids, w)
        counts = np.bincount(src_tier[~hit], minlength=4)
        waits: list[tuple[int, int]] = []
        if self.pf_total:
            useful = self.prefetched[ids] & hit
            if useful.any():
                u = unique_ids(ids[useful])
                self.pf_useful += u.size
                self.prefetched[u] = False
                if self.tl is not None:
                    rec, n = np.unique(self.pf_rec[u], return_counts=True)
                    waits = [(int(a), int(b)) for a, b in zip(rec, n, strict=True)]
        m0 = self._moved()
        tiers.promote(d.admitted)
        self._settle(d, step)
        m1 = self._moved()
        books.reads[pos] += ids.size
        books.hits[pos] += ids.size - int(counts.sum())
        books.miss[pos] += counts
        books.bytes[pos] += ids.size * self.eb
        books.tokens[pos] += b.tokens
        for tier_code in (TIER_CXL, TIER_NVME):
            if counts[tier_code]:
                books.stall[pos] += self.t_batch[tier_code](int(counts[tier_code]))
        if self.opts.prefetch:
            self.pf_total += self._prefetch(ids, w, step)
        if self.tl is not None:
            hits = ids.size - int(counts.sum())
            self.tl.add(Record(
                True, pos=pos, step=step, tokens=b.tokens, hits=hits, reads=int(ids.size),
                demand={k: int(counts[c]) for k, c in zip(FETCH_MOVES, (TIER_CXL, TIER_NVME),
                                                          strict=True) if counts[c]},
                evict=self._delta(m0, EVICT_MOVES, m1),
                prefetch=self._delta(m1, FETCH_MOVES + EVICT_MOVES),
                waits=waits,
            ))  # fmt: skip

    def _moved(self) -> NDArray | None:
        """A copy of the tiers' moves so far, when the timeline records them."""
        return self.tiers.moved.copy() if self.tl is not None else None

    def _delta(
        self, before: NDArray | None, keys: tuple[str, ...], after: NDArray | None = None
    ) -> dict[str, int]:
        """Entries moved per move among ``keys`` since ``before`` (until ``after``)."""
        if before is None:
            return {}
        now = self.tiers.moved if after is None else after
        return moves_of(self.tiers.bytes_moved(now - before), self.eb, keys)

    def _settle(self, d: Decisions, step: int) -> None:
        """Move a call's victims out of HBM, where placement sends them, then carry out the
        lower-tier moves the firmware decided after them."""
        if d.victims.size == 0:
            for ids, src, dst in d.moves:
                self.tiers.move(ids, src, dst)
            return
        if self.opts.record_victims:
            self.dump.append((d.victims, np.asarray(d.priority, dtype=np.float64), step))
        if self.opts.prefetch:
            self.pf_wasted += int(np.count_nonzero(self.prefetched[d.victims]))
            self.prefetched[d.victims] = False
        self.tiers.demote(d.victims, d.tiers)
        for ids, src, dst in d.moves:
            self.tiers.move(ids, src, dst)

    def _prefetch(self, ids: NDArray, w: NDArray, step: int) -> int:
        chosen = self.fw.prefetch_candidates(ids, w, self.opts.prefetch_limit)
        if chosen.size == 0:
            return 0
        self.tiers.promote(chosen)
        d = self.fw.prefetch(chosen)
        assert d.admitted.size == chosen.size
        self.prefetched[chosen] = True
        if self.tl is not None:
            self.pf_rec[chosen] = len(self.tl.records)  # the read record being built
        self._settle(d, step)
        return int(chosen.size)

    # --- the metrics over the measured (post-warm-up) steps -------------------------------
    def _result(self) -> dict[str, Any]:
        opts, books, tiers, fw, eb = self.opts, self.books, self.tiers, self.fw, self.eb
        t, cfg, audit = opts.timing, opts.config, fw.audit
        n_total = self.stream.n_entries
        m = slice(books.warm, None)
        reads = int(books.reads[m].sum())
        hits = int(books.hits[m].sum())
        miss_by = books.miss[m].sum(axis=0)
        hbm_ns = t.access_ns(TIER_HBM, eb)
        lat_sum = hits * hbm_ns + sum(
            int(miss_by[c]) * t.access_ns(c, eb) for c in (TIER_CXL, TIER_NVME)
        )
        # Every read step's time (the serving metrics read them per step); the warm-up's are
        # excluded from the aggregates below.
        all_step_ns = books.hits * eb / t.hbm_gbps + books.stall
        if t.compute_model:
            all_step_ns = all_step_ns + (
                (t.compute_base_ms + t.compute_ms_per_gib * books.bytes / 2**30) * 1e6
            )
        step_ns = all_step_ns[m]
        tokens = int(books.tokens[m].sum())
        bytes_moved = tiers.bytes_moved(books.moved[books.warm :].sum(axis=0))
        stall = books.stall[m]
        pf_total, pf_useful, pf_warm = self.pf_total, self.pf_useful, self.pf_useful_warm
        p50, p95, p99 = linear_percentiles(stall, (50, 95, 99)) if stall.size else (0.0,) * 3
        cs = fw.cache.stats.as_dict()
        out: dict[str, Any] = {
            "evidence": "Simulated",
            "policy": opts.policy,
            "budget_bytes": int(opts.budget_bytes),
            "budget_entries": int(self.capacity),
            "budget_fraction": self.capacity / n_total if n_total else 0.0,
            "steps": int(books.n - books.warm),
            "warmup_steps": int(books.warm),
            "reads": reads,
            "hits": hits,
            "misses": reads - hits,
            "misses_cxl": int(miss_by[TIER_CXL]),
            "misses_nvme": int(miss_by[TIER_NVME]),
            "hit_rate": hits / reads if reads else 0.0,
            "byte_miss_ratio": (reads - hits) * eb / (reads * eb) if reads else 0.0,
            "effective_latency_ns": lat_sum / reads if reads else 0.0,
            "stall_ns_per_step_mean": float(stall.mean()) if stall.size else 0.0,
            "stall_ns_per_step_p50": p50,
            "stall_ns_per_step_p95": p95,
            "stall_ns_per_step_p99": p99,
            "step_time_ns_mean": float(step_ns.mean()) if step_ns.size else 0.0,
            "tokens": tokens,
            "tokens_per_s": tokens / (step_ns.sum() * 1e-9) if step_ns.sum() > 0 else None,
            "bytes_moved": bytes_moved,
            "bytes_moved_total": int(sum(bytes_moved.values())),
            "prefetch": opts.prefetch,
            "prefetched_entries": int(pf_total),
            "prefetch_precision": pf_useful / pf_total if pf_total else None,
            "prefetch_coverage": (
                (pf_useful - pf_warm) / ((pf_useful - pf_warm) + reads - hits)
                if pf_total and reads
                else None
            ),
            "metadata_bytes_per_entry": int(
                sum(np.dtype(d).itemsize for d, _ in fw.policy.columns.values())
            ),
            "entries": int(n_total),
            "kv_bytes": int(n_total * eb),
            "entry_bytes": int(eb),
            "occupancy_end": tiers.occupancy() | {"hbm_pinned": int(cs["pinned"])},
            "cache": cs,
            **(audit.as_dict() if audit else dict.fromkeys(AUDIT_KEYS)),
            "audit_faults": audit.faults if audit else None,
            "granularity": opts.granularity,
            "engine": self.engine,
            "persistent_metadata": cfg.persistent_metadata,
            "alpha": cfg.alpha,
            "timing": {f.name: getattr(t, f.name) for f in fields(t)},  # (scalars: asdict's
            # deep copy is the same dict at ten times the cost)
            "per_step": {
                "reads": books.reads.tolist(),
                "hits": books.hits.tolist(),
                "stall_ns": books.stall.tolist(),
                "step_ns": all_step_ns.tolist(),
                "tokens": books.tokens.tolist(),
                "misses_by_tier": {
                    name: books.miss[:, code].tolist()
                    for name, code in (("cxl", TIER_CXL), ("nvme", TIER_NVME))
                },
                "bytes_moved": tiers.bytes_moved_rows(books.moved[: books.n]),
            },
        }
        if opts.timeline:
            self._timeline(out, books)
        if opts.record_victims:
            out["_victims"] = self.dump
        return out

    def _timeline(self, out: dict[str, Any], books: _StepBooks) -> None:
        """Schedule the transfer log; its step times replace the analytic ones (kept as
        ``step_ns_analytic``, ``tokens_per_s_analytic``), so the serving metrics use them.
        The numpy engine's log on the readable scheduler (:mod:`kvcxl.emu.timeline.engine`),
        the fast engine's on the compiled one (:mod:`kvcxl.emu.timeline.compiled`)."""
        t = self.opts.timing
        res = Resources.of(t)
        rep: dict[str, Any]
        if self.tl is not None:
            self.tl.finish(t)
            sched = timeline_engine.run(self.tl, res)
            rep = timeline_report(self.tl, sched, res, books.n, books.warm, self.pf_wasted)
        else:
            from ..timeline import compiled

            log = self.tl_arrays
            assert log is not None
            log.finish(t)
            fsched = compiled.run(log, res)
            rep = timeline_report(log, fsched, res, books.n, books.warm, self.pf_wasted)
        ps = out["per_step"]
        ps["step_ns_analytic"], ps["step_ns"] = ps["step_ns"], rep.pop("step_ns")
        out["tokens_per_s_analytic"], out["tokens_per_s"] = out["tokens_per_s"], rep["tokens_per_s"]
        m = np.asarray(ps["step_ns"][books.warm :])
        out["step_time_ns_mean_analytic"] = out["step_time_ns_mean"]
        out["step_time_ns_mean"] = float(m.mean()) if m.size else 0.0
        out["timeline"] = rep


def victims_table(
    stream: ReadStream, dump: list[tuple[NDArray, NDArray, int]]
) -> dict[str, NDArray]:
    """Columns step, context, layer, head, block, priority of every eviction, in order."""
    if not dump:
        z = np.zeros(0, np.int64)
        return {
            "step": z,
            "context": z,
            "layer": z,
            "head": z,
            "block": z,
            "priority": z.astype(float),
        }
    ids = np.concatenate([d[0] for d in dump])
    return {
        "step": np.concatenate([np.full(d[0].size, d[2], np.int64) for d in dump]),
        "entry": ids,
        "context": stream.e_ctx[ids],
        "layer": stream.e_layer[ids],
        "head": stream.e_head[ids],
        "block": stream.e_block[ids],
        "priority": np.concatenate([d[1] for d in dump]),
    }
