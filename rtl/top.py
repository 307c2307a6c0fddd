"""PolicyEngine: the front end, the weight buffer, the policy core and the prefetch engine.

How a decode step flows through it:

1. the host reports attention weights on ``report`` ({index, weight}); a report
   max-merges the weight into the entry's slot of the weight buffer and marks it
   read (the firmware keeps an entry's largest weight of a step);
2. host reads of device memory arrive as CXL.mem on ``req``; each decoded read
   marks its entry read in the same buffer (the front end's ``touch``);
3. a beat on ``step`` sweeps the buffer, ``lanes`` entries per cycle, into the
   ScoringEngine (clearing it for the next step); the EvictionEngine's victims leave
   on ``victim`` and every updated entry passes the ``scored`` tap;
4. a shadow copy of the scores, written from the tap, answers the PrefetchEngine's
   score reads; ``pf_touch`` asks it for the ranked blocks to prefetch.

Entry ids are ``(layer · heads + head) · blocks + block`` (one context), the
prefetch engine's numbering; ``entries = layers · heads · blocks``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from kvcxl.cxl import mem as cxl

from . import layouts as L
from .core import PolicyCore
from .frontend import CxlMemFrontEnd, message_layout
from .prefetch import PrefetchEngine


class PolicyEngine(wiring.Component):
    def __init__(
        self,
        layers: int = 4,
        heads: int = 2,
        blocks: int = 8,
        lanes: int = 4,
        batch: int = 8,
        *,
        lines: int = 64,
        entry_shift: int = 13,
        max_window: int = 2,
        max_depth: int = 2,
        decay_init=None,
        rope_init=None,
        defect: str | None = None,
    ):

        self.entries = layers * heads * blocks
        self.lanes = lanes
        self.core = PolicyCore(self.entries, lanes, batch, decay_init=decay_init, defect=defect)
        self.fe = CxlMemFrontEnd(lines, entry_shift, self.entries)
        self.pf = PrefetchEngine(layers, heads, blocks, max_window, max_depth, rope_init)
        self.index_bits = self.core.index_bits
        core_sig = self.core.signature.members
        pf_sig = self.pf.signature.members
        fe_sig = self.fe.signature.members
        super().__init__(
            {
                "req": In(stream.Signature(message_layout(cxl.M2S_REQ))),
                "rwd": In(stream.Signature(message_layout(cxl.M2S_RWD))),
                "ndr": Out(stream.Signature(message_layout(cxl.S2M_NDR))),
                "drs": Out(stream.Signature(message_layout(cxl.S2M_DRS))),
                "report": In(
                    stream.Signature(
                        data.StructLayout(
                            {"index": unsigned(self.index_bits), "weight": unsigned(L.Q_BITS)}
                        )
                    )
                ),
                "step": In(stream.Signature(L.step_layout())),
                "victim": core_sig["victim"],
                "scored": core_sig["scored"],
                "rec_w": core_sig["rec_w"],
                "table_w": core_sig["table_w"],
                "alpha": core_sig["alpha"],
                "touch": core_sig["touch"],
                "shift": core_sig["shift"],
                "k": core_sig["k"],
                "pf_touch": pf_sig["touch"],
                "pf_cand": pf_sig["cand"],
                "rope_w": pf_sig["rope_w"],
                "window": pf_sig["window"],
                "depth": pf_sig["depth"],
                "blend_rope": pf_sig["blend_rope"],
                **{k: v for k, v in fe_sig.items() if k.startswith("hdm_")},
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.fe = fe = self.fe
        m.submodules.pf = pf = self.pf
        lanes, groups = self.lanes, self.entries // self.lanes
        for name in ("req", "rwd", "rec_w", "table_w"):
            wiring.connect(
                m,
                wiring.flipped(getattr(self, name)),
                getattr(fe if name in ("req", "rwd") else core, name),
            )
        wiring.connect(m, fe.ndr, wiring.flipped(self.ndr))
        wiring.connect(m, fe.drs, wiring.flipped(self.drs))
        wiring.connect(m, core.victim, wiring.flipped(self.victim))
        wiring.connect(m, wiring.flipped(self.pf_touch), pf.touch)
        wiring.connect(m, pf.cand, wiring.flipped(self.pf_cand))
        wiring.connect(m, wiring.flipped(self.rope_w), pf.rope_w)
        m.d.comb += [
            self.scored.valid.eq(core.scored.valid),
            self.scored.payload.eq(core.scored.payload),
            core.alpha.eq(self.alpha),
            core.touch.eq(self.touch),
            core.shift.eq(self.shift),
            core.k.eq(self.k),
            pf.window.eq(self.window),
            pf.depth.eq(self.depth),
            pf.blend_rope.eq(self.blend_rope),
        ]
        for name in ("hdm_commit", "hdm_base", "hdm_size", "hdm_ig", "hdm_iw", "hdm_pos"):
            m.d.comb += getattr(fe, name).eq(getattr(self, name))

        # Shadow scores for the prefetch engine, written from the scored tap.
        word = data.ArrayLayout(unsigned(L.Q_BITS), lanes)
        m.submodules.shadow = shadow = Memory(shape=word, depth=groups, init=[])
        swp, srp = shadow.write_port(), shadow.read_port()
        tap = core.scored.payload
        m.d.comb += [
            swp.en.eq(core.scored.valid),
            swp.addr.eq(tap.addr),
            srp.addr.eq(pf.score_addr // lanes),
        ]
        for i in range(lanes):
            m.d.comb += swp.data[i].eq(tap.lane[i].score)
        lane_r = Signal(range(lanes))
        m.d.sync += lane_r.eq(pf.score_addr % lanes)
        m.d.comb += pf.score_data.eq(srp.data[lane_r])

        # The weight buffer: one word per lane group, {weight[lanes], read}.
        upd = L.update_layout(lanes)
        m.submodules.wbuf = wbuf = Memory(shape=upd, depth=groups, init=[])
        wwp, wrp = wbuf.write_port(), wbuf.read_port(transparent_for=())
        g = Signal(range(groups))
        idx = Signal(self.index_bits)
        wt = Signal(L.Q_BITS)
        from_report = Signal()
        m.d.comb += wrp.addr.eq(g)
        word_r = Signal(upd)
        m.d.comb += word_r.eq(wrp.data)
        lane = Signal(range(lanes))
        m.d.comb += lane.eq(idx % lanes)
        merged = Signal(upd)
        m.d.comb += merged.eq(word_r)
        for i in range(lanes):
            with m.If(lane == i):
                m.d.comb += [
                    merged.read[i].eq(1),
                    merged.weight[i].eq(
                        Mux(from_report & (wt > word_r.weight[i]), wt, word_r.weight[i])
                    ),
                ]
        hold, keep = Signal(), Signal()  # the sweep's kind, from its step beat
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.step.valid):
                    m.d.sync += [
                        g.eq(0),
                        hold.eq(self.step.payload.hold),
                        keep.eq(self.step.payload.keep),
                    ]
                    m.next = "SWEEP_READ"
                with m.Elif(self.report.valid):
                    m.d.comb += self.report.ready.eq(1)
                    m.d.sync += [
                        idx.eq(self.report.payload.index),
                        wt.eq(self.report.payload.weight),
                        from_report.eq(1),
                    ]
                    # An index beyond the table is accepted and dropped.
                    with m.If(self.report.payload.index < self.entries):
                        m.next = "RMW_READ"
                with m.Elif(fe.touch.valid):
                    m.d.comb += fe.touch.ready.eq(1)
                    m.d.sync += [idx.eq(fe.touch.payload), from_report.eq(0)]
                    with m.If(fe.touch.payload < self.entries):
                        m.next = "RMW_READ"
            with m.State("RMW_READ"):  # the read port sees idx's word this cycle
                m.d.comb += wrp.addr.eq(idx // lanes)
                m.next = "RMW_WRITE"
            with m.State("RMW_WRITE"):
                m.d.comb += [
                    wrp.addr.eq(idx // lanes),
                    wrp.en.eq(0),
                    wwp.en.eq(1),
                    wwp.addr.eq(idx // lanes),
                    wwp.data.eq(merged),
                ]
                m.d.sync += from_report.eq(0)
                m.next = "IDLE"
            with m.State("SWEEP_READ"):
                m.d.comb += wrp.addr.eq(g)
                m.next = "SWEEP_SEND"
            with m.State("SWEEP_SEND"):
                m.d.comb += [
                    wrp.addr.eq(g),
                    wrp.en.eq(0),
                    core.upd.valid.eq(1),
                    core.upd.payload.eq(word_r),
                    core.upd.payload.hold.eq(hold),
                ]
                with m.If(core.upd.ready):
                    m.d.comb += [wwp.en.eq(~keep), wwp.addr.eq(g), wwp.data.eq(0)]
                    with m.If(g == groups - 1):
                        m.d.comb += self.step.ready.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += g.eq(g + 1)
                        m.next = "SWEEP_READ"
        return m
