"""TierBoundary: the managed tiers' step-boundary moves in RTL (firmware/tiering.py).

At a step boundary with managed tiers and threshold placement, the firmware
(``FirmwareSession._background`` → :func:`kvcxl.firmware.tiering.background_plan`) moves
entries between the two tiers below HBM, at most ``background_moves`` in all:

* **down** (CXL DRAM → NVMe): the CXL DRAM entries scored below ``evict_threshold``,
  lowest score first (ties lower id), at most NVMe's free room;
* **up** (NVMe → CXL DRAM), after the downs: the NVMe entries scored at or above it,
  highest first (ties lower id), into CXL DRAM's free room plus what the downs freed.

The engine takes one sweep over the entry table (``lanes`` entries a beat, in address
order: each entry's Q0.16 score and its tier code, :data:`kvcxl.firmware.formulas.TIER_*`)
and streams the plan out on ``move``: the downs in order, then the ups.  Two streaming
top-k selectors (:class:`kvcxl.rtl.eviction.EvictionEngine`, imported) rank the sweep side
by side: the down selector sees priority ``Q_MAX − score`` and only the sinks, the up
selector priority ``score`` and only the rises; both orders are the contract's
(priority descending, index ascending), so they are the firmware's.  Counters of sinks and
rises give the plan's sizes:

    n_down = min(budget, down_room, sinks)
    n_up   = min(budget − n_down, up_room + n_down, rises)

One sweep plans at most ``batch`` moves (``budget``, ``down_room`` and ``up_room`` are
``batch``-bounded inputs, taken with the sweep's last beat; ``threshold`` is read with
every beat).  The host splits a larger budget into sweeps
(:func:`host_plan`), each after the previous one's moves changed the tiers; the
concatenation is the firmware's plan (the proof is in :func:`host_plan`'s docstring).

The threshold is an input in Q0.16 (17 bits: 0 … 65536), the bound T of
:func:`threshold_q16`: a score q is below ``evict_threshold`` exactly when q < T, which
that function derives from the firmware's own conversion and test.  Weighted placement
(float placement values) has no integer contract and is not built.

Planted defects for the checks to catch (``defect=``): ``sink_at_threshold``, a CXL DRAM
entry scored exactly T also sinks (≤ where the firmware's test is <);
``ups_ignore_downs``, the ups are bounded by the budget itself instead of what the downs
left of it (a plan can move more than ``budget`` entries).
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np
from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM, TIER_NAMES, TIER_NVME
from kvcxl.firmware.tiering import background_plan

from . import layouts as L
from .eviction import EvictionEngine, sweep_widths

DEFECTS = (None, "sink_at_threshold", "ups_ignore_downs")
TIER_BITS = (len(TIER_NAMES) - 1).bit_length()  # the tier codes of firmware/formulas.py
THRESHOLD_BITS = fx.FRAC_BITS + 1  # T ∈ [0, Q_ONE]: evict_threshold = 1 puts every score below


def threshold_q16(evict_threshold: float) -> int:
    """The Q0.16 bound T of ``evict_threshold``: the firmware's test
    ``from_q16(q) < evict_threshold`` (``FirmwareSession._background``) holds exactly for
    q < T.  Counted with the firmware's own conversion, so the RTL's compare cannot drift
    from it (the test is monotone in q)."""
    q = np.arange(fx.Q_ONE, dtype=np.int64)
    return int(np.count_nonzero(fx.from_q16(q) < evict_threshold))


THRESHOLD_RESET = threshold_q16(PolicyConfig.evict_threshold)


# --- payload layouts (the testbench packs with these) -------------------------------------


def entry_layout(q_bits: int = L.Q_BITS) -> data.StructLayout:
    """One entry of the boundary sweep: its score and the tier it is in."""
    return data.StructLayout({"score": unsigned(q_bits), "tier": unsigned(TIER_BITS)})


def sweep_layout(lanes: int, addr_bits: int, q_bits: int = L.Q_BITS) -> data.StructLayout:
    """A beat of the boundary sweep: ``lanes`` entries starting at ``addr·lanes``."""
    return data.StructLayout(
        {
            "addr": unsigned(max(addr_bits, 1)),
            "last": unsigned(1),  # the sweep's final beat: the plan streams out next
            "lane": data.ArrayLayout(entry_layout(q_bits), lanes),
        }
    )


def move_layout(index_bits: int, q_bits: int = L.Q_BITS) -> data.StructLayout:
    """A move of the plan, in the firmware's order (downs, then ups)."""
    return data.StructLayout(
        {
            "index": unsigned(max(index_bits, 1)),
            "score": unsigned(q_bits),
            "up": unsigned(1),  # 0: CXL DRAM → NVMe, 1: NVMe → CXL DRAM
            "last": unsigned(1),  # the plan's final move
            "empty": unsigned(1),  # the plan moves nothing (index, score, up void)
        }
    )


class TierBoundary(wiring.Component):
    """One sweep of (score, tier) records in, the step boundary's moves out."""

    def __init__(
        self,
        entries: int,
        lanes: int = 1,
        batch: int = 8,
        *,
        q_bits: int = L.Q_BITS,
        defect: str | None = None,
    ):
        self.addr_bits, self.index_bits = sweep_widths(entries, lanes, batch, defect, DEFECTS)
        self.entries, self.lanes, self.batch = entries, lanes, batch
        self.q_bits, self.defect = q_bits, defect
        t_bits = q_bits + 1
        t_init = THRESHOLD_RESET >> (fx.FRAC_BITS - q_bits) if q_bits <= fx.FRAC_BITS else 0
        super().__init__(
            {
                "cand": In(stream.Signature(sweep_layout(lanes, self.addr_bits, q_bits))),
                "move": Out(stream.Signature(move_layout(self.index_bits, q_bits))),
                "threshold": In(t_bits, init=t_init),
                "budget": In(range(batch + 1), init=batch),  # moves this sweep may plan
                "down_room": In(range(batch + 1), init=batch),  # free NVMe entries (clamped)
                "up_room": In(range(batch + 1), init=batch),  # free CXL DRAM entries (clamped)
            }
        )
        # The two selectors (built here so that a testbench can watch them).
        self.sel_down = EvictionEngine(entries, lanes, batch, q_bits=q_bits)
        self.sel_up = EvictionEngine(entries, lanes, batch, q_bits=q_bits)

    def elaborate(self, platform):
        m = Module()
        K, lanes, qb = self.batch, self.lanes, self.q_bits
        q_max = (1 << qb) - 1
        m.submodules.down = down = self.sel_down
        m.submodules.up = up = self.sel_up

        # The sweep, forked to both selectors: a beat moves when both take it.
        t = self.threshold
        sink = Signal(lanes)
        rise = Signal(lanes)
        for i in range(lanes):
            ln = self.cand.payload.lane[i]
            below = (ln.score <= t) if self.defect == "sink_at_threshold" else (ln.score < t)
            m.d.comb += [
                sink[i].eq((ln.tier == TIER_CXL) & below),
                rise[i].eq((ln.tier == TIER_NVME) & ~(ln.score < t)),
            ]
            for sel, prio, ok in ((down, q_max - ln.score, sink[i]), (up, ln.score, rise[i])):
                lane = sel.cand.payload.lane[i]
                m.d.comb += [lane.priority.eq(prio), lane.eligible.eq(ok)]
        for sel, other in ((down, up), (up, down)):
            m.d.comb += [
                sel.cand.payload.addr.eq(self.cand.payload.addr),
                sel.cand.payload.last.eq(self.cand.payload.last),
                sel.cand.valid.eq(self.cand.valid & other.cand.ready),
            ]
        m.d.comb += self.cand.ready.eq(down.cand.ready & up.cand.ready)

        # Sinks and rises seen, saturating at the batch (no plan moves more).
        n_sink = Signal(range(K + 1))
        n_rise = Signal(range(K + 1))
        took = self.cand.valid & self.cand.ready
        for n, mask in ((n_sink, sink), (n_rise, rise)):
            add = Signal(range(K + lanes + 1))
            m.d.comb += add.eq(n + sum(mask[i] for i in range(lanes)))
            with m.If(took):
                m.d.sync += n.eq(Mux(add > K, K, add))

        def smin(a, b):
            return Mux(a < b, a, b)

        # The plan's bounds, taken with the sweep's last beat: the host may set the next
        # sweep's while this plan streams out.
        budget = Signal.like(self.budget)
        down_room = Signal.like(self.down_room)
        up_room = Signal.like(self.up_room)
        with m.If(took & self.cand.payload.last):
            m.d.sync += [budget.eq(self.budget), down_room.eq(self.down_room),
                         up_room.eq(self.up_room)]  # fmt: skip

        down_k = Signal(range(K + 1))
        n_down = Signal(range(K + 1))
        up_k = Signal(range(K + 1))
        n_up = Signal(range(K + 1))
        total = Signal(range(2 * K + 1))
        up_budget = budget if self.defect == "ups_ignore_downs" else budget - n_down
        m.d.comb += [
            down_k.eq(smin(budget, down_room)),
            n_down.eq(smin(down_k, n_sink)),
            up_k.eq(smin(up_budget, up_room + n_down)),
            n_up.eq(smin(up_k, n_rise)),
            total.eq(n_down + n_up),
            down.k.eq(down_k),
            up.k.eq(up_k),
        ]

        # The plan out: the down selector's victims, then the up selector's.  A selector's
        # empty beat (nothing to move) is taken silently, unless the whole plan is empty:
        # then the up selector's empty beat goes out as the plan's one beat.
        phase_up = Signal()
        sent = Signal(range(2 * K + 1))
        v_valid = Mux(phase_up, up.victim.valid, down.victim.valid)
        v_index = Mux(phase_up, up.victim.payload.index, down.victim.payload.index)
        v_prio = Mux(phase_up, up.victim.payload.priority, down.victim.payload.priority)
        v_last = Mux(phase_up, up.victim.payload.last, down.victim.payload.last)
        v_empty = Mux(phase_up, up.victim.payload.empty, down.victim.payload.empty)
        nothing = phase_up & (total == 0)  # the plan's one empty beat
        out = v_valid & (~v_empty | nothing)
        pl = self.move.payload
        m.d.comb += [
            self.move.valid.eq(out),
            pl.index.eq(Mux(v_empty, 0, v_index)),
            pl.score.eq(Mux(v_empty, 0, Mux(phase_up, v_prio, q_max - v_prio))),
            pl.up.eq(phase_up & ~v_empty),
            pl.last.eq(v_empty | (sent + 1 == total)),
            pl.empty.eq(v_empty),
        ]
        take = Signal()
        m.d.comb += take.eq(Mux(out, self.move.ready, v_valid))
        m.d.comb += [
            down.victim.ready.eq(~phase_up & take),
            up.victim.ready.eq(phase_up & take),
        ]
        with m.If(v_valid & take):
            with m.If(~v_empty):
                m.d.sync += sent.eq(sent + 1)
            with m.If(v_last):
                m.d.sync += phase_up.eq(~phase_up)
                with m.If(phase_up):  # the plan is out: ready for the next sweep
                    m.d.sync += [sent.eq(0), n_sink.eq(0), n_rise.eq(0)]
        return m


# --- the host side: one plan in sweeps of at most ``batch`` moves --------------------------

Sweep = Callable[[NDArray, NDArray, int, int, int], list[tuple[int, int]]]


def sweep_tiers(tier: NDArray) -> NDArray:
    """The tier codes a sweep carries: CXL DRAM and NVMe as they are, anything else (HBM,
    an id not created yet) as HBM, which neither selector takes."""
    tier = np.asarray(tier)
    return np.where((tier == TIER_CXL) | (tier == TIER_NVME), tier, TIER_HBM).astype(np.uint8)


def host_sweeps(
    tier: NDArray, score: NDArray, budget: int, room: int, nvme_room: int, batch: int
) -> Generator[tuple[NDArray, NDArray, int, int, int], list[tuple[int, int]], tuple]:
    """The host's sweeps of one plan, as a generator (so that a simulator's coroutine can
    drive it): it yields each sweep's (tier, score, budget, down_room, up_room), is sent
    that sweep's moves as (index, up), and returns the firmware's (downs, ups).

    Between sweeps the moved entries change tier (a demoted entry scored below T is then
    neither a sink nor a rise, a raised one at or above T neither).  The firmware plans
    D = min(B, nvme_room, sinks) downs and U = min(B − D, room + D, rises) ups.  Each sweep
    takes the best of what is left, so the concatenation is in the firmware's order; a
    sweep plans ups only once the downs are over (its downs fell short of its budget),
    after which ``down_room`` is 0 (the downs' limit is the firmware's nvme_room before the
    boundary, never the room the ups free), and ``up_room`` is room + downs − ups so far,
    which the sweep raises by its own downs.  A sweep that plans fewer moves than its
    budget has met a bound or run out, so it is the last.
    """
    tier = sweep_tiers(tier)
    downs: list[int] = []
    ups: list[int] = []
    left, down_left = budget, min(budget, nvme_room)
    while left > 0:
        b = min(left, batch)
        moves = yield (
            tier.copy(), score, b, min(down_left, batch),
            min(room + len(downs) - len(ups), batch),
        )  # fmt: skip
        d = [i for i, u in moves if not u]
        u = [i for i, u in moves if u]
        down_left = 0 if len(d) < min(b, down_left) else down_left - len(d)
        downs += d
        ups += u
        tier[d] = TIER_NVME
        tier[u] = TIER_CXL
        left -= len(moves)
        if len(moves) < b:
            break
    return downs, ups


def host_plan(
    sweep: Sweep,
    tier: NDArray,
    score: NDArray,
    budget: int,
    room: int,
    nvme_room: int,
    batch: int,
) -> tuple[list[int], list[int]]:
    """:func:`host_sweeps` driven by ``sweep(tier, score, budget, down_room, up_room)``, which
    runs one sweep and returns its moves as (index, up): the firmware's (downs, ups)."""
    gen = host_sweeps(tier, score, budget, room, nvme_room, batch)
    try:
        req = next(gen)
        while True:
            req = gen.send(sweep(*req))
    except StopIteration as done:
        return done.value


def plan_sweep(
    tier: NDArray, score: NDArray, budget: int, down_room: int, up_room: int, threshold: int
) -> list[tuple[int, int]]:
    """What one sweep of the engine answers: the firmware's own plan
    (:func:`kvcxl.firmware.tiering.background_plan`) over the sweep's integers, with
    ``down_room`` as NVMe's room and ``up_room`` as CXL DRAM's, sinks and rises by the
    bound T (``threshold``)."""
    tier = np.asarray(tier)
    score = np.asarray(score, dtype=np.int64)
    in_cxl = np.flatnonzero(tier == TIER_CXL)
    in_nvme = np.flatnonzero(tier == TIER_NVME)
    down, up = background_plan(
        in_cxl, score[in_cxl], score[in_cxl] < threshold,
        in_nvme, score[in_nvme], score[in_nvme] >= threshold, budget, up_room, down_room,
    )  # fmt: skip
    return [(int(i), 0) for i in down] + [(int(i), 1) for i in up]


__all__ = [
    "DEFECTS",
    "THRESHOLD_RESET",
    "TierBoundary",
    "entry_layout",
    "host_plan",
    "host_sweeps",
    "move_layout",
    "plan_sweep",
    "sweep_layout",
    "sweep_tiers",
    "threshold_q16",
]
