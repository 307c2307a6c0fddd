"""RecordStreamEngine: the EMA scoring engine with its records in device DRAM.

The on-chip engine (:class:`kvcxl.rtl.scoring.ScoringEngine` → :class:`EvictionEngine`,
``PolicyCore``) keeps every entry's record in block RAM: 256 to 4 096 entries on an FPGA.
One S1 context is 5 242 880 entries (22.3 MB of records), so a device keeps them in its
own DRAM and streams them through the engine once a sweep.  This engine does that:

* a ``step`` beat {hold} starts a sweep over ``entries / lanes`` record words;
* ``rd_cmd`` asks the memory for the words in bursts of ``burst`` words (address, length),
  as far ahead as the memory takes commands; ``rd_data`` brings them back in order;
* each word meets its ``upd`` beat (the step's weights and read flags of its ``lanes``
  entries, as the on-chip engine takes them; its ``hold`` field is not read, the sweep's
  kind is the ``step`` beat's) and goes through the same Q0.16 datapath,
  built by calling the firmware's kernels on signals
  (:func:`kvcxl.firmware.fixedpoint.ema_q16_products`, ``q16_round``,
  ``priority_q16_step``), three stages: join → EMA products and idle count → new score
  and decay-table read → priority (with one lane a fourth: the decay word registered
  before the priority multiply);
* the scored beat goes to a streaming top-k (:class:`kvcxl.rtl.eviction.EvictionEngine`,
  imported: the same selector the on-chip engine uses) and, unless the sweep is a
  ``hold`` evaluation, its new record word back to memory (``wr_cmd`` bursts at the same
  addresses, ``wr_data`` in order);
* when the sweep's last beat has left, the victims stream out on ``victim``; the sweep
  (``busy``) ends once its last write command has been taken too.

The memory port is four valid/ready streams in the manner of AXI's AR/R/AW/W channels
(a burst is one command beat and its data beats in order, the data possibly taken
before the command, as AXI allows); a word is ``lanes`` records of
:func:`kvcxl.rtl.layouts.record_layout` (34 bits each). The host writes records into
the DRAM itself (an entry's first write, a pin), not through the engine.

Semantics per sweep are the on-chip engine's: an update sweep is
:func:`kvcxl.firmware.golden_step.step`, a ``hold`` sweep
:func:`kvcxl.firmware.golden_step.evaluate` (score as stored, idle 0 if touched so far,
nothing written back), so the victims are the on-chip engine's.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from kvcxl.firmware import fixedpoint as fx

from . import layouts as L
from .eviction import EvictionEngine
from .scoring import decay_tables, ema_weights

# ``hold_writes``: an evaluation sweep writes its records back too (a touched entry's idle
# counter reset within the step); ``lose_word``: a record word is taken from memory while
# its ``upd`` beat has not come, and dropped; ``early_done``: the sweep ends (``busy``
# falls) with its last beat, though a memory that took the data first has not yet taken
# every write command, and the rest are never sent.  The checks must catch all three.
DEFECTS = (None, "hold_writes", "lose_word", "early_done")


def word_layout(lanes: int) -> data.ArrayLayout:
    """One memory word: the records of ``lanes`` consecutive entries."""
    return data.ArrayLayout(L.record_layout(), lanes)


def word_bits(lanes: int) -> int:
    return word_layout(lanes).size


def burst_layout(addr_bits: int, burst: int) -> data.StructLayout:
    """A burst command: the first word's address and the burst's length in words."""
    return data.StructLayout({"addr": unsigned(addr_bits), "len": unsigned(burst.bit_length())})


def step_layout() -> data.StructLayout:
    """A sweep: ``hold`` evaluates (nothing written back) instead of updating."""
    return data.StructLayout({"hold": unsigned(1)})


class RecordStreamEngine(wiring.Component):
    """Scoring and top-k over records streamed from, and written back to, memory."""

    def __init__(
        self,
        entries: int,
        lanes: int = 1,
        batch: int = 8,
        burst: int = 16,
        decay_init=None,
        *,
        defect: str | None = None,
    ):
        if defect not in DEFECTS:
            raise ValueError(f"defect = {defect!r}: must be one of {DEFECTS}")
        self.defect = defect
        if lanes < 1 or entries < lanes or entries % lanes:
            raise ValueError(f"entries = {entries} must be a positive multiple of lanes = {lanes}")
        if burst < 1:
            raise ValueError(f"burst = {burst}: must be ≥ 1")
        self.entries, self.lanes, self.batch, self.burst = entries, lanes, batch, burst
        self.words = entries // lanes
        self.addr_bits = max((self.words - 1).bit_length(), 1)
        self.decay_init = [int(v) for v in decay_init] if decay_init is not None else []
        word = word_layout(lanes)
        cmd = burst_layout(self.addr_bits, burst)
        super().__init__(
            {
                "step": In(stream.Signature(step_layout())),
                "upd": In(stream.Signature(L.update_layout(lanes))),
                "rd_cmd": Out(stream.Signature(cmd)),
                "rd_data": In(stream.Signature(word)),
                "wr_cmd": Out(stream.Signature(cmd)),
                "wr_data": Out(stream.Signature(word)),
                "victim": Out(
                    stream.Signature(L.victim_layout(max((entries - 1).bit_length(), 1)))
                ),
                "table_w": In(stream.Signature(L.table_write_layout())),
                "alpha": In(L.ALPHA_BITS, init=L.ALPHA_RESET),
                "touch": In(L.Q_BITS),
                "shift": In(L.SHIFT_BITS),
                "k": In(range(batch + 1), init=batch),
                # a sweep is under way: its words or (write-back) write commands not all out
                "busy": Out(1),
            }
        )
        # The selector (built here so that a checker can watch its input).
        self.select = EvictionEngine(entries, lanes, batch)

    def elaborate(self, platform):
        m = Module()
        lanes, W, B = self.lanes, self.words, self.burst
        word = word_layout(lanes)
        m.submodules.select = sel = self.select
        m.d.comb += sel.k.eq(self.k)

        # --- the sweep and its burst commands -----------------------------------------
        active = Signal()
        hold = Signal()
        rd_next = Signal(range(W + 1))
        wr_next = Signal(range(W + 1))
        m.d.comb += [self.step.ready.eq(~active), self.busy.eq(active)]
        with m.If(self.step.valid & self.step.ready):
            m.d.sync += [active.eq(1), hold.eq(self.step.payload.hold), rd_next.eq(0),
                         wr_next.eq(0)]  # fmt: skip
        wb = Signal()  # the sweep writes its records back
        m.d.comb += wb.eq(1 if self.defect == "hold_writes" else ~hold)
        for port, nxt, on in ((self.rd_cmd, rd_next, active), (self.wr_cmd, wr_next, wb)):
            left = W - nxt
            m.d.comb += [
                port.valid.eq(active & on & (nxt < W)),
                port.payload.addr.eq(nxt),
                port.payload.len.eq(Mux(left < B, left, B)),
            ]
            with m.If(port.valid & port.ready):
                m.d.sync += nxt.eq(nxt + port.payload.len)

        # --- decay tables: one copy (a read port) per lane ----------------------------
        tables = decay_tables(m, lanes, self.decay_init, self.table_w)

        # --- the datapath: all stages advance together when the output is free ----------
        v1, v2, v3 = Signal(), Signal(), Signal()
        # With one lane the decay word is registered (stage 4) before the priority
        # multiply, so that no cycle runs from the table's block RAM (5.83 ns clock-to-out
        # on the ECP5) through the multiply into the selector (the on-chip engine's stage 3);
        # with more lanes the clock is the top-k's insertion.
        staged = lanes == 1
        vo = Signal() if staged else v3  # the output stage's beat
        advance = Signal()
        out_fire = Signal()
        m.d.comb += advance.eq(~vo | out_fire)

        # Stage 1: a record word joined with its weights.
        join = self.rd_data.valid & self.upd.valid & active
        lose = self.defect == "lose_word"
        m.d.comb += [
            self.rd_data.ready.eq(advance & (1 if lose else self.upd.valid) & active),
            self.upd.ready.eq(advance & self.rd_data.valid & active),
        ]
        waddr = Signal(range(W))  # the word the next join belongs to
        rec1, upd1 = Signal(word), Signal.like(self.upd.payload)
        addr1, last1 = Signal(self.addr_bits), Signal()
        with m.If(advance):
            m.d.sync += [v1.eq(join), rec1.eq(self.rd_data.payload), upd1.eq(self.upd.payload),
                         addr1.eq(waddr), last1.eq(waddr == W - 1)]  # fmt: skip
        with m.If(join & advance):
            m.d.sync += waddr.eq(Mux(waddr == W - 1, 0, waddr + 1))

        # Stage 2: the EMA products and the new idle count (α = 0 in a hold sweep keeps the
        # score as stored: (65536·score + 32768) >> 16 = score).  With one lane the kernel's
        # two weights (its products at w = score = 1: α and 65536 − α) are chosen and
        # registered with the joined word, as the on-chip engine's, so that neither the
        # choice nor 65536 − α is in series with the products (95.25 MHz at seed 1 with
        # the decay word registered alone); the products are bilinear, so each is its
        # weight times its operand.
        alpha = Signal.like(self.alpha)
        if staged:
            weight_w, weight_s = ema_weights(m, self.alpha, hold, advance)
        else:
            m.d.comb += alpha.eq(Mux(hold, 0, self.alpha))
        meta2 = Signal(word)
        prod_w, prod_s = [], []
        addr2, last2 = Signal(self.addr_bits), Signal()
        for i in range(lanes):
            rec, w = rec1[i], upd1.weight[i]
            touched = upd1.read[i] & (w >= self.touch)
            if staged:
                pw_expr, ps_expr = weight_w * w, weight_s * rec.score
            else:
                pw_expr, ps_expr = fx.ema_q16_products(rec.score, w, alpha)  # the firmware's
            pw, ps = Signal(pw_expr.shape()), Signal(ps_expr.shape())
            prod_w.append(pw)
            prod_s.append(ps)
            kept = Mux(hold | (rec.idle == fx.IDLE_MAX), rec.idle, rec.idle + 1)
            with m.If(advance):
                m.d.sync += [
                    pw.eq(pw_expr),
                    ps.eq(ps_expr),
                    meta2[i].idle.eq(Mux(touched, 0, kept)),
                    meta2[i].pinned.eq(rec.pinned),
                    meta2[i].resident.eq(rec.resident),
                ]
        with m.If(advance):
            m.d.sync += [v2.eq(v1), addr2.eq(addr1), last2.eq(last1)]

        # Stage 3: the new score registered with its record; the decay word read meanwhile.
        new2 = Signal(word)
        new3 = Signal(word)
        addr3, last3 = Signal(self.addr_bits), Signal()
        top = fx.DECAY_TABLE_SIZE - 1
        for i in range(lanes):
            shifted = meta2[i].idle >> self.shift
            m.d.comb += [
                new2[i].score.eq(fx.q16_round(prod_w[i] + prod_s[i])),
                new2[i].idle.eq(meta2[i].idle),
                new2[i].pinned.eq(meta2[i].pinned),
                new2[i].resident.eq(meta2[i].resident),
                tables[i].addr.eq(Mux(shifted > top, top, shifted)),
                tables[i].en.eq(advance),
            ]
        with m.If(advance):
            m.d.sync += [v3.eq(v2), new3.eq(new2), addr3.eq(addr2), last3.eq(last2)]
        newo, addro, lasto, decay = new3, addr3, last3, [t.data for t in tables]
        if staged:
            # Stage 4: the decay word read in stage 3 held in a register with its beat.
            newo, addro, lasto = Signal(word), Signal(self.addr_bits), Signal()
            decay = [Signal(L.Q_BITS, name=f"decay4_{i}") for i in range(lanes)]
            with m.If(advance):
                m.d.sync += [vo.eq(v3), newo.eq(new3), addro.eq(addr3), lasto.eq(last3)]
                m.d.sync += [decay[i].eq(tables[i].data) for i in range(lanes)]

        # Output: the scored beat to the selector and (update sweeps) the word to memory.
        cand_sent, wr_sent = Signal(), Signal()
        c_ok = cand_sent | sel.cand.ready
        w_ok = ~wb | wr_sent | self.wr_data.ready
        m.d.comb += [
            sel.cand.valid.eq(vo & ~cand_sent),
            sel.cand.payload.addr.eq(addro),
            sel.cand.payload.last.eq(lasto),
            self.wr_data.valid.eq(vo & wb & ~wr_sent),
            self.wr_data.payload.eq(newo),
            out_fire.eq(vo & c_ok & w_ok),
        ]
        for i in range(lanes):
            o, r = sel.cand.payload.lane[i], newo[i]
            m.d.comb += [
                o.score.eq(r.score),
                o.idle.eq(r.idle),
                o.priority.eq(fx.priority_q16_step(r.score, decay[i])),
                o.eligible.eq(r.resident & ~r.pinned),
            ]
        with m.If(out_fire):
            m.d.sync += [cand_sent.eq(0), wr_sent.eq(0)]
        with m.Else():
            with m.If(sel.cand.valid & sel.cand.ready):
                m.d.sync += cand_sent.eq(1)
            with m.If(self.wr_data.valid & self.wr_data.ready):
                m.d.sync += wr_sent.eq(1)

        # The sweep ends when its last beat has left and (write-back sweeps) its last write
        # command has been taken: a memory may take a burst's data before its command (AXI
        # allows it), and a command still unsent when the sweep ends would never be sent.
        drained = Signal()  # the last beat has left; a write command is still owed
        last_out = out_fire & lasto
        wc = self.wr_cmd
        # The write command being taken is the sweep's last: wr_next + len = W.  With one
        # lane that is tested on the register alone (len = min(W − wr_next, B), so it is
        # the last iff wr_next ≥ W − B), not through len's carry chains into ``drained``.
        if staged:
            last_cmd = wr_next >= W - B if W > B else 1
        else:
            last_cmd = wr_next + wc.payload.len == W
        cmds_done = Signal()
        m.d.comb += cmds_done.eq(
            1
            if self.defect == "early_done"
            else ~wb | (wr_next == W) | (wc.valid & wc.ready & last_cmd)
        )
        with m.If((drained | last_out) & cmds_done):
            m.d.sync += [active.eq(0), drained.eq(0)]
        with m.Elif(last_out):
            m.d.sync += drained.eq(1)
        wiring.connect(m, sel.victim, wiring.flipped(self.victim))
        return m
