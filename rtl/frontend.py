"""CxlMemFrontEnd: the device side of CXL.mem in front of the policy engine.

M2S Req and M2S RwD arrive on valid/ready streams, S2M NDR and S2M DRS leave on
valid/ready streams; every payload layout is built from the one message table in
:mod:`kvcxl.cxl.mem` (``field_widths``), so the RTL, the emulator and the
testbench share the field names, order and widths.

One HDM decoder (:class:`kvcxl.rtl.hdm.HdmDecode`, the emulator's rule) translates
HPA → DPA; a line decodes when the decoder hits and its DPA falls inside the line store.

Behaviour (one message at a time, in arrival order; RwD before Req when both wait):

* MemRd / MemRdData: a decoded line inside the on-chip line store answers DRS
  MemData with the line and its poison bit, and reports the entry it belongs to
  (``dpa >> entry_shift``) on ``touch`` — the metadata lookup that marks the
  entry read.  Otherwise DRS MemData-NXM with poison set.
* MemSpecRd: no response (a speculative read is a hint); the entry is still touched.
* MemInv: NDR Cmp.
* MemWr / MemWrPtl: the enabled bytes are written and the line's poison bit takes
  the message's; NDR Cmp.  A write that does not decode completes without effect.
* Every response echoes ``tag`` and ``ld_id``; ``dev_load`` is Light.

``defect`` plants a bug for the formal check (``kvcxl rtl formal --check frontend``)
to catch: ``"lose_request"`` takes a Req while busy with another message (instead of
holding ``req.ready`` low), so that request is never answered; ``"drop_on_stall"``
withdraws an NDR its receiver stalls (the completion is lost); ``"duplicate_response"``
answers a read twice (DRS, then NDR); ``"mis_interleave"`` is the decoder's
(:mod:`kvcxl.rtl.hdm`).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from kvcxl.cxl import hdm
from kvcxl.cxl import mem as cxl

from .hdm import UNIT_BITS, HdmDecode

LINE_SHIFT = cxl.LINE_SHIFT
DEFECTS = (None, "lose_request", "drop_on_stall", "duplicate_response", "mis_interleave")


def message_layout(cls: cxl.MessageClass) -> data.StructLayout:
    """The Amaranth layout of one CXL.mem message class, from the shared field table."""
    return data.StructLayout({name: unsigned(w) for name, w in cxl.field_widths(cls).items()})


class CxlMemFrontEnd(wiring.Component):
    def __init__(
        self,
        lines: int = 64,
        entry_shift: int = 13,
        entries: int = 1024,
        *,
        defect: str | None = None,
    ):
        if defect not in DEFECTS:
            raise ValueError(f"defect = {defect!r}: must be one of {DEFECTS}")
        self.defect = defect
        self.hdm_defect = defect if defect == "mis_interleave" else None
        if lines < 1 or lines & (lines - 1):
            raise ValueError(f"lines = {lines}: must be a power of two ≥ 1")
        if entry_shift < LINE_SHIFT:
            raise ValueError(f"entry_shift = {entry_shift}: an entry is at least one line (6)")
        self.lines, self.entry_shift, self.entries = lines, entry_shift, entries
        self.index_bits = max((entries - 1).bit_length(), 1)
        super().__init__(
            {
                "req": In(stream.Signature(message_layout(cxl.M2S_REQ))),
                "rwd": In(stream.Signature(message_layout(cxl.M2S_RWD))),
                "ndr": Out(stream.Signature(message_layout(cxl.S2M_NDR))),
                "drs": Out(stream.Signature(message_layout(cxl.S2M_DRS))),
                "touch": Out(stream.Signature(unsigned(self.index_bits))),
                # HDM decoder registers
                "hdm_commit": In(1),
                "hdm_base": In(UNIT_BITS),  # 256 MiB units
                "hdm_size": In(UNIT_BITS),
                "hdm_ig": In(hdm.IG_BITS),  # granularity 256 B << ig
                "hdm_iw": In(hdm.IW_BITS),  # ways 1 << iw
                "hdm_pos": In(hdm.POSITION_BITS),
            }
        )

    def elaborate(self, platform):
        m = Module()
        lw = cxl.LINE_BYTES * 8
        m.submodules.lines = store = Memory(shape=unsigned(lw), depth=self.lines, init=[])
        m.submodules.poison = pstore = Memory(shape=1, depth=self.lines, init=[])
        rp, wp = store.read_port(), store.write_port(granularity=8)
        prp, pwp = pstore.read_port(), pstore.write_port()

        is_wr = Signal()
        hdr_op = Signal(4)
        tag = Signal(16)
        ld_id = Signal(4)
        line = Signal(cxl.ADDR_BITS)
        poison = Signal()
        benable = Signal(cxl.LINE_BYTES)
        wdata = Signal(lw)

        # HPA → DPA through the one decoder.
        m.submodules.hdm = dec = HdmDecode(defect=self.hdm_defect, staged=True)
        m.d.comb += [
            dec.hpa.eq(line << LINE_SHIFT),
            dec.commit.eq(self.hdm_commit),
            dec.base.eq(self.hdm_base),
            dec.size.eq(self.hdm_size),
            dec.ig.eq(self.hdm_ig),
            dec.iw.eq(self.hdm_iw),
            dec.pos.eq(self.hdm_pos),
        ]
        dpa = dec.dpa
        hit = Signal()
        # (dpa >> LINE_SHIFT) < lines, lines a power of two: no bit at or above it is set.
        m.d.comb += hit.eq(dec.hit & ((dpa >> (LINE_SHIFT + self.lines.bit_length() - 1)) == 0))
        slot = (dpa >> LINE_SHIFT)[: max((self.lines - 1).bit_length(), 1)]
        # The decode takes two cycles (DECODE: the decoder's offset and range registers;
        # DECODE2: hit, slot and entry registered) before the line store sees it (ACCESS):
        # no cycle runs from the message's address through the decoder's subtract, shifts
        # and compares into the store's address and write enables.
        slot_r = Signal(len(slot))
        entry_r = Signal(self.index_bits)
        m.d.comb += [
            rp.addr.eq(slot_r),
            prp.addr.eq(slot_r),
            wp.addr.eq(slot_r),
            pwp.addr.eq(slot_r),
        ]

        ndr, drs, touch = self.ndr, self.drs, self.touch
        ndr_p, drs_p = ndr.payload, drs.payload
        m.d.comb += [
            ndr_p.tag.eq(tag),
            ndr_p.ld_id.eq(ld_id),
            ndr_p.opcode.eq(cxl.S2MNDROpcode.CMP),
            ndr_p.meta_field.eq(cxl.MetaField.NO_OP),
            ndr_p.dev_load.eq(cxl.DevLoad.LIGHT),
            drs_p.tag.eq(tag),
            drs_p.ld_id.eq(ld_id),
            drs_p.meta_field.eq(cxl.MetaField.NO_OP),
            drs_p.dev_load.eq(cxl.DevLoad.LIGHT),
            touch.payload.eq(entry_r),
        ]
        hit_r = Signal()
        is_read = (hdr_op == cxl.M2SReqOpcode.MEM_RD) | (hdr_op == cxl.M2SReqOpcode.MEM_RD_DATA)
        is_spec = hdr_op == cxl.M2SReqOpcode.MEM_SPEC_RD

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.rwd.ready.eq(1)
                with m.If(self.rwd.valid):
                    p = self.rwd.payload
                    m.d.sync += [
                        is_wr.eq(1),
                        hdr_op.eq(p.opcode),
                        tag.eq(p.tag),
                        ld_id.eq(p.ld_id),
                        line.eq(p.addr),
                        poison.eq(p.poison),
                        benable.eq(p.byte_enable),
                        wdata.eq(p.data),
                    ]
                    m.next = "DECODE"
                with m.Else():
                    m.d.comb += self.req.ready.eq(1)
                    with m.If(self.req.valid):
                        p = self.req.payload
                        m.d.sync += [
                            is_wr.eq(0),
                            hdr_op.eq(p.opcode),
                            tag.eq(p.tag),
                            ld_id.eq(p.ld_id),
                            line.eq(p.addr),
                        ]
                        m.next = "DECODE"
            with m.State("DECODE"):  # the decoder's first stage takes `line`
                if self.defect == "lose_request":  # Planted defect: busy yet takes a request.
                    m.d.comb += self.req.ready.eq(1)
                m.d.comb += dec.en.eq(1)
                m.next = "DECODE2"
            with m.State("DECODE2"):  # its second: hit and DPA, registered
                if self.defect == "lose_request":
                    m.d.comb += self.req.ready.eq(1)
                m.d.sync += [
                    hit_r.eq(hit),
                    slot_r.eq(slot),
                    entry_r.eq((dpa >> self.entry_shift)[: self.index_bits]),
                ]
                m.next = "ACCESS"
            with m.State("ACCESS"):
                if self.defect == "lose_request":
                    m.d.comb += self.req.ready.eq(1)
                # The line store's read ports see the decoded slot this cycle.
                with m.If(is_wr):
                    with m.If(hit_r):
                        m.d.comb += [
                            wp.en.eq(benable),
                            wp.data.eq(wdata),
                            pwp.en.eq(1),
                            pwp.data.eq(poison),
                        ]
                    m.next = "NDR"
                with m.Elif(is_read | is_spec):
                    m.next = "TOUCH"
                with m.Else():
                    m.next = "NDR"
            with m.State("TOUCH"):
                with m.If(hit_r):
                    m.d.comb += touch.valid.eq(1)
                with m.If(~hit_r | touch.ready):
                    with m.If(is_spec):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "DRS"
            with m.State("DRS"):
                m.d.comb += [
                    drs.valid.eq(1),
                    drs_p.opcode.eq(
                        Mux(hit_r, cxl.S2MDRSOpcode.MEM_DATA, cxl.S2MDRSOpcode.MEM_DATA_NXM)
                    ),
                    drs_p.poison.eq(Mux(hit_r, prp.data, 1)),
                    drs_p.data.eq(Mux(hit_r, rp.data, 0)),
                ]
                with m.If(drs.ready):
                    # Planted defect: the read is answered again, with an NDR.
                    m.next = "NDR" if self.defect == "duplicate_response" else "IDLE"
            with m.State("NDR"):
                m.d.comb += ndr.valid.eq(1)
                # Planted defect: the completion is withdrawn when NDR stalls.
                with m.If(ndr.ready | (self.defect == "drop_on_stall")):
                    m.next = "IDLE"
        return m
