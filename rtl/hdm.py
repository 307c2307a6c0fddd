"""HdmDecode: one HDM decoder (CXL 2.0 §8.2.5.12), HPA → DPA, combinational or staged.

The emulator's rule (:mod:`kvcxl.cxl.hdm`) with ``g = 8 + ig`` (log2 of the
granularity) and ``o = hpa − base``::

    way = (o >> g) mod 2^iw
    dpa = (o >> (g + iw)) << g | o mod 2^g        -- this device's, if way == position

``hit`` is set when the decoder is committed, ``base ≤ hpa < base + size`` and
``way == position``.  Base and size are programmed in 256 MiB units, as the
registers hold them; the encodings come from :mod:`kvcxl.cxl.hdm`.

``staged=True`` registers the offset ``o`` and the range compare (taken when ``en`` is
high) and forms ``way``, ``dpa`` and ``hit`` from those registers: the decode a cycle
after ``hpa``, with no cycle holding the subtract and the shifts in series (the CXL.mem
front end's critical path on the ECP5).  The registers (base, size, ig, iw, position)
must hold still over that cycle.

``defect="mis_interleave"`` plants a bug for the formal check to catch: the way is
taken one bit too high (``o >> (g + 1)``), as if the granularity were doubled.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from kvcxl.cxl import hdm
from kvcxl.cxl import mem as cxl

HPA_BITS = cxl.ADDR_BITS + cxl.LINE_SHIFT
UNIT_BITS = HPA_BITS - hdm.GRANULE_SHIFT  # base and size register widths
DEFECTS = (None, "mis_interleave")


class HdmDecode(wiring.Component):
    """HPA → (hit, DPA) of one decoder; the registers are plain inputs."""

    def __init__(self, *, defect: str | None = None, staged: bool = False):
        if defect not in DEFECTS:
            raise ValueError(f"defect = {defect!r}: must be one of {DEFECTS}")
        self.defect, self.staged = defect, staged
        super().__init__(
            {
                "en": In(1),  # staged: the offset and range stage takes ``hpa`` this cycle
                "hpa": In(HPA_BITS),
                "commit": In(1),
                "base": In(UNIT_BITS),  # 256 MiB units
                "size": In(UNIT_BITS),
                "ig": In(hdm.IG_BITS),  # granularity 256 B << ig
                "iw": In(hdm.IW_BITS),  # ways 1 << iw
                "pos": In(hdm.POSITION_BITS),
                "hit": Out(1),
                "dpa": Out(HPA_BITS),
            }
        )

    def elaborate(self, platform):
        m = Module()
        base = Signal(HPA_BITS)
        limit = Signal(HPA_BITS + 1)
        m.d.comb += [
            base.eq(self.base << hdm.GRANULE_SHIFT),
            limit.eq(base + (self.size << hdm.GRANULE_SHIFT)),
        ]
        off = Signal(HPA_BITS)
        in_range = Signal()
        off_d = self.hpa - base
        in_range_d = self.commit & (self.hpa >= base) & (self.hpa < limit)
        if self.staged:
            # The subtract and the range compares are registered; the shifts, the way and
            # `hit` are formed from the registers a cycle later (en: a new hpa is taken).
            with m.If(self.en):
                m.d.sync += [off.eq(off_d), in_range.eq(in_range_d)]
        else:
            m.d.comb += [off.eq(off_d), in_range.eq(in_range_d)]
        g = Signal(range(hdm.GRANULARITY_SHIFT + len(hdm.GRANULARITIES)))  # log2 granularity
        m.d.comb += g.eq(hdm.GRANULARITY_SHIFT + self.ig)
        way_shift = g + 1 if self.defect == "mis_interleave" else g
        way = Signal(hdm.POSITION_BITS)
        m.d.comb += way.eq((off >> way_shift) & ((Const(1, hdm.POSITION_BITS + 1) << self.iw) - 1))
        low = Signal(HPA_BITS)
        m.d.comb += low.eq((Const(1, HPA_BITS) << g) - 1)
        # (o >> (g + iw)) << g is o >> iw with its low g bits cleared: one shift by iw and a
        # mask, not three shifts in series.
        m.d.comb += [
            self.dpa.eq(((off >> self.iw) & ~low) | (off & low)),
            self.hit.eq(in_range & (way == self.pos)),
        ]
        return m
