"""EvictionEngine: the top ``k`` eligible entries of a sweep, in the contract's order.

Order (docs/policy.md, :mod:`kvcxl.firmware.select`): priority descending, entry index
ascending; ineligible entries (pinned or not resident) are never chosen.

Structure: a streaming top-K.  ``batch`` slots hold the best candidates so far,
sorted.

With one lane the top-K is systolic: slot ``j`` compares only the candidate handed
to it (slot 0 the beat register, slot ``j`` > 0 the register slot ``j − 1`` writes),
keeps the better of the two and hands the other on the next cycle; the last slot
drops what it would hand on.  A beat enters every cycle, and no candidate is
broadcast to all the slots (that broadcast was the 1-lane engine's clock: 82.59 MHz
on the ECP5-85F at top-64).  The price is the drain: the last beat reaches the
last slot ``batch − 1`` cycles after the first, so a pass's victims start that much
later.  Every slot ends holding what the broadcast insertion gave (the K best of
the sweep, sorted; ranks are distinct, the index breaking ties).

With more lanes a candidate better than the last slot is inserted in one cycle
(every slot compares against it in parallel, the ones below shift down).  A beat of
``lanes`` candidates is taken whole; each cycle inserts the lowest-numbered lane
that still beats the last slot and drops the lanes that do not (the last slot only
ever improves, so a lane that loses once loses for good).  After the first few
beats few lanes qualify, so the engine keeps pace with the scoring sweep except
for the occasional extra cycle per insertion.

When the sweep's ``last`` beat has been consumed (and, with one lane, drained) the
engine emits ``min(k, eligible)`` victims on ``victim`` (``last`` marks the final
one; a pass with no victim emits one beat with ``empty`` set), then clears its slots.

``defect="tie_off_by_one"`` plants a bug for the testbench to catch: the
priority comparison uses ≥ where the contract needs >, so on equal priority a
later (higher-index) entry displaces an earlier one.  ``defect="skip_drain"`` (one
lane) emits a cycle before the drain ends: a candidate still on its way to the last
slot is lost.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from . import layouts as L

DEFECTS = (None, "tie_off_by_one", "skip_drain")


def sweep_widths(
    entries: int, lanes: int, batch: int, defect: str | None, defects: tuple
) -> tuple[int, int]:
    """A top-``batch`` selector's shape checked (``defect`` one of ``defects``, ``batch`` ≥ 1,
    ``entries`` in whole beats of ``lanes``); the widths of its beat address and of an entry
    index."""
    if defect not in defects:
        raise ValueError(f"defect = {defect!r}: must be one of {defects}")
    if batch < 1:
        raise ValueError(f"batch = {batch}: must be ≥ 1")
    if lanes < 1 or entries % lanes:
        raise ValueError(f"entries = {entries} must be a multiple of lanes = {lanes}")
    return max((entries // lanes - 1).bit_length(), 1), max((entries - 1).bit_length(), 1)


class EvictionEngine(wiring.Component):
    """Streaming top-``batch`` victim selection over the scoring engine's output."""

    def __init__(
        self,
        entries: int,
        lanes: int = 1,
        batch: int = 8,
        *,
        q_bits: int = L.Q_BITS,
        idle_bits: int = L.IDLE_BITS,
        defect: str | None = None,
    ):
        self.addr_bits, self.index_bits = sweep_widths(entries, lanes, batch, defect, DEFECTS)
        self.entries, self.lanes, self.batch = entries, lanes, batch
        self.q_bits, self.defect = q_bits, defect
        super().__init__(
            {
                "cand": In(
                    stream.Signature(
                        L.scored_group_layout(lanes, self.addr_bits, q_bits, idle_bits)
                    )
                ),
                "victim": Out(stream.Signature(L.victim_layout(self.index_bits, q_bits))),
                "k": In(range(batch + 1), init=batch),
            }
        )

    def _better(self, p, i, valid, sp, si):
        """(p, i) ranks before slot (sp, si, valid): priority desc, index asc; empty loses.

        With one lane, one compare of ``{p, ~i}`` with ``{sp, ~si}`` (priority the high
        half, the inverted index the low one): p > sp, or p = sp and i < si, in one chain.
        With more lanes the two compares and the equality: there the one chain took
        14 441 LUT4s against 9 261 (yosys, 4 lanes, top-64, 1 024 entries)."""
        if self.defect == "tie_off_by_one":
            return ~valid | (p >= sp) | ((p == sp) & (i < si))
        if self.lanes == 1:
            return ~valid | (Cat(~i, p) > Cat(~si, sp))
        return ~valid | (p > sp) | ((p == sp) & (i < si))

    def elaborate(self, platform):
        m = Module()
        K = self.batch
        sv = [Signal(name=f"slot{j}_valid") for j in range(K)]
        sp = [Signal(self.q_bits, name=f"slot{j}_prio") for j in range(K)]
        si = [Signal(self.index_bits, name=f"slot{j}_index") for j in range(K)]
        emit = Signal()  # the pass is over: streaming victims out
        count = Signal(range(K + 1))
        clear = Signal(name="clear") if self.lanes == 1 else None  # a pass ended: slots empty
        if self.lanes == 1:
            self._systolic(m, sv, sp, si, emit, count)
        else:
            self._broadcast(m, sv, sp, si, emit, count)

        # Emission: slot 0 is always the next victim; the slots shift up on each beat.
        none = Signal()
        m.d.comb += none.eq(~sv[0] | (self.k == 0))
        nxt_valid = sv[1] if K > 1 else Const(0)
        last = Signal()
        m.d.comb += [
            last.eq(none | (count + 1 >= self.k) | ~nxt_valid),
            self.victim.valid.eq(emit),
            self.victim.payload.index.eq(Mux(none, 0, si[0])),
            self.victim.payload.priority.eq(Mux(none, 0, sp[0])),
            self.victim.payload.last.eq(last),
            self.victim.payload.empty.eq(none),
        ]
        with m.If(self.victim.valid & self.victim.ready):
            m.d.sync += count.eq(count + 1)
            for j in range(K):
                if j + 1 < K:
                    m.d.sync += [sv[j].eq(sv[j + 1]), sp[j].eq(sp[j + 1]), si[j].eq(si[j + 1])]
                else:
                    m.d.sync += sv[j].eq(0)
            with m.If(last):
                m.d.sync += emit.eq(0)
                if self.lanes == 1:
                    m.d.sync += clear.eq(1)
                else:
                    m.d.sync += [sv[j].eq(0) for j in range(K)]
        # One lane: the slots a pass leaves are emptied the cycle after its last victim,
        # from a register, so that the end's compare with `k` does not fan out to every
        # slot (94.86 MHz, 10.54 ns, 3.11 of logic when it did); a beat taken in that cycle
        # reaches slot 0 in the next.  With more lanes the clock is the broadcast insertion.
        if clear is not None:
            with m.If(clear):
                m.d.sync += [clear.eq(0)] + [sv[j].eq(0) for j in range(K)]
        return m

    def _systolic(self, m: Module, sv: list, sp: list, si: list, emit, count) -> None:
        """One lane: slot ``j`` compares the candidate in its input register (slot 0's is
        the beat register) with what it holds, keeps the better and writes the other to
        slot ``j + 1``'s input.  The beat's last candidate is in slot ``batch − 1``'s
        input ``batch − 1`` cycles after slot 0 took it: the pass emits after that drain."""
        K = self.batch
        hold = Signal()  # the beat register holds a candidate for slot 0
        g_elig = Signal()
        g_prio = Signal(self.q_bits, name="beat0_prio")
        g_addr = Signal(self.addr_bits)
        g_last = Signal()
        drain = Signal()  # the last beat has entered: it moves down the slots
        left = Signal(range(K))  # drain cycles after this one

        iv = [hold & g_elig] + [Signal(name=f"in{j}_valid") for j in range(1, K)]
        ip = [g_prio] + [Signal(self.q_bits, name=f"in{j}_prio") for j in range(1, K)]
        ii = [g_addr] + [Signal(self.index_bits, name=f"in{j}_index") for j in range(1, K)]
        for j in range(K):
            keep = Signal(name=f"slot{j}_takes")  # the input ranks before the slot
            m.d.comb += keep.eq(iv[j] & self._better(ip[j], ii[j], sv[j], sp[j], si[j]))
            with m.If(keep):
                m.d.sync += [sv[j].eq(1), sp[j].eq(ip[j]), si[j].eq(ii[j])]
            if j + 1 < K:  # the loser moves on; the last slot drops it
                m.d.sync += [
                    iv[j + 1].eq(Mux(keep, sv[j], iv[j])),
                    ip[j + 1].eq(Mux(keep, sp[j], ip[j])),
                    ii[j + 1].eq(Mux(keep, si[j], ii[j])),
                ]

        drain_cycles = K - 1 - (self.defect == "skip_drain")
        with m.If(hold):
            m.d.sync += hold.eq(0)
            with m.If(g_last):
                if drain_cycles <= 0:
                    m.d.sync += [emit.eq(1), count.eq(0)]
                else:
                    m.d.sync += [drain.eq(1), left.eq(drain_cycles - 1)]
        with m.If(drain):
            m.d.sync += left.eq(left - 1)
            with m.If(left == 0):
                m.d.sync += [drain.eq(0), emit.eq(1), count.eq(0)]

        m.d.comb += self.cand.ready.eq(~emit & ~drain & ~(hold & g_last))
        with m.If(self.cand.valid & self.cand.ready):
            m.d.sync += [
                hold.eq(1),
                g_elig.eq(self.cand.payload.lane[0].eligible),
                g_prio.eq(self.cand.payload.lane[0].priority),
                g_addr.eq(self.cand.payload.addr),
                g_last.eq(self.cand.payload.last),
            ]

    def _broadcast(self, m: Module, sv: list, sp: list, si: list, emit, count) -> None:
        """More lanes: the lowest lane of the held beat that beats the last slot enters
        every slot's compare at once, the slots below it shift down."""
        K, lanes = self.batch, self.lanes
        hold = Signal()  # a beat is being inserted
        pending = Signal(lanes)
        g_prio = [Signal(self.q_bits, name=f"beat{i}_prio") for i in range(lanes)]
        g_addr = Signal(self.addr_bits)
        g_last = Signal()

        # Lanes of the held beat that would enter the slots.
        idx = [Signal(self.index_bits, name=f"beat{i}_index") for i in range(lanes)]
        q = Signal(lanes)
        for i in range(lanes):
            m.d.comb += idx[i].eq(g_addr * lanes + i)
            m.d.comb += q[i].eq(
                pending[i] & self._better(g_prio[i], idx[i], sv[K - 1], sp[K - 1], si[K - 1])
            )
        first = Signal(lanes)
        m.d.comb += first.eq(q & (~q + 1))  # lowest set bit
        fin = Signal()
        m.d.comb += fin.eq((q & (q - 1)) == 0)  # at most one qualifying lane left
        cp = Signal(self.q_bits)
        ci = Signal(self.index_bits)
        insert = Signal()  # a candidate enters the slots this cycle (where gt says)
        for i in reversed(range(lanes)):  # the lowest qualifying lane wins
            with m.If(q[i]):
                m.d.comb += [cp.eq(g_prio[i]), ci.eq(idx[i])]
        m.d.comb += insert.eq(q != 0)

        with m.If(hold & ~emit):
            with m.If(insert):
                gt = [self._better(cp, ci, sv[j], sp[j], si[j]) for j in range(K)]
                for j in range(K):
                    take_cand = gt[j] if j == 0 else gt[j] & ~gt[j - 1]
                    with m.If(take_cand):
                        m.d.sync += [sv[j].eq(1), sp[j].eq(cp), si[j].eq(ci)]
                    if j > 0:
                        with m.Elif(gt[j - 1]):
                            m.d.sync += [
                                sv[j].eq(sv[j - 1]),
                                sp[j].eq(sp[j - 1]),
                                si[j].eq(si[j - 1]),
                            ]
            m.d.sync += pending.eq(q & ~first)
            with m.If(fin):
                m.d.sync += hold.eq(0)
                with m.If(g_last):
                    m.d.sync += [emit.eq(1), count.eq(0)]

        m.d.comb += self.cand.ready.eq(~emit & (~hold | (fin & ~g_last)))
        with m.If(self.cand.valid & self.cand.ready):
            m.d.sync += [
                hold.eq(1),
                pending.eq(Const(0, lanes) | self._eligible_mask()),
                g_addr.eq(self.cand.payload.addr),
                g_last.eq(self.cand.payload.last),
            ]
            m.d.sync += [g_prio[i].eq(self.cand.payload.lane[i].priority) for i in range(lanes)]

    def _eligible_mask(self):

        return Cat(*(self.cand.payload.lane[i].eligible for i in range(self.lanes)))
