"""ScoringEngine: the step-boundary sweep, ``lanes`` entries per cycle.

The arithmetic is the fixed-point contract of docs/policy.md.

For each beat of the ``upd`` stream (the step's weights and read flags of ``lanes``
consecutive entries, in address order, wrapping at the end of the table) the engine
reads the entries' records from on-chip memory, applies

    score' = (α·w + (65536 − α)·score + 32768) >> 16
    idle'  = 0 if read and w ≥ touch_threshold else min(idle + 1, 65535)

writes them back (not for a ``hold`` beat: an evaluation within the step, where the
score stays as stored and idle is 0 if touched, else as stored), looks the recency decay
up in a 256-entry table (written through ``table_w``; its contents come from
:func:`kvcxl.firmware.fixedpoint.decay_table`) and emits

    priority = ((65535 − score') · DECAY[min(idle' >> shift, 255)] + 32768) >> 16

with ``eligible = resident ∧ ¬pinned`` on the ``out`` stream.

Pipeline: stage 0 issues the record read; stage 1a registers the record; stage 1
forms the two EMA products and the new idle count; stage 1b adds the products into
the new score, writes the record back and issues the table reads; stage 2 receives
the table words and registers them; stage 3 forms the priority.  The record, the
products and the table words are registered so that no cycle holds a block RAM's
output and a multiply, nor a multiply, an add and a memory write in series (the
paths that limited Fmax in turn).  All stages advance together when ``out`` can take
a beat (a stall-able pipeline), so back-pressure on ``out`` holds every stage,
including the synchronous memory read ports.  The record read port is transparent to
the write port, so a sweep of three or more words always reads the value written back
for the same word; a table of one or two words (a word read again before its
write-back) takes the stage-1b record instead, through bypasses built only then.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from kvcxl.firmware import fixedpoint as fx

from . import layouts as L

DEPTH = 5  # beats in flight: stages 1a, 1, 1b, 2 and 3 (the formal harness bounds occupancy so)
DEFECTS = (None, "ignore_pinned")


def ema_weights(m: Module, alpha: Signal, hold: Value, advance: Value) -> tuple[Signal, Signal]:
    """The EMA kernel's two weights, its products at w = score = 1 (α and 65536 − α:
    :func:`kvcxl.firmware.fixedpoint.ema_q16_products`; α = 0 in a ``hold`` sweep),
    registered when ``advance`` and reset as ``alpha``: a one-lane stage multiplies each by
    its operand (the products are bilinear), so that neither α's choice nor 65536 − α is in
    series with the products."""
    weight_w, weight_s = Signal.like(alpha), Signal.like(alpha)
    ww, ws = fx.ema_q16_products(1, 1, Mux(hold, 0, alpha))
    with m.If(advance):
        m.d.sync += [weight_w.eq(ww), weight_s.eq(ws)]
    return weight_w, weight_s


class ScoringEngine(wiring.Component):
    """EMA update, idle counter and eviction priority of ``entries`` records.

    Parameters
    ----------
    entries : table size; a multiple of ``lanes``.
    lanes : entries updated per cycle.
    decay_init : optional initial decay table (e.g. ``decay_table(β, shift)``);
        zeros if omitted, to be written through ``table_w``.
    defect : ``"ignore_pinned"`` plants a bug for the formal check to catch
        (``eligible = resident``, a pinned entry becomes a candidate).
    """

    def __init__(self, entries: int, lanes: int = 1, decay_init=None, *, defect: str | None = None):
        if defect not in DEFECTS:
            raise ValueError(f"defect = {defect!r}: must be one of {DEFECTS}")
        self.defect = defect
        if lanes < 1 or entries < lanes or entries % lanes:
            raise ValueError(
                f"entries = {entries}, lanes = {lanes}: entries must be a positive "
                "multiple of lanes"
            )
        self.entries = entries
        self.lanes = lanes
        self.groups = entries // lanes
        self.addr_bits = max((self.groups - 1).bit_length(), 1)
        self.decay_init = [int(v) for v in decay_init] if decay_init is not None else []
        super().__init__(
            {
                "upd": In(stream.Signature(L.update_layout(lanes))),
                "out": Out(stream.Signature(L.scored_group_layout(lanes, self.addr_bits))),
                "rec_w": In(stream.Signature(L.record_write_layout(lanes, self.addr_bits))),
                "table_w": In(stream.Signature(L.table_write_layout())),
                "alpha": In(L.ALPHA_BITS, init=L.ALPHA_RESET),
                "touch": In(L.Q_BITS),
                "shift": In(L.SHIFT_BITS),
            }
        )

    def elaborate(self, platform):
        m = Module()
        lanes = self.lanes
        word = L.record_write_layout(lanes, self.addr_bits)["data"].shape

        m.submodules.records = records = Memory(shape=word, depth=self.groups, init=[])
        wp = records.write_port()
        rp = records.read_port(transparent_for=(wp,))
        tables = decay_tables(m, lanes, self.decay_init, self.table_w)

        v1a, v1, v1b, v2, v3 = Signal(), Signal(), Signal(), Signal(), Signal()
        advance = Signal()
        m.d.comb += advance.eq(~v3 | self.out.ready)

        # Stage 0: the sweep address and the record read.
        addr0 = Signal(self.addr_bits)
        m.d.comb += [
            self.upd.ready.eq(advance),
            rp.addr.eq(addr0),
            rp.en.eq(advance),
        ]
        with m.If(self.upd.valid & advance):
            m.d.sync += addr0.eq(Const(0) if self.groups == 1 else _wrap_inc(addr0, self.groups))

        # Stage 1a: the record arrives from the memory and is registered, so that no cycle
        # runs from a block RAM's clock-to-out (about 6 ns on the ECP5) into the EMA products.
        addr1a, addr1 = Signal(self.addr_bits), Signal(self.addr_bits)
        upd1a, upd1 = Signal.like(self.upd.payload), Signal.like(self.upd.payload)
        last1a, last1 = Signal(), Signal()
        with m.If(advance):
            m.d.sync += [
                v1a.eq(self.upd.valid),
                addr1a.eq(addr0),
                upd1a.eq(self.upd.payload),
                last1a.eq(addr0 == self.groups - 1),
            ]
        new = Signal(word)  # stage 1b's record: the write-back (and the bypasses)
        addr1b = Signal(self.addr_bits)
        hold1b = Signal()  # stage 1b's beat is an evaluation: no write-back
        written = Signal()  # stage 1b writes its record back this cycle
        m.d.comb += written.eq(v1b & ~hold1b)
        rec1a = Signal(word)  # the record stage 1a registers
        if self.groups <= 2:
            # A word read two beats after its previous update (a table of one or two words)
            # was read before that update's write-back, which stage 1b holds now.
            m.d.comb += rec1a.eq(Mux(written & (addr1b == addr1a), new, rp.data))
        else:
            m.d.comb += rec1a.eq(rp.data)
        rec1r = Signal(word)
        with m.If(advance):
            m.d.sync += [
                v1.eq(v1a),
                addr1.eq(addr1a),
                upd1.eq(upd1a),
                last1.eq(last1a),
                rec1r.eq(rec1a),
            ]

        # Stage 1: the EMA products and the new idle count.
        rec1 = Signal(word)
        if self.groups == 1:
            # The one word, read again one beat after its update: that update is in 1b.
            m.d.comb += rec1.eq(Mux(written, new, rec1r))
        else:
            m.d.comb += rec1.eq(rec1r)
        last1b = Signal()
        prod_w, prod_s, meta1b = [], [], Signal(word)
        # α = 0 leaves the score exactly as stored: (65536·score + 32768) >> 16 = score.
        # With one lane the kernel's two weights (its products at w = score = 1: α and
        # 65536 − α) are chosen a stage early and registered with the beat, so that neither
        # the choice nor 65536 − α is in series with the products (the clock once the
        # top-k was systolic: 10.33 ns, then 10.52 at seed 3 with α alone registered); the
        # products are bilinear, so each is its weight times its operand.  With more lanes
        # the clock is the top-k's insertion.
        alpha = Signal.like(self.alpha)
        if lanes == 1:
            weight_w, weight_s = ema_weights(m, self.alpha, upd1a.hold, advance)
        else:
            m.d.comb += alpha.eq(Mux(upd1.hold, 0, self.alpha))
        for i in range(lanes):
            rec = rec1[i]
            w = upd1.weight[i]
            touched = upd1.read[i] & (w >= self.touch)
            if lanes == 1:
                pw_expr, ps_expr = weight_w * w, weight_s * rec.score
            else:
                pw_expr, ps_expr = fx.ema_q16_products(rec.score, w, alpha)  # the firmware's
            pw, ps = Signal(pw_expr.shape()), Signal(ps_expr.shape())
            prod_w.append(pw)
            prod_s.append(ps)
            with m.If(advance):
                m.d.sync += [
                    pw.eq(pw_expr),
                    ps.eq(ps_expr),
                    meta1b[i].idle.eq(
                        _sel(
                            touched,
                            0,
                            _sel(upd1.hold | (rec.idle == fx.IDLE_MAX), rec.idle, rec.idle + 1),
                        )
                    ),
                    meta1b[i].pinned.eq(rec.pinned),
                    meta1b[i].resident.eq(rec.resident),
                ]
        with m.If(advance):
            m.d.sync += [v1b.eq(v1), addr1b.eq(addr1), last1b.eq(last1), hold1b.eq(upd1.hold)]

        # Stage 1b: the new score, the write-back, the table reads.
        for i in range(lanes):
            m.d.comb += [
                new[i].score.eq(fx.q16_round(prod_w[i] + prod_s[i])),
                new[i].idle.eq(meta1b[i].idle),
                new[i].pinned.eq(meta1b[i].pinned),
                new[i].resident.eq(meta1b[i].resident),
            ]
            shifted = meta1b[i].idle >> self.shift
            top = fx.DECAY_TABLE_SIZE - 1
            m.d.comb += [
                tables[i].addr.eq(_sel(shifted > top, top, shifted)),
                tables[i].en.eq(advance),
            ]
        # Host record writes take the write port when the sweep does not need it.
        sweep_write = v1b & advance & ~hold1b
        m.d.comb += self.rec_w.ready.eq(~sweep_write)
        with m.If(sweep_write):
            m.d.comb += [wp.en.eq(1), wp.addr.eq(addr1b), wp.data.eq(new)]
        with m.Elif(self.rec_w.valid):
            m.d.comb += [
                wp.en.eq(1),
                wp.addr.eq(self.rec_w.payload.addr),
                wp.data.eq(self.rec_w.payload.data),
            ]

        # Stage 2: the table reads arrive; stage 3 holds them in registers, so that no
        # cycle runs from a block RAM's output through the priority multiply.
        addr2, addr3 = Signal(self.addr_bits), Signal(self.addr_bits)
        last2, last3 = Signal(), Signal()
        new2, new3 = Signal(word), Signal(word)
        decay3 = [Signal(L.Q_BITS, name=f"decay3_{i}") for i in range(lanes)]
        with m.If(advance):
            m.d.sync += [v2.eq(v1b), addr2.eq(addr1b), last2.eq(last1b), new2.eq(new)]
            m.d.sync += [v3.eq(v2), addr3.eq(addr2), last3.eq(last2), new3.eq(new2)]
            m.d.sync += [decay3[i].eq(tables[i].data) for i in range(lanes)]

        # Stage 3: priority.
        m.d.comb += [
            self.out.valid.eq(v3),
            self.out.payload.addr.eq(addr3),
            self.out.payload.last.eq(last3),
        ]
        for i in range(lanes):
            o = self.out.payload.lane[i]
            r = new3[i]
            m.d.comb += [
                o.score.eq(r.score),
                o.idle.eq(r.idle),
                o.priority.eq(fx.priority_q16_step(r.score, decay3[i])),
                o.eligible.eq(self._eligible(r)),
            ]
        return m

    def _eligible(self, r):
        if self.defect == "ignore_pinned":
            return r.resident
        return r.resident & ~r.pinned


_sel = Mux


def decay_tables(m: Module, lanes: int, decay_init, table_w) -> list:
    """The decay table, one copy per lane (a read port each: BRAM-friendly), as submodules
    ``decay0`` … of ``m``, every copy written by the host's ``table_w`` stream (which never
    waits); the lanes' read ports, in lane order."""
    m.d.comb += table_w.ready.eq(1)
    tables = []
    for i in range(lanes):
        t = Memory(shape=L.Q_BITS, depth=fx.DECAY_TABLE_SIZE, init=decay_init)
        m.submodules[f"decay{i}"] = t
        twp = t.write_port()
        m.d.comb += [
            twp.en.eq(table_w.valid),
            twp.addr.eq(table_w.payload.addr),
            twp.data.eq(table_w.payload.data),
        ]
        tables.append(t.read_port())
    return tables


def _wrap_inc(addr, n: int):
    return Mux(addr == n - 1, 0, addr + 1)
