"""Bounded model checks of the engines with SymbiYosys (yowasp-sby), at reduced widths.

Checks (each a harness around the real engine, inputs free every cycle; the list and
the defect each must catch are the designs' entries in :mod:`kvcxl.rtl.designs`):

``eviction``
    over any input stream of priorities and eligibility flags, in sweep order, for an
    arbitrary watched entry ``w`` and any ``k`` ≤ batch (free to change between passes,
    fixed within one): a victim is always eligible (a pinned or non-resident entry is
    never chosen); ``w`` is chosen at most once per pass; its reported priority is its
    input priority; victims come out in strictly decreasing (priority, −index) order;
    if ``w`` is eligible and not chosen, the pass chose ``k`` victims and every one
    ranks before ``w`` (maximality); the victim stream holds valid and payload while
    back-pressured.
``eviction_1lane``
    the same properties with one lane (the systolic top-k, batch 3): a pass that
    emitted before its drain ended would lose a candidate on its way to the last slot.
``scoring``
    under arbitrary back-pressure, input gaps and host record writes, no beat is lost
    or duplicated: occupancy = accepted − emitted ≤ DEPTH, output addresses follow the
    sweep order one by one, ``out`` holds valid and its control fields (address, last,
    idle counters, eligibility) while back-pressured, and every beat's ``eligible`` is
    ``resident ∧ ¬pinned`` of the record the host last wrote there.
``frontend``
    the CXL.mem front end under free M2S Req/RwD traffic and free back-pressure on
    NDR, DRS and touch: every accepted message is owed one response (DRS for MemRd /
    MemRdData, none for MemSpecRd, NDR otherwise), the response carries its tag and
    LD-ID and comes before the next message is taken (so in order, none lost), none
    is sent that was not owed (none duplicated or invented), only a read touches its
    entry and at most once, each output holds valid and payload while stalled, and a
    response comes within two cycles not stalled by ``touch``.
``clock``, ``sieve``
    the slot-queue engine under free host commands and back-pressure, every look of its
    walk against the golden step (:class:`SlotQueueHarness`): at the golden walk's next
    slot, a victim resident, unpinned and at 0, a counter taken down by one (a visited
    bit cleared) only where the policy says, min(k, offered) victims, held when stalled.
``s3fifo``
    the S3-FIFO engine under free host commands and back-pressure against the harness's
    copy of the golden step (:class:`S3FifoHarness`): a victim resident and unpinned (at
    0 in main, below the threshold in small), cursors that advance, counters moved only as
    the rule says, each INSERT's queue (a ghost hit enters main), the walk's stream.
``tier_boundary``
    the managed tiers' step boundary over any sweep, threshold, budget and rooms, each
    move against the firmware's plan (:class:`TierBoundaryHarness`): downs only below
    the threshold and lowest first, ups only at or above it and highest first, exactly
    min(B, D, sinks) downs then min(B − downs, U + downs, rises) ups, none twice.
``record_stream``
    the record-stream engine's memory traffic under any memory latency and back-pressure
    (:class:`RecordStreamHarness`), write commands and data taken in any order: each
    sweep reads every record word once, in order, and (not ``hold``) writes each back
    once, to the address it was read from, with no write command unsent when it ends.
``hdm``
    the RTL's HPA → DPA decode (:class:`kvcxl.rtl.hdm.HdmDecode`) against a reference
    written with ``//`` and ``%`` from the decoder parameters of
    :mod:`kvcxl.cxl.hdm`, for every 52-bit address and every programming
    ``HdmDecoderSet.program`` accepts: hit equal, and DPA equal where it hits.

The widths are reduced (3-bit priorities, a handful of entries, two lines) so that
proofs finish in tens of seconds; the arithmetic itself is checked bit-exactly in
simulation instead.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from amaranth.asserts import AnyConst, AnySeq
from amaranth.back import rtlil
from amaranth.hdl import (
    Array,
    Assert,
    Assume,
    Cat,
    Const,
    Elaboratable,
    Module,
    Mux,
    ResetSignal,
    Signal,
    Value,
)

from kvcxl.cxl import hdm
from kvcxl.cxl import mem as cxl

from . import toolchain
from .designs import CHECKS, DEFECTS
from .eviction import EvictionEngine
from .frontend import CxlMemFrontEnd
from .hdm import HPA_BITS, HdmDecode
from .record_stream import RecordStreamEngine
from .s3fifo import S3FifoEngine
from .scoring import DEPTH, ScoringEngine
from .slot_queue import SlotQueueEngine
from .tier_boundary import TierBoundary


@dataclass
class FormalResult:
    check: str
    status: str  # PASS / FAIL / ERROR
    depth: int
    seconds: float
    params: dict
    log_tail: str = ""

    def as_dict(self) -> dict:
        return {
            "check": self.check,
            "status": self.status,
            "depth": self.depth,
            "seconds": round(self.seconds, 2),
            "params": self.params,
        }


class _Past:
    """Registers holding last cycle's value (Amaranth 0.5 has no Past)."""

    def __init__(self, m: Module):
        self.m = m
        self.valid = Signal(name="past_valid")
        m.d.sync += self.valid.eq(1)

    def __call__(self, value, name: str):
        r = Signal.like(value, name=f"past_{name}")
        self.m.d.sync += r.eq(value)
        return r

    def hold(self, s, name: str) -> None:
        """The stream rule on ``s``: a beat back-pressured last cycle is offered again,
        its payload unchanged."""
        payload = Value.cast(s.payload)
        stalled = self(s.valid & ~s.ready, f"{name}_stall")
        held = self(payload, f"{name}_payload")
        with self.m.If(self.valid & stalled):
            self.m.d.comb += Assert(s.valid & (payload == held))


class EvictionHarness(Elaboratable):
    def __init__(
        self,
        entries: int = 4,
        lanes: int = 2,
        batch: int = 2,
        q_bits: int = 3,
        defect: str | None = None,
    ):

        self.dut = EvictionEngine(entries, lanes, batch, q_bits=q_bits, idle_bits=1, defect=defect)
        self.entries, self.lanes, self.batch, self.q_bits = entries, lanes, batch, q_bits

    def elaborate(self, platform):

        m = Module()
        _no_reset(m)
        m.submodules.dut = dut = self.dut
        lanes, groups = self.lanes, self.entries // self.lanes
        ib = dut.index_bits
        past = _Past(m)

        # Free inputs.
        m.d.comb += [
            dut.cand.valid.eq(AnySeq(1)),
            dut.cand.payload.eq(AnySeq(len(dut.cand.payload.as_value()))),
            dut.victim.ready.eq(AnySeq(1)),
        ]
        # k is any value in range, and may change between passes (not within one).
        k = AnySeq(range(self.batch + 1))
        m.d.comb += [dut.k.eq(k), Assume(k <= self.batch)]
        pass_ended = past(dut.victim.valid & dut.victim.ready & dut.victim.payload.last, "end")
        k_before = past(k, "k")
        with m.If(past.valid & ~pass_ended):
            m.d.comb += Assume(k == k_before)
        # The stream arrives in sweep order, as the scoring engine sends it.
        addr = Signal(dut.addr_bits)
        m.d.comb += [
            Assume(dut.cand.payload.addr == addr),
            Assume(dut.cand.payload.last == (addr == groups - 1)),
        ]
        with m.If(dut.cand.valid & dut.cand.ready):
            m.d.sync += addr.eq(Mux(addr == groups - 1, 0, addr + 1))

        # The watched entry w: its priority and eligibility in the current pass.
        w = AnyConst(ib)
        m.d.comb += Assume(w < self.entries)
        w_seen, w_elig = Signal(), Signal()
        w_prio = Signal(self.q_bits)
        with m.If(dut.cand.valid & dut.cand.ready):
            for i in range(lanes):
                with m.If(dut.cand.payload.addr * lanes + i == w):
                    lane = dut.cand.payload.lane[i]
                    m.d.sync += [w_seen.eq(1), w_elig.eq(lane.eligible), w_prio.eq(lane.priority)]

        v = dut.victim
        fire = v.valid & v.ready
        vi, vp = v.payload.index, v.payload.priority
        is_w = ~v.payload.empty & (vi == w)
        chosen = Signal()  # w already emitted in this pass
        emitted = Signal(range(self.batch + 2))
        worse = Signal()  # some victim ranked after w
        prev_ok = Signal()
        prev_p = Signal(self.q_bits)
        prev_i = Signal(ib)

        with m.If(v.valid):
            m.d.comb += Assert(~is_w | (w_seen & w_elig))  # only eligible entries
            m.d.comb += Assert(~is_w | (vp == w_prio))  # reported priority is the input's
            m.d.comb += Assert(~(is_w & chosen))  # never twice in a pass
            with m.If(prev_ok & ~v.payload.empty):  # strictly in the contract's order
                m.d.comb += Assert((prev_p > vp) | ((prev_p == vp) & (prev_i < vi)))
            with m.If(v.payload.empty):
                m.d.comb += Assert(v.payload.last)
        ranks_after_w = (vp < w_prio) | ((vp == w_prio) & (vi > w))
        with m.If(fire):
            m.d.sync += [prev_ok.eq(~v.payload.empty), prev_p.eq(vp), prev_i.eq(vi)]
            with m.If(is_w):
                m.d.sync += chosen.eq(1)
            with m.If(~v.payload.empty):
                m.d.sync += emitted.eq(emitted + 1)
                with m.If(ranks_after_w):
                    m.d.sync += worse.eq(1)
            with m.If(v.payload.last):
                n_emitted = Mux(v.payload.empty, 0, emitted + 1)
                w_out = w_seen & w_elig & ~chosen & ~is_w
                # Maximality: an eligible w left out means a full batch, all ahead of w.
                m.d.comb += Assert(
                    ~w_out | ((n_emitted == k) & ~worse & ~(~v.payload.empty & ranks_after_w))
                )
                m.d.sync += [w_seen.eq(0), chosen.eq(0), emitted.eq(0), worse.eq(0), prev_ok.eq(0)]
        # Stream rule: a back-pressured beat stays, unchanged.
        past.hold(v, "v")
        return m


class ScoringHarness(Elaboratable):
    def __init__(self, entries: int = 2, lanes: int = 1, defect: str | None = None):

        self.dut = ScoringEngine(entries, lanes, defect=defect)
        self.entries, self.lanes = entries, lanes

    def elaborate(self, platform):

        m = Module()
        _no_reset(m)
        m.submodules.dut = dut = self.dut
        groups = self.entries // self.lanes
        past = _Past(m)
        m.d.comb += [
            dut.upd.valid.eq(AnySeq(1)),
            dut.upd.payload.eq(AnySeq(len(dut.upd.payload.as_value()))),
            dut.out.ready.eq(AnySeq(1)),
            dut.rec_w.valid.eq(AnySeq(1)),
            dut.rec_w.payload.eq(AnySeq(len(dut.rec_w.payload.as_value()))),
            dut.table_w.valid.eq(AnySeq(1)),
            dut.table_w.payload.eq(AnySeq(len(dut.table_w.payload.as_value()))),
            dut.alpha.eq(AnySeq(len(dut.alpha))),
            dut.touch.eq(AnySeq(len(dut.touch))),
            dut.shift.eq(AnySeq(len(dut.shift))),
        ]
        accepted = Signal(8)
        emitted = Signal(8)
        out_addr = Signal(dut.addr_bits)
        up, out = dut.upd, dut.out
        with m.If(up.valid & up.ready):
            m.d.sync += accepted.eq(accepted + 1)
        with m.If(out.valid & out.ready):
            m.d.sync += [
                emitted.eq(emitted + 1),
                out_addr.eq(Mux(out_addr == groups - 1, 0, out_addr + 1)),
            ]
        occ = (accepted - emitted)[:8]

        m.d.comb += Assert(occ <= DEPTH)
        with m.If(out.valid):
            m.d.comb += [
                Assert(occ >= 1),
                Assert(out.payload.addr == out_addr),
                Assert(out.payload.last == (out_addr == groups - 1)),
            ]
        with m.If(occ == 0):
            m.d.comb += Assert(~out.valid)
        # eligible = resident ∧ ¬pinned of the record the host last wrote.  A host write
        # while a beat is in flight races the sweep's write-back (the driver never does
        # that); such a trace stops the comparison from then on.
        lanes = self.lanes
        flags = [
            (Signal(name=f"resident{e}"), Signal(name=f"pinned{e}")) for e in range(groups * lanes)
        ]
        racy = Signal()
        rw = dut.rec_w
        with m.If(rw.valid & rw.ready):
            with m.If(occ != 0):
                m.d.sync += racy.eq(1)
            for a in range(groups):
                with m.If(rw.payload.addr == a):
                    for i in range(lanes):
                        res, pin = flags[a * lanes + i]
                        rec = rw.payload.data[i]
                        m.d.sync += [res.eq(rec.resident), pin.eq(rec.pinned)]
        with m.If(out.valid & ~racy):
            for a in range(groups):
                with m.If(out.payload.addr == a):
                    for i in range(lanes):
                        res, pin = flags[a * lanes + i]
                        m.d.comb += Assert(out.payload.lane[i].eligible == (res & ~pin))
        # Held beats stay unchanged.  The multiplier outputs (score, priority) are left
        # out: their stability follows from the held pipeline registers, and proving it
        # through 16-bit products would take the solver hours.
        was_stalled = past(out.valid & ~out.ready, "ostall")
        ctl = Cat(
            out.payload.addr,
            out.payload.last,
            *(Cat(lane.idle, lane.eligible) for lane in out.payload.lane),
        )
        was_ctl = past(ctl, "octl")
        with m.If(past.valid & was_stalled):
            m.d.comb += Assert(out.valid & (ctl == was_ctl))
        return m


class FrontEndHarness(Elaboratable):
    """Every accepted M2S message is answered exactly once, with its tag, before the next
    is taken; nothing is answered that was not asked; responses hold under back-pressure
    and come within four unstalled cycles.  The HDM registers are free constants (the
    decode itself is the ``hdm`` check)."""

    NONE, NDR, DRS = 0, 1, 2  # the response a message is owed
    MAX_WAIT = 4  # unstalled cycles to the response: DECODE, DECODE2, ACCESS, TOUCH

    def __init__(self, lines: int = 2, defect: str | None = None):
        self.dut = CxlMemFrontEnd(
            lines=lines, entry_shift=cxl.LINE_SHIFT, entries=lines, defect=defect
        )
        self.lines = lines

    def elaborate(self, platform):
        m, dut, past = _start(self.dut)
        req, rwd, ndr, drs, touch = dut.req, dut.rwd, dut.ndr, dut.drs, dut.touch
        for s in (req, rwd):
            m.d.comb += [s.valid.eq(AnySeq(1)), s.payload.eq(AnySeq(len(s.payload.as_value())))]
        for s in (ndr, drs, touch):
            m.d.comb += s.ready.eq(AnySeq(1))
        for r in (dut.hdm_commit, dut.hdm_base, dut.hdm_size, dut.hdm_ig, dut.hdm_iw, dut.hdm_pos):
            m.d.comb += r.eq(AnyConst(len(r)))

        pend, touched = Signal(), Signal()
        kind = Signal(2)
        tag, ld_id = Signal(16), Signal(4)
        wait = Signal(range(self.MAX_WAIT + 2))
        req_fire, rwd_fire = req.valid & req.ready, rwd.valid & rwd.ready
        ndr_fire, drs_fire = ndr.valid & ndr.ready, drs.valid & drs.ready
        op = req.payload.opcode
        is_read = (op == cxl.M2SReqOpcode.MEM_RD) | (op == cxl.M2SReqOpcode.MEM_RD_DATA)
        owed = Mux(is_read, self.DRS, Mux(op == cxl.M2SReqOpcode.MEM_SPEC_RD, self.NONE, self.NDR))
        m.d.comb += Assert(~(req_fire & rwd_fire))
        m.d.comb += Assert(~(ndr_fire & drs_fire))
        # None invented: a response answers the one message owed it, with its tag.
        for fire, k, p in ((ndr_fire, self.NDR, ndr.payload), (drs_fire, self.DRS, drs.payload)):
            with m.If(fire):
                m.d.comb += Assert(pend & (kind == k) & (p.tag == tag) & (p.ld_id == ld_id))
                m.d.sync += pend.eq(0)
        m.d.comb += Assert(~ndr.valid | (ndr.payload.opcode == cxl.S2MNDROpcode.CMP))
        # Only a read touches its entry, and once.
        with m.If(touch.valid & touch.ready):
            m.d.comb += Assert(pend & (kind != self.NDR) & ~touched)
            m.d.sync += touched.eq(1)
        # Bounded response: the owed response comes within MAX_WAIT cycles not stalled
        # by the touch stream.
        owing = pend & (kind != self.NONE)
        with m.If(owing & ~ndr.valid & ~drs.valid & ~(touch.valid & ~touch.ready)):
            m.d.sync += wait.eq(wait + 1)
        m.d.comb += Assert(wait <= self.MAX_WAIT)
        # None lost: a new message is taken only once the last one is answered.
        with m.If(req_fire | rwd_fire):
            m.d.comb += Assert(~owing)
            m.d.sync += [
                pend.eq(1),
                touched.eq(0),
                wait.eq(0),
                kind.eq(Mux(rwd_fire, self.NDR, owed)),
                tag.eq(Mux(rwd_fire, rwd.payload.tag, req.payload.tag)),
                ld_id.eq(Mux(rwd_fire, rwd.payload.ld_id, req.payload.ld_id)),
            ]
        # Stream rule on every output: a stalled beat stays, unchanged.
        for name, s in (("ndr", ndr), ("drs", drs), ("touch", touch)):
            past.hold(s, name)
        return m


class HdmHarness(Elaboratable):
    """The RTL decoder equals a reference written here with ``//`` and ``%`` from the
    decoder parameters of :mod:`kvcxl.cxl.hdm` (the ones the emulator's
    ``HdmDecoderSet.translate`` uses), over every address and every legal programming."""

    def __init__(self, defect: str | None = None):
        self.dut = HdmDecode(defect=defect)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        for r in (dut.hpa, dut.commit, dut.base, dut.size, dut.ig, dut.iw, dut.pos):
            m.d.comb += r.eq(AnyConst(len(r)))
        # The programming HdmDecoderSet.program accepts.
        m.d.comb += [
            Assume(dut.ig < len(hdm.GRANULARITIES)),
            Assume(dut.iw < len(hdm.WAYS)),
            Assume(dut.size != 0),
            Assume(dut.base + dut.size <= (1 << (HPA_BITS - hdm.GRANULE_SHIFT))),
        ]
        base = dut.base * hdm.GRANULE
        end = (dut.base + dut.size) * hdm.GRANULE
        off = Signal(HPA_BITS)
        m.d.comb += off.eq(dut.hpa - base)
        way, dpa = Signal(hdm.POSITION_BITS), Signal(HPA_BITS)
        for ig, gran in enumerate(hdm.GRANULARITIES):
            for iw, ways in enumerate(hdm.WAYS):
                with m.If((dut.ig == ig) & (dut.iw == iw)):
                    m.d.comb += [
                        Assume(dut.pos < ways),
                        Assume(dut.size % ways == 0),
                        way.eq((off // gran) % ways),
                        dpa.eq((off // (gran * ways)) * gran + off % gran),
                    ]
        hit = dut.commit & (dut.hpa >= base) & (dut.hpa < end) & (way == dut.pos)
        m.d.comb += Assert(dut.hit == hit)
        with m.If(hit):
            m.d.comb += Assert(dut.dpa == dpa)
        return m


class SlotQueueHarness(Elaboratable):
    """CLOCK / SIEVE under free host commands and free back-pressure on ``victim``.

    The reference is the golden step's definition (:mod:`kvcxl.firmware.golden_clock`,
    which is the firmware's :mod:`~kvcxl.firmware.policies.clock` and
    :mod:`~kvcxl.firmware.policies.sieve` as commands), kept by the harness from the
    commands it sees and written without the engine's links: per slot in the queue,
    offered, counter, fresh, and a queue position (a sequence number given at INSERT and
    at a CLOCK move to the head: the tail is the smallest, the head the largest, a slot's
    next newer the smallest above its own), plus SIEVE's hand.  Every decision the walk
    reports on its ``visit`` tap is compared with it:

    * where: each look is at the slot the golden walk looks at next, so the hand
      advances one slot per look, in queue order, and wraps from the head to the tail
      (CLOCK starts at the tail; SIEVE at its hand, the tail when it has none or its slot
      left; CLOCK looks again at a head it decremented in place, since it stays the head;
      a victim's or a stepped-over slot's successor is its next newer slot);
    * what: a slot stepped over is in the queue and not offered; a counter taken down
      (a visited bit cleared) is offered and above 0, and the copy takes it down by one
      (CLOCK) or to 0 (SIEVE), so a counter the engine changes otherwise shows up at the
      next look; a victim is in the queue, offered (resident and unpinned) and at 0;
    * the hand: SIEVE's stops after the last victim of a walk without ``keep``, and a
      REMOVE of its slot moves it to the next newer one, as the golden step's does;
    * the stream: a walk hands over exactly min(k, offered) victims, the slots it
      evicted, ``last`` on the final one, an ``empty`` beat when k or offered is 0; no
      command is taken while a walk is open; the victim beat holds while stalled.

    The host's one rule is assumed: INSERT names a slot not in the queue.  The
    sequence numbers are 6 bits: at most one is given per cycle, so they do not wrap
    within a bound below 63."""

    SEQ_BITS = 6

    def __init__(self, policy: str, slots: int = 2, defect: str | None = None):
        self.ref_bits = 2 if policy == "clock" else 1
        self.dut = SlotQueueEngine(slots, policy, ref_bits=self.ref_bits, defect=defect)
        self.policy, self.slots = policy, slots

    def elaborate(self, platform):
        from kvcxl.firmware.golden_clock import Op

        from . import layouts as L

        m, dut, past = _start(self.dut)
        n, clock = self.slots, self.policy == "clock"
        cmd, v, tap = dut.cmd, dut.victim, dut.visit
        m.d.comb += [
            cmd.valid.eq(AnySeq(1)),
            cmd.payload.eq(AnySeq(len(cmd.payload.as_value()))),
            v.ready.eq(AnySeq(1)),
            dut.ref_max.eq(AnyConst(self.ref_bits)),
            Assume(dut.ref_max >= 1),
            Assume(cmd.payload.slot < n),
        ]
        inq = [Signal(name=f"inq{i}") for i in range(n)]
        off = [Signal(name=f"off{i}") for i in range(n)]
        fresh = [Signal(name=f"fresh{i}") for i in range(n)]
        ref = [Signal(self.ref_bits, name=f"ref{i}") for i in range(n)]
        pos = [Signal(self.SEQ_BITS, name=f"pos{i}") for i in range(n)]
        seq = Signal(self.SEQ_BITS)
        NONE = n  # no slot: the hand at the tail, or the next look wraps to the tail

        def newer(t):
            """The next newer slot of ``t`` in the queue (NONE past the head)."""
            best, best_pos = Const(NONE, range(n + 1)), Const(0, self.SEQ_BITS)
            t_pos = Array(pos)[t]
            for j in range(n):
                later = inq[j] & (j != t) & (pos[j] > t_pos)
                take = later & ((best == NONE) | (pos[j] < best_pos))
                best, best_pos = Mux(take, j, best), Mux(take, pos[j], best_pos)
            return best

        def end(oldest: bool):
            """The tail (``oldest``) or the head of the queue (NONE when it is empty)."""
            best, best_pos = Const(NONE, range(n + 1)), Const(0, self.SEQ_BITS)
            for j in range(n):
                better = (pos[j] < best_pos) if oldest else (pos[j] > best_pos)
                take = inq[j] & ((best == NONE) | better)
                best, best_pos = Mux(take, j, best), Mux(take, pos[j], best_pos)
            return best

        tail, head = Signal(range(n + 1)), Signal(range(n + 1))
        m.d.comb += [tail.eq(end(True)), head.eq(end(False))]
        hand = Signal(range(n + 1), init=NONE)
        look = Signal(range(n + 1))  # where the walk looks next (NONE: the tail)
        found = Signal(range(n + 1))  # victims the walk has still to find
        keep = Signal()

        c = cmd.payload
        fire = cmd.valid & cmd.ready
        for i in range(n):
            with m.If(c.slot == i):
                with m.If(cmd.valid & (c.op == Op.INSERT)):
                    m.d.comb += Assume(~inq[i])
                with m.If(fire):
                    with m.Switch(c.op):
                        with m.Case(Op.INSERT):
                            m.d.sync += [inq[i].eq(1), off[i].eq(0), ref[i].eq(0), fresh[i].eq(1)]
                            m.d.sync += [pos[i].eq(seq), seq.eq(seq + 1)]
                        with _copy_entry_cases(m, dut, i, inq[i], inq[i], off, ref, fresh):
                            with m.If(inq[i] & (hand == i)):  # REMOVE: the hand moves on
                                m.d.sync += hand.eq(newer(i))
        # Every decision of the walk against the harness's copy.
        last_skip = Signal(range(n + 1), init=n)  # the slot just stepped over (n: none)
        last_victim = Signal(range(n))
        with m.If(tap.valid):
            t, kind = tap.payload.slot, tap.payload.kind
            m.d.comb += Assert(t < n)
            m.d.comb += Assert(t != last_skip)  # the hand advances past what it may not take
            m.d.comb += Assert(t == Mux(look == NONE, tail, look))  # the golden walk's look
            m.d.sync += last_skip.eq(Mux(kind == L.VISIT_SKIP, t, n))
            m.d.sync += look.eq(newer(t))
            for i in range(n):
                with m.If(t == i):
                    m.d.comb += Assert(inq[i])
                    with m.Switch(kind):
                        with m.Case(L.VISIT_SKIP):
                            m.d.comb += Assert(~off[i])
                        with m.Case(L.VISIT_DECREMENT):
                            m.d.comb += Assert(off[i] & (ref[i] != 0))
                            m.d.sync += ref[i].eq(ref[i] - 1 if clock else 0)
                            if clock:  # to the head, or looked at again if it is the head
                                with m.If(head == i):
                                    m.d.sync += look.eq(i)
                                with m.Else():
                                    m.d.sync += [pos[i].eq(seq), seq.eq(seq + 1)]
                        with m.Case(L.VISIT_VICTIM):
                            m.d.comb += Assert(off[i] & (ref[i] == 0))  # resident, unpinned
                            m.d.sync += [inq[i].eq(0), off[i].eq(0), last_victim.eq(i)]
                            m.d.sync += found.eq(found - 1)
                            if not clock:
                                with m.If((found == 1) & ~keep):
                                    m.d.sync += hand.eq(newer(i))
                        with m.Default():
                            m.d.comb += Assert(0)
        kk = _walk_stream(m, past, dut, sum(off[i] for i in range(n)), last_victim)
        with m.If(fire & (c.op == Op.WALK)):
            start = tail if clock else Mux(Array([*inq, Const(0)])[hand], hand, NONE)
            m.d.sync += [found.eq(kk), keep.eq(c.keep), look.eq(start)]
        return m


class S3FifoHarness(Elaboratable):
    """S3-FIFO under free host commands (its four parameters SET at any time) and free
    back-pressure on ``victim``.

    The harness keeps its own copy, from the commands and the engine's taps, of what the
    golden step (:mod:`kvcxl.firmware.golden_s3fifo`) defines: per slot its queue, offered,
    fresh, counter and entry id; per id whether the ghost holds it, in which order
    (sequence numbers: the oldest has the smallest) and its ``back`` bit; the parameters
    and whether a walk has asked for a victim.  Against it:

    * a victim is in a queue and offered (resident, unpinned): at 0 in main, below the
      threshold in small; a small victim's id enters the copy's ghost, which drops its
      oldest id past the ghost's length;
    * a cursor advances: no slot is stepped over twice in a row, and a slot stepped over
      is in a queue and not offered;
    * counters change as the rule says: main's move is of an offered slot above 0 and
      leaves min(counter, 3) − 1, small's move to main of one at or above the threshold
      leaves 0 (a counter the engine changes otherwise shows at its next look);
    * a ghost hit enters main: each INSERT's queue (the ``placed`` tap) is main exactly
      when the id's ``back`` bit is set or no walk has asked for a victim and small holds
      ``small_full`` or more;
    * the walk's stream, as CLOCK's and SIEVE's (:func:`_walk_stream`).

    The host's rules are assumed: INSERT names a slot in no queue and an id no queued slot
    holds; ids below ``ids``.  Sequence numbers are 6 bits (one per cycle at most)."""

    SEQ_BITS = 6
    SHAPE = {"slots": 2, "ids": 2, "ref_bits": 2}  # counters to 3: main's cap

    def __init__(self, defect: str | None = None):
        self.dut = S3FifoEngine(**self.SHAPE, defect=defect)

    def elaborate(self, platform):
        from kvcxl.firmware import golden_s3fifo as gs
        from kvcxl.firmware.policies.s3fifo import MAIN_CAP

        from . import layouts as L

        m, dut, past = _start(self.dut)
        n, ids, Op, P, SMALL, MAIN = dut.slots, dut.ids, gs.Op, gs.Param, gs.SMALL, gs.MAIN
        cmd, tap, c = dut.cmd, dut.visit, dut.cmd.payload
        fire = cmd.valid & cmd.ready
        m.d.comb += [
            cmd.valid.eq(AnySeq(1)),
            c.eq(AnySeq(len(c.as_value()))),
            dut.victim.ready.eq(AnySeq(1)),
            dut.ref_max.eq(AnyConst(dut.ref_bits)),
            Assume(dut.ref_max >= 1),
            Assume(c.slot < Mux(c.op == Op.SET, len(P), n)),
            Assume(((c.op != Op.ADMIT) & (c.op != Op.INSERT)) | (c.arg < ids)),
        ]
        q = [Signal(2, name=f"q{i}") for i in range(n)]
        off = [Signal(name=f"off{i}") for i in range(n)]
        fresh = [Signal(name=f"fresh{i}") for i in range(n)]
        ref = [Signal(dut.ref_bits, name=f"ref{i}") for i in range(n)]
        idn = [Signal(range(ids), name=f"id{i}") for i in range(n)]
        member = [Signal(name=f"member{j}") for j in range(ids)]
        back = [Signal(name=f"back{j}") for j in range(ids)]
        gpos = [Signal(self.SEQ_BITS, name=f"gpos{j}") for j in range(ids)]
        gseq = Signal(self.SEQ_BITS)
        par = {p: Signal.like(c.arg, name=f"par_{p.name.lower()}") for p in P}
        evicted = Signal()
        n_small = sum(q[i] == SMALL for i in range(n))
        n_ghost = sum(member)
        oldest, oldest_pos = Const(ids, range(ids + 1)), Const(0, self.SEQ_BITS)
        for j in range(ids):
            take = member[j] & ((oldest == ids) | (gpos[j] < oldest_pos))
            oldest, oldest_pos = Mux(take, j, oldest), Mux(take, gpos[j], oldest_pos)

        with m.If(cmd.valid & (c.op == Op.INSERT)):  # the host's rule
            for i in range(n):
                m.d.comb += Assume((q[i] == 0) | ((c.slot != i) & (idn[i] != c.arg)))
        with m.If(fire):
            with m.Switch(c.op):
                with m.Case(Op.SET):
                    for p in P:
                        with m.If(c.slot == p):
                            m.d.sync += par[p].eq(c.arg)
                with m.Case(Op.ADMIT):
                    for j in range(ids):
                        with m.If(c.arg == j):
                            m.d.sync += [back[j].eq(member[j]), member[j].eq(0)]
                with m.Case(Op.WALK):
                    m.d.sync += evicted.eq(evicted | (c.arg != 0))
        # Each INSERT's queue, decided when the command is taken; the engine places the
        # slot once it has read the id's ghost words, at the latest in the cycle it takes
        # another command.
        warm = ~evicted & (n_small >= par[P.SMALL_FULL])
        to_main = Array(back)[c.arg] | warm
        placing, want_main = Signal(), Signal()
        with m.If(dut.placed.valid):
            m.d.comb += Assert(placing & (dut.placed.main == want_main))
            m.d.sync += placing.eq(0)
        with m.If(fire & (c.op == Op.INSERT)):
            m.d.sync += [placing.eq(1), want_main.eq(to_main)]
        m.d.comb += Assert(~(fire & placing & ~dut.placed.valid))
        for i in range(n):
            with m.If(fire & (c.slot == i)):
                with m.Switch(c.op):
                    with m.Case(Op.INSERT):
                        m.d.sync += [q[i].eq(Mux(to_main, MAIN, SMALL)), off[i].eq(0)]
                        m.d.sync += [ref[i].eq(0), fresh[i].eq(1), idn[i].eq(c.arg)]
                    with _copy_entry_cases(m, dut, i, q[i], q[i] != 0, off, ref, fresh):
                        pass
        # Every decision of the walk against the copy.
        last_skip = Signal(range(n + 1), init=n)  # the slot just stepped over (n: none)
        last_victim = Signal(range(n))
        with m.If(tap.valid):
            t, kind = tap.payload.slot, tap.payload.kind
            m.d.comb += [Assert(t < n), Assert(t != last_skip)]
            m.d.sync += last_skip.eq(Mux(kind == L.VISIT_SKIP, t, n))
            for i in range(n):
                with m.If(t == i):
                    with m.Switch(kind):
                        with m.Case(L.VISIT_SKIP):
                            m.d.comb += Assert((q[i] != 0) & ~off[i])
                        with m.Case(L.VISIT_DECREMENT):
                            m.d.comb += Assert((q[i] == MAIN) & off[i] & (ref[i] != 0))
                            capped = Mux(ref[i] > MAIN_CAP, MAIN_CAP, ref[i])
                            m.d.sync += ref[i].eq(capped - 1)
                        with m.Case(L.VISIT_PROMOTE):
                            m.d.comb += Assert((q[i] == SMALL) & off[i])
                            m.d.comb += Assert(ref[i] >= par[P.THRESHOLD])
                            m.d.sync += [q[i].eq(MAIN), ref[i].eq(0)]
                        with m.Case(L.VISIT_VICTIM):
                            m.d.comb += Assert((q[i] != 0) & off[i])  # resident, unpinned
                            low = Mux(q[i] == MAIN, ref[i] == 0, ref[i] < par[P.THRESHOLD])
                            m.d.comb += Assert(low)
                            m.d.sync += [q[i].eq(0), off[i].eq(0), last_victim.eq(i)]
                            with m.If((q[i] == SMALL) & (par[P.GHOST_LEN] != 0)):
                                self._ghost_push(m, idn[i], member, gpos, gseq, oldest,
                                                 n_ghost + 1 > par[P.GHOST_LEN])  # fmt: skip
        _walk_stream(m, past, dut, sum(off), last_victim)
        return m

    @staticmethod
    def _ghost_push(m, i, member, gpos, gseq, oldest, over) -> None:
        """Id ``i`` enters the copy's ghost (one there keeps its place); ``over``: its
        oldest id leaves."""
        for j in range(len(member)):
            with m.If((i == j) & ~member[j]):
                m.d.sync += [member[j].eq(1), gpos[j].eq(gseq), gseq.eq(gseq + 1)]
                with m.If(over):
                    for k in range(len(member)):
                        with m.If(oldest == k):
                            m.d.sync += member[k].eq(0)


@contextmanager
def _copy_entry_cases(m: Module, dut, i: int, place: Signal, queued, off, ref, fresh):
    """A harness copy's TOUCH, RESET, OFFER and REMOVE of slot ``i``, as ``Case``s of a
    ``Switch`` on the command (golden_clock's rules, every slot-queue engine's): ``place``
    is where the copy has the slot (0: in no queue), ``queued`` whether it is in one; the
    body runs inside REMOVE's case."""
    from kvcxl.firmware.golden_clock import Op

    with m.Case(Op.TOUCH):
        with m.If(fresh[i]):
            m.d.sync += fresh[i].eq(0)
        with m.Elif(ref[i] < dut.ref_max):
            m.d.sync += ref[i].eq(ref[i] + 1)
        with m.Else():
            m.d.sync += ref[i].eq(dut.ref_max)
    with m.Case(Op.RESET):
        m.d.sync += [ref[i].eq(0), fresh[i].eq(0)]
    with m.Case(Op.OFFER):
        m.d.sync += off[i].eq(dut.cmd.payload.arg[0] & queued)
    with m.Case(Op.REMOVE):
        m.d.sync += [place.eq(0), off[i].eq(0)]
        yield


def _walk_stream(m: Module, past: _Past, dut, offered, last_victim: Signal):
    """A slot-queue engine's walks as streams: a WALK hands over exactly min(k, offered)
    victims (``kk``, returned), each the slot its tap last evicted (``last_victim``),
    ``last`` on the final one and an ``empty`` beat when there are none; no command and
    no tap outside a walk; the victim beat holds while stalled."""
    from kvcxl.firmware.golden_clock import Op

    cmd, v, c = dut.cmd, dut.victim, dut.cmd.payload
    fire = cmd.valid & cmd.ready
    want, got = Signal.like(c.arg, name="want"), Signal.like(c.arg, name="got")
    walking = Signal()
    kk = Mux(c.arg < offered, c.arg, offered)
    with m.If(fire & (c.op == Op.WALK)):
        m.d.sync += [want.eq(kk), got.eq(0), walking.eq(1)]
    m.d.comb += Assert(~(fire & walking))  # no command while a walk is open
    m.d.comb += Assert(~dut.visit.valid | walking)
    with m.If(v.valid):
        m.d.comb += Assert(walking)
        with m.If(v.payload.empty):
            m.d.comb += Assert(v.payload.last & (want == 0))
        with m.Else():
            m.d.comb += [
                Assert(v.payload.index == last_victim),
                Assert(got < want),
                Assert(v.payload.last == (got + 1 == want)),
            ]
        with m.If(v.ready):
            m.d.sync += got.eq(got + 1)
            with m.If(v.payload.last):
                m.d.sync += walking.eq(0)
    past.hold(v, "v")
    return kk


class TierBoundaryHarness(Elaboratable):
    """The managed tiers' step boundary under any sweep of (score, tier) records, any
    threshold at each beat, any budget and rooms, and free back-pressure on ``move``.

    The reference is :func:`kvcxl.firmware.tiering.background_plan` as the engine's
    docstring states it for one sweep (``plan_sweep``): a CXL DRAM entry sinks when its
    score is below the threshold T read with its beat, an NVMe entry rises when it is at
    or above T; with B, D, U the budget, ``down_room`` and ``up_room`` taken with the last
    beat, the plan is n_down = min(B, D, sinks) downs, lowest score first (ties lower
    id), then n_up = min(B − n_down, U + n_down, rises) ups, highest first (ties lower
    id).  The harness keeps every entry's score, sink and rise from the beats it sees
    and checks each move of the plan: a down is a sink, an up a rise, its reported score
    is the entry's, no entry moves twice, no down follows an up, each move is the best
    one left (no unmoved sink ranks before a down, no unmoved rise before an up: lowest
    first, highest first), ``last`` exactly on the move that completes n_down downs and
    n_up ups (so at most B moves in all), one ``empty`` beat when the plan is empty, no
    move before the sweep's last beat, and the move beat holds while stalled.
    The sweep arrives in address order, as the host sends it."""

    SHAPE = {"entries": 4, "lanes": 2, "batch": 2, "q_bits": 2}  # the reduced widths

    def __init__(self, defect: str | None = None):
        self.entries, self.lanes, self.batch, self.q_bits = self.SHAPE.values()
        self.dut = TierBoundary(**self.SHAPE, defect=defect)

    def elaborate(self, platform):
        from kvcxl.firmware.formulas import TIER_CXL, TIER_NVME

        m, dut, past = _start(self.dut)
        n, lanes, K = self.entries, self.lanes, self.batch
        groups = n // lanes
        cand, mv = dut.cand, dut.move
        m.d.comb += [
            cand.valid.eq(AnySeq(1)),
            cand.payload.eq(AnySeq(len(cand.payload.as_value()))),
            mv.ready.eq(AnySeq(1)),
            dut.threshold.eq(AnySeq(len(dut.threshold))),
            dut.budget.eq(AnySeq(len(dut.budget))),
            dut.down_room.eq(AnySeq(len(dut.down_room))),
            dut.up_room.eq(AnySeq(len(dut.up_room))),
            Assume(dut.threshold <= (1 << self.q_bits)),
            Assume(dut.budget <= K),
            Assume(dut.down_room <= K),
            Assume(dut.up_room <= K),
        ]
        addr = Signal(dut.addr_bits)
        m.d.comb += [
            Assume(cand.payload.addr == addr),
            Assume(cand.payload.last == (addr == groups - 1)),
        ]
        took = cand.valid & cand.ready
        with m.If(took):
            m.d.sync += addr.eq(Mux(addr == groups - 1, 0, addr + 1))

        score = [Signal(self.q_bits, name=f"score{e}") for e in range(n)]
        sink = [Signal(name=f"sink{e}") for e in range(n)]
        rise = [Signal(name=f"rise{e}") for e in range(n)]
        moved = [Signal(name=f"moved{e}") for e in range(n)]
        budget, d_room, u_room = (Signal(range(K + 1), name=x) for x in ("B", "D", "U"))
        planning = Signal()  # the sweep's last beat is in; the plan has not ended
        t = dut.threshold
        with m.If(took):
            m.d.comb += Assert(~planning)
            for a in range(groups):
                with m.If(cand.payload.addr == a):
                    for i in range(lanes):
                        ln, e = cand.payload.lane[i], a * lanes + i
                        m.d.sync += [
                            score[e].eq(ln.score),
                            sink[e].eq((ln.tier == TIER_CXL) & (ln.score < t)),
                            rise[e].eq((ln.tier == TIER_NVME) & (ln.score >= t)),
                            moved[e].eq(0),
                        ]
            with m.If(cand.payload.last):
                m.d.sync += [
                    planning.eq(1),
                    budget.eq(dut.budget),
                    d_room.eq(dut.down_room),
                    u_room.eq(dut.up_room),
                ]

        def smin(a, b):
            return Mux(a < b, a, b)

        sinks = sum(sink[e] for e in range(n))
        rises = sum(rise[e] for e in range(n))
        n_down, n_up = Signal(range(K + 1)), Signal(range(K + 1))
        m.d.comb += [
            n_down.eq(smin(smin(budget, d_room), sinks)),
            n_up.eq(smin(smin(budget - n_down, u_room + n_down), rises)),
        ]
        downs, ups = Signal(range(2 * K + 2)), Signal(range(2 * K + 2))
        p = mv.payload
        fire = mv.valid & mv.ready
        with m.If(mv.valid):
            m.d.comb += Assert(planning)
            with m.If(p.empty):
                m.d.comb += Assert(p.last & (n_down == 0) & (n_up == 0))
            with m.Else():
                m.d.comb += Assert(p.index < n)
                for e in range(n):
                    with m.If(p.index == e):
                        m.d.comb += [Assert(~moved[e]), Assert(p.score == score[e])]
                        for f in range(n):
                            if f == e:
                                continue
                            before_down = (score[f] < score[e]) | ((score[f] == score[e]) & (f < e))
                            before_up = (score[f] > score[e]) | ((score[f] == score[e]) & (f < e))
                            with m.If(p.up):
                                m.d.comb += Assert(~(rise[f] & ~moved[f] & before_up))
                            with m.Else():
                                m.d.comb += Assert(~(sink[f] & ~moved[f] & before_down))
                        m.d.comb += Assert(Mux(p.up, rise[e], sink[e]))
                with m.If(p.up):
                    m.d.comb += [
                        Assert(downs == n_down),
                        Assert(ups < n_up),
                        Assert(p.last == (ups + 1 == n_up)),
                    ]
                with m.Else():
                    m.d.comb += [
                        Assert(ups == 0),
                        Assert(downs < n_down),
                        Assert(p.last == ((downs + 1 == n_down) & (n_up == 0))),
                    ]
        with m.If(fire):
            with m.If(~p.empty):
                for e in range(n):
                    with m.If(p.index == e):
                        m.d.sync += moved[e].eq(1)
                with m.If(p.up):
                    m.d.sync += ups.eq(ups + 1)
                with m.Else():
                    m.d.sync += downs.eq(downs + 1)
            with m.If(p.last):
                m.d.sync += [planning.eq(0), downs.eq(0), ups.eq(0)]
        past.hold(mv, "m")
        return m


class RecordStreamHarness(Elaboratable):
    """The record-stream engine's memory traffic under a memory of any latency and any
    back-pressure (every ready of the memory port and of ``victim`` free each cycle, read
    data free whenever a word is owed), free ``step`` / ``upd`` beats and parameters.

    The reference is the engine's contract (its module docstring): a sweep reads every
    record word once, in address order, and an update sweep writes each back, once, to
    the address it was read from, while a ``hold`` sweep writes nothing.  The harness
    plays the memory (a read command owes its ``len`` words, answered in order; write
    commands and write data are taken in any order, data before its command too, as AXI
    allows; the n-th word read or written in a sweep is at address n, given the commands'
    addresses it checks) and keeps each word's ``pinned`` / ``resident`` flags as read (the
    datapath passes them through unchanged; the scores go through the Q0.16 products,
    which the simulation tests check bit-exactly).  Checked: read and write commands
    cover the words 0 … W−1 in order, bursts of 1 … ``burst`` words, never past the end,
    and a ``hold`` sweep issues no write command or data; a word is written back only
    after it is read, with the flags it was read with, and a beat goes to the selector
    only after its word is read, at that word's address, ``last`` on the final one, its
    ``eligible`` = resident ∧ ¬pinned of that word; when a sweep ends (``busy`` falls),
    it read, scored and (update sweeps) wrote exactly W words and took write commands
    for exactly W: none lost, none duplicated, none left unsent; ``rd_cmd``, ``wr_cmd``
    and ``wr_data`` hold valid and payload while stalled."""

    SHAPE = {"entries": 4, "lanes": 1, "batch": 1, "burst": 2}  # 4 words, 2 bursts

    def __init__(self, defect: str | None = None):
        self.dut = RecordStreamEngine(**self.SHAPE, defect=defect)

    def elaborate(self, platform):
        m, dut, past = _start(self.dut)
        W, lanes, burst = dut.words, dut.lanes, dut.burst
        rd_cmd, rd, wr_cmd, wr, sel = dut.rd_cmd, dut.rd_data, dut.wr_cmd, dut.wr_data, dut.select
        for s in (dut.step, dut.upd, rd):
            m.d.comb += [s.valid.eq(AnySeq(1)), s.payload.eq(AnySeq(len(s.payload.as_value())))]
        for s in (rd_cmd, wr_cmd, wr, dut.victim):
            m.d.comb += s.ready.eq(AnySeq(1))
        m.d.comb += dut.table_w.valid.eq(0)  # the decay tables are not under check here
        for x in (dut.alpha, dut.touch, dut.shift, dut.k):
            m.d.comb += x.eq(AnySeq(len(x)))

        cnt = range(W + burst + 1)
        rd_cmds, rd_got, wr_cmds, wr_sent, scored = (
            Signal(cnt, name=x) for x in ("rd_cmds", "rd_got", "wr_cmds", "wr_sent", "scored")
        )
        hold = Signal()
        pinned = [Signal(lanes, name=f"pinned{a}") for a in range(W)]
        resident = [Signal(lanes, name=f"resident{a}") for a in range(W)]
        # The memory answers only words it owes; it takes write commands and write data
        # in any order (both readies free), so a sweep must not end with commands unsent.
        m.d.comb += Assume(~rd.valid | (rd_got < rd_cmds))
        with m.If(dut.step.valid & dut.step.ready):
            m.d.comb += Assert(~dut.busy)
            m.d.sync += [rd_cmds.eq(0), rd_got.eq(0), wr_cmds.eq(0), wr_sent.eq(0),
                         scored.eq(0), hold.eq(dut.step.payload.hold)]  # fmt: skip
        for port, issued, name in ((rd_cmd, rd_cmds, "rd"), (wr_cmd, wr_cmds, "wr")):
            c = port.payload
            with m.If(port.valid):
                m.d.comb += [
                    Assert(dut.busy),
                    Assert(c.addr == issued),
                    Assert((c.len >= 1) & (c.len <= burst)),
                    Assert(issued + c.len <= W),
                ]
                if name == "wr":
                    m.d.comb += Assert(~hold)
            with m.If(port.valid & port.ready):
                m.d.sync += issued.eq(issued + c.len)
        with m.If(rd.valid & rd.ready):
            for a in range(W):
                with m.If(rd_got == a):
                    m.d.sync += [
                        pinned[a].eq(Cat(r.pinned for r in rd.payload)),
                        resident[a].eq(Cat(r.resident for r in rd.payload)),
                    ]
            m.d.sync += rd_got.eq(rd_got + 1)
        with m.If(wr.valid):
            m.d.comb += [Assert(~hold), Assert(wr_sent < rd_got)]
            for a in range(W):
                with m.If(wr_sent == a):
                    m.d.comb += [
                        Assert(Cat(r.pinned for r in wr.payload) == pinned[a]),
                        Assert(Cat(r.resident for r in wr.payload) == resident[a]),
                    ]
        with m.If(wr.valid & wr.ready):
            m.d.sync += wr_sent.eq(wr_sent + 1)
        c = sel.cand
        with m.If(c.valid):
            m.d.comb += [
                Assert(scored < rd_got),
                Assert(c.payload.addr == scored),
                Assert(c.payload.last == (scored == W - 1)),
            ]
            for a in range(W):
                with m.If(scored == a):
                    for i in range(lanes):
                        ok = resident[a][i] & ~pinned[a][i]
                        m.d.comb += Assert(c.payload.lane[i].eligible == ok)
        with m.If(c.valid & c.ready):
            m.d.sync += scored.eq(scored + 1)
        # A sweep's end: every word read, scored and (update) written, once.
        with m.If(past.valid & past(dut.busy, "busy") & ~dut.busy):
            m.d.comb += [
                Assert(rd_cmds == W),
                Assert(rd_got == W),
                Assert(scored == W),
                Assert(wr_sent == Mux(hold, 0, W)),
                Assert(wr_cmds == Mux(hold, 0, W)),
            ]
        for name, s in (("rd_cmd", rd_cmd), ("wr_cmd", wr_cmd), ("wr", wr)):
            past.hold(s, name)
        return m


def _start(dut) -> tuple[Module, Elaboratable, _Past]:
    """A harness's module around ``dut``, reset held low, with its past-value registers."""
    m = Module()
    _no_reset(m)
    m.submodules.dut = dut
    return m, dut, _Past(m)


def _no_reset(m: Module) -> None:
    # Registers start from their init values; a free reset input would restart the DUT
    # mid-pass behind the checker's back.
    m.d.comb += Assume(~ResetSignal("sync"))


def _harness(check: str, defect: str | None):
    if check not in CHECKS:
        raise ValueError(f"check = {check!r}: must be one of {CHECKS}")
    if defect is not None and DEFECTS.get(defect) != check:
        raise ValueError(
            f"defect = {defect!r}: the {check} check takes "
            f"{[d for d, c in DEFECTS.items() if c == check]}"
        )
    return HARNESSES[check](defect)


def _eviction_harness(defect: str | None):
    h = EvictionHarness(defect=defect)
    params = {"entries": h.entries, "lanes": h.lanes, "batch": h.batch, "q_bits": h.q_bits}
    return h, {**params, "defect": defect}, 14


def _eviction_1lane_harness(defect: str | None):
    # One lane: the systolic top-k and its drain (batch 3: two drain cycles).
    h = EvictionHarness(lanes=1, batch=3, defect=defect)
    params = {"entries": h.entries, "lanes": h.lanes, "batch": h.batch, "q_bits": h.q_bits}
    return h, {**params, "defect": defect}, 14


def _scoring_harness(defect: str | None):
    h = ScoringHarness(defect=defect)
    return h, {"entries": h.entries, "lanes": h.lanes, "defect": defect}, 12


def _frontend_harness(defect: str | None):
    h = FrontEndHarness(defect=defect)
    return h, {"lines": h.lines, "defect": defect}, 10


def _hdm_harness(defect: str | None):
    return HdmHarness(defect=defect), {"hpa_bits": HPA_BITS, "defect": defect}, 1


def _slot_harness(policy: str, depth: int):
    def make(defect: str | None):
        h = SlotQueueHarness(policy, defect=defect)
        return h, {"slots": h.slots, "ref_bits": h.ref_bits, "defect": defect}, depth

    return make


def _s3fifo_harness(defect: str | None):
    return S3FifoHarness(defect), {**S3FifoHarness.SHAPE, "defect": defect}, 15


def _tier_boundary_harness(defect: str | None):
    return TierBoundaryHarness(defect), {**TierBoundaryHarness.SHAPE, "defect": defect}, 12


def _record_stream_harness(defect: str | None):
    return RecordStreamHarness(defect), {**RecordStreamHarness.SHAPE, "defect": defect}, 18


# The harness of each check a design's registry entry names: (harness, params, default depth).
HARNESSES = {
    "clock": _slot_harness("clock", 14),
    "sieve": _slot_harness("sieve", 15),
    "s3fifo": _s3fifo_harness,
    "tier_boundary": _tier_boundary_harness,
    "record_stream": _record_stream_harness,
    "eviction": _eviction_harness,
    "eviction_1lane": _eviction_1lane_harness,
    "scoring": _scoring_harness,
    "frontend": _frontend_harness,
    "hdm": _hdm_harness,
}


def run(
    check: str, *, depth: int | None = None, defect: str | None = None, workdir: Path | None = None
) -> FormalResult:
    """Run one bounded check; returns PASS / FAIL (a counterexample) / ERROR."""

    toolchain.require("yowasp-sby", "yices-smt2")
    h, params, default_depth = _harness(check, defect)
    depth = depth or default_depth
    il = rtlil.convert(h, ports=[])
    sby = f"""[options]
mode bmc
depth {depth}
multiclock off

[engines]
smtbmc yices

[script]
read_rtlil design.il
prep -top top

[files]
design.il
"""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        d = Path(tmp)
        (d / "design.il").write_text(il)
        (d / f"{check}.sby").write_text(sby)
        t0 = time.perf_counter()
        proc = subprocess.run(
            ["yowasp-sby", "-f", f"{check}.sby"],
            cwd=d,
            env=toolchain.tool_env(),
            capture_output=True,
            text=True,
        )
        dt = time.perf_counter() - t0
        out = proc.stdout + proc.stderr
    m = re.search(r"DONE \((PASS|FAIL|ERROR|UNKNOWN)", out)
    status = m.group(1) if m else "ERROR"
    return FormalResult(check, status, depth, dt, params, "\n".join(out.splitlines()[-15:]))
