"""PolicyCore: the scoring sweep feeding the eviction engine, with an observation tap.

``scored`` repeats every beat that passes from the scoring engine to the eviction
engine (valid exactly on transfer, never back-pressured): the host can read the
new scores and priorities as they stream by, and the testbench checks each one.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from . import layouts as L
from .eviction import EvictionEngine
from .scoring import ScoringEngine


class PolicyCore(wiring.Component):
    def __init__(
        self,
        entries: int,
        lanes: int = 1,
        batch: int = 8,
        *,
        decay_init=None,
        defect: str | None = None,
    ):
        self.scoring = ScoringEngine(entries, lanes, decay_init=decay_init)
        self.eviction = EvictionEngine(entries, lanes, batch, defect=defect)
        self.entries, self.lanes, self.batch = entries, lanes, batch
        self.addr_bits = self.scoring.addr_bits
        self.index_bits = self.eviction.index_bits
        super().__init__(
            {
                "upd": In(stream.Signature(L.update_layout(lanes))),
                "rec_w": In(stream.Signature(L.record_write_layout(lanes, self.addr_bits))),
                "table_w": In(stream.Signature(L.table_write_layout())),
                "victim": Out(stream.Signature(L.victim_layout(self.index_bits))),
                "scored": Out(
                    wiring.Signature(
                        {
                            "valid": Out(1),
                            "payload": Out(L.scored_group_layout(lanes, self.addr_bits)),
                        }
                    )
                ),
                "alpha": In(L.ALPHA_BITS, init=L.ALPHA_RESET),
                "touch": In(L.Q_BITS),
                "shift": In(L.SHIFT_BITS),
                "k": In(range(batch + 1), init=batch),
            }
        )

    def elaborate(self, platform):
        m = Module()
        m.submodules.scoring = s = self.scoring
        m.submodules.eviction = e = self.eviction
        wiring.connect(m, wiring.flipped(self.upd), s.upd)
        wiring.connect(m, wiring.flipped(self.rec_w), s.rec_w)
        wiring.connect(m, wiring.flipped(self.table_w), s.table_w)
        wiring.connect(m, s.out, e.cand)
        wiring.connect(m, e.victim, wiring.flipped(self.victim))
        m.d.comb += [
            s.alpha.eq(self.alpha),
            s.touch.eq(self.touch),
            s.shift.eq(self.shift),
            e.k.eq(self.k),
            self.scored.valid.eq(s.out.valid & s.out.ready),
            self.scored.payload.eq(s.out.payload),
        ]
        return m
