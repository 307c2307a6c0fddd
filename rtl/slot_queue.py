"""SlotQueueEngine: CLOCK or SIEVE as a pointer walk over linked slots.

The golden step is :mod:`kvcxl.firmware.golden_clock` (commands, queue order, the walk);
this is that step in hardware, one command at a time on ``cmd`` and the victims of each
WALK on ``victim``.  Per slot, three memories with one write port each: ``meta``
(counter, fresh, offered, in-queue), ``newer`` and ``older`` (the queue's links; ``NONE``
= ``slots``).  Registers: ``head``, ``tail``, SIEVE's ``hand`` and the count of offered
slots, so that a WALK of ``k`` asks for min(k, offered) victims and always ends.

The memories are block RAM: read synchronously, each word registered once more
(:func:`block_ram`), so a decision starts at a flip-flop, not at the RAM's clock-to-out
(ECP5-85F: 108 MHz for CLOCK, 112 for SIEVE at 1 024 slots, against 48 and 46 with the
links in LUT RAM read combinationally).  A slot's words are there two cycles after its
address; a write to that slot in the cycle the address is taken is forwarded.

Cycles: a command is taken in the cycle the one before it ends; INSERT 2 (taken in IDLE,
one sooner: it writes in the cycle it is taken), TOUCH / RESET / OFFER / REMOVE 2 (the
slot read, then the write); a WALK 2 to start, then 2 per slot visited (1 for a victim:
the next slot is read while it is handed over; 1 for CLOCK's look again at the head, its
words held), 2 more per CLOCK move to the head and per wrap from the head to the tail,
plus one per victim handed over (``victim`` ready).

``visit`` taps every slot the walk visits (valid exactly in the cycle it is decided,
never back-pressured): the formal harness checks each decision against its own copy of
the counters; tests can count them.

Planted defects for the formal checks (``defect=``): ``victim_unoffered`` (the walk
ignores the offered bit), ``stuck_hand`` (the walk does not step past a slot it may not
evict), ``clock_clears`` (CLOCK: a pass sets the counter to 0 instead of taking one off),
``keep_visited`` (SIEVE: a visited slot's bit is not cleared), ``clear_stays`` (SIEVE:
the hand stays on a slot whose bit it clears, so its next look takes that slot instead
of the next one).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory

from kvcxl.firmware import golden_clock as gc

from . import layouts as L

DEFECTS = (None, "victim_unoffered", "stuck_hand", "clock_clears", "keep_visited", "clear_stays")


class SlotQueueEngine(wiring.Component):
    def __init__(
        self,
        slots: int,
        policy: str = "clock",
        *,
        ref_bits: int = gc.REF_BITS,
        defect: str | None = None,
    ):
        if policy not in gc.POLICIES:
            raise ValueError(f"policy = {policy!r}: must be one of {', '.join(gc.POLICIES)}")
        if defect not in DEFECTS:
            raise ValueError(f"defect = {defect!r}: must be one of {DEFECTS}")
        if slots < 1:
            raise ValueError(f"slots = {slots}: must be >= 1")
        self.slots, self.policy, self.defect, self.ref_bits = slots, policy, defect, ref_bits
        self.index_bits = max((slots - 1).bit_length(), 1)
        self.ptr_bits = slots.bit_length()  # a slot or NONE (= slots)
        self.count_bits = slots.bit_length()  # 0 … slots victims
        super().__init__(L.slot_engine_members(self.index_bits, self.count_bits, ref_bits, 1))

    def elaborate(self, platform):
        m = Module()
        N, NONE, clock = self.slots, self.slots, self.policy == "clock"
        meta_l = data.StructLayout(
            {"ref": unsigned(self.ref_bits), "fresh": 1, "offered": 1, "inq": 1}
        )
        pb = self.ptr_bits
        ra = Signal(pb)  # the slot read: its words are in rec, n_of, o_of two cycles later
        (mw, rec), (nw, n_of), (ow, o_of) = (
            block_ram(m, name, shape, N, ra)
            for name, shape in (("meta", meta_l), ("newer", unsigned(pb)), ("older", unsigned(pb)))
        )

        head = Signal(pb, init=NONE)
        tail = Signal(pb, init=NONE)
        hand = Signal(pb, init=NONE)
        n_off = Signal(range(N + 1))
        cur, nxt, mover = Signal(pb), Signal(pb), Signal(pb)
        left = Signal(range(N + 1))
        keep = Signal()
        first = Signal()  # SIEVE: the walk's first look, at the hand (the tail if it left)
        vic = Signal(self.index_bits)
        vic_last = Signal()
        c = Signal(self.cmd.payload.shape())  # the command taken, held until it is done
        m.d.comb += ra.eq(nxt)  # while a victim is handed over: the slot after it

        def unlink(s):
            """Write the neighbours of slot ``s`` (its words in ``n_of``, ``o_of``) past it."""
            with m.If(o_of == NONE):
                m.d.sync += tail.eq(n_of)
            with m.Else():
                m.d.comb += [nw.addr.eq(o_of), nw.data.eq(n_of), nw.en.eq(1)]
            with m.If(n_of == NONE):
                m.d.sync += head.eq(o_of)
            with m.Else():
                m.d.comb += [ow.addr.eq(n_of), ow.data.eq(o_of), ow.en.eq(1)]

        def write_meta(s, ref, fresh, offered, inq):
            m.d.comb += [
                mw.addr.eq(s),
                mw.en.eq(1),
                mw.data.ref.eq(ref),
                mw.data.fresh.eq(fresh),
                mw.data.offered.eq(offered),
                mw.data.inq.eq(inq),
            ]

        def insert(s):
            """INSERT's first cycle: slot ``s`` fresh and in the queue, its links past the
            head (LINK then links it at the head)."""
            write_meta(s, 0, 1, 0, 1)
            m.d.comb += [
                ow.addr.eq(s), ow.data.eq(head), ow.en.eq(1),
                nw.addr.eq(s), nw.data.eq(NONE), nw.en.eq(1),
            ]  # fmt: skip
            m.d.sync += mover.eq(s)
            m.next = "LINK"

        def take(idle: bool = False):
            """Take the next command: its slot is read now, decided on two cycles later
            (INSERT reads nothing: from IDLE, whose write ports are free, it writes at once;
            a WALK reads its start in WSTART, once the command before it has moved the ends
            and the hand)."""
            p = self.cmd.payload
            m.d.comb += [self.cmd.ready.eq(1), ra.eq(p.slot)]
            with m.If(self.cmd.valid):
                m.d.sync += c.eq(p)
                with m.Switch(p.op):
                    with m.Case(Op.INSERT):
                        if idle:
                            insert(p.slot)
                        else:
                            m.next = "EXEC"
                    with m.Case(Op.WALK):
                        m.next = "WSTART"
                    with m.Default():
                        m.next = "LOAD"
            with m.Else():
                m.next = "IDLE"

        def look(s):
            """Read slot ``s`` for the walk's next look (two cycles: WLOAD, then WALK)."""
            m.d.comb += ra.eq(s)
            m.d.sync += cur.eq(s)
            m.next = "WLOAD"

        Op = gc.Op
        v = self.victim
        with m.FSM():
            with m.State("IDLE"):
                take(idle=True)
            with m.State("LOAD"):  # the slot's words come out of the block RAM
                m.next = "EXEC"
            with m.State("EXEC"):
                with m.Switch(c.op):
                    with m.Case(Op.INSERT):
                        insert(c.slot)
                    entry_cases(m, c, rec, rec.inq, rec.inq, write_meta, n_off, self.ref_max)
                    with m.Case(Op.REMOVE):
                        with m.If(rec.inq):
                            unlink(c.slot)
                            write_meta(c.slot, rec.ref, rec.fresh, 0, 0)
                            m.d.sync += n_off.eq(n_off - rec.offered)
                            with m.If(hand == c.slot):
                                m.d.sync += hand.eq(n_of)
                with m.If(c.op != Op.INSERT):
                    take()
            with m.State("LINK"):  # link `mover` at the head (its own links are written)
                with m.If(head == NONE):
                    m.d.sync += tail.eq(mover)
                with m.Else():
                    m.d.comb += [nw.addr.eq(head), nw.data.eq(mover), nw.en.eq(1)]
                m.d.sync += head.eq(mover)
                take()
            with m.State("WSTART"):
                kk = Mux(c.arg < n_off, c.arg, n_off)
                m.d.sync += [left.eq(kk), keep.eq(c.keep)]
                # SIEVE starts at its hand (the tail without one); read even when the walk
                # is empty, so that the read address does not wait for that test
                start = tail if clock else Mux(hand != NONE, hand, tail)
                look(start)
                if not clock:
                    m.d.sync += first.eq(hand != NONE)
                with m.If((c.arg == 0) | (n_off == 0)):  # kk = 0, without the compare
                    m.next = "EMPTY"
            with m.State("WLOAD"):
                m.next = "WALK"
            with m.State("WALK"):
                offered = rec.offered
                if self.defect == "victim_unoffered":
                    offered = rec.inq
                tap = self.visit
                m.d.sync += first.eq(0)
                with m.If(cur == NONE):  # past the head: wrap to the tail
                    look(tail)
                with m.Elif(first & ~rec.inq):  # SIEVE: the hand's slot left the queue
                    look(tail)
                with m.Elif(~offered):
                    m.d.comb += [tap.valid.eq(1), tap.payload.kind.eq(L.VISIT_SKIP)]
                    look(cur if self.defect == "stuck_hand" else n_of)
                with m.Elif(rec.ref != 0):
                    m.d.comb += [tap.valid.eq(1), tap.payload.kind.eq(L.VISIT_DECREMENT)]
                    if clock:
                        down = 0 if self.defect == "clock_clears" else rec.ref - 1
                        write_meta(cur, down, rec.fresh, rec.offered, rec.inq)
                        with m.If(cur != head):  # to the head: unlink, then link
                            unlink(cur)
                            m.d.sync += [mover.eq(cur), nxt.eq(n_of)]
                            m.next = "MOVE"
                        with m.Else():  # the head stays: looked at again next cycle,
                            # its words held (the counter as written), not read again
                            m.d.sync += [rec.eq(rec), n_of.eq(n_of), o_of.eq(o_of)]
                            m.d.sync += rec.ref.eq(down)
                    else:
                        if self.defect != "keep_visited":
                            write_meta(cur, 0, rec.fresh, rec.offered, rec.inq)
                        look(cur if self.defect == "clear_stays" else n_of)
                with m.Else():
                    m.d.comb += [tap.valid.eq(1), tap.payload.kind.eq(L.VISIT_VICTIM)]
                    unlink(cur)
                    write_meta(cur, rec.ref, rec.fresh, 0, 0)
                    m.d.comb += ra.eq(n_of)  # read during EMIT: the next look's words
                    m.d.sync += [
                        n_off.eq(n_off - rec.offered),
                        left.eq(left - 1),
                        vic.eq(cur),
                        vic_last.eq(left == 1),
                        nxt.eq(n_of),
                    ]
                    if not clock:
                        with m.If((left == 1) & ~keep):
                            m.d.sync += hand.eq(n_of)
                    m.next = "EMIT"
                m.d.comb += tap.payload.slot.eq(cur)
            with m.State("MOVE"):  # the moved slot's own links: after the head, none newer
                m.d.comb += [
                    ow.addr.eq(mover), ow.data.eq(head), ow.en.eq(1),
                    nw.addr.eq(mover), nw.data.eq(NONE), nw.en.eq(1),
                ]  # fmt: skip
                m.next = "MOVE2"
            with m.State("MOVE2"):
                m.d.comb += [nw.addr.eq(head), nw.data.eq(mover), nw.en.eq(1)]
                m.d.sync += head.eq(mover)
                look(nxt)
            hand_over(m, v, vic, vic_last, [cur.eq(nxt)])
        return m


def block_ram(m: Module, name: str, shape, depth: int, ra: Signal, registered: bool = True):
    """A memory read synchronously at ``ra`` (block RAM), its word registered once more
    (so that no decision starts at the RAM's clock-to-out): the word of the slot ``ra``
    named two cycles ago, written as of the end of that cycle (a write to the same slot in
    that cycle is forwarded). Not ``registered``: the word of the slot named one cycle ago,
    straight from the RAM (the forward a mux after it). The write port and the word."""
    mem = Memory(shape=shape, depth=depth, init=[])
    m.submodules[name] = mem
    rp, wp = mem.read_port(domain="sync"), mem.write_port()
    m.d.comb += rp.addr.eq(ra)
    ra_q, wa_q, we_q = Signal.like(ra), Signal.like(wp.addr), Signal()
    wd_q, word = Signal(shape), Signal(shape)
    m.d.sync += [ra_q.eq(ra), wa_q.eq(wp.addr), we_q.eq(wp.en), wd_q.eq(wp.data)]
    fwd = we_q & (wa_q == ra_q)  # the RAM reads before it writes
    d = m.d.sync if registered else m.d.comb
    d += word.eq(Mux(fwd, Value.cast(wd_q), Value.cast(rp.data)))
    return wp, word


def entry_cases(m, c, rec, place, queued, write_meta, n_off, ref_max) -> None:
    """The commands on one slot's counter and bits, as ``Case``s of a ``Switch`` on
    ``c.op`` (golden_clock's TOUCH, RESET, OFFER), for every slot-queue engine: ``rec`` is
    the slot's meta word, ``place`` what of it says where the slot is (written back as
    read), ``queued`` whether it is in a queue, ``write_meta(slot, ref, fresh, offered,
    place)`` writes the word."""
    Op = gc.Op
    with m.Case(Op.TOUCH):
        up = Mux(rec.ref >= ref_max, ref_max, rec.ref + 1)
        write_meta(c.slot, Mux(rec.fresh, rec.ref, up), 0, rec.offered, place)
    with m.Case(Op.RESET):
        write_meta(c.slot, 0, 0, rec.offered, place)
    with m.Case(Op.OFFER):
        on = c.arg[0] & queued
        write_meta(c.slot, rec.ref, rec.fresh, on, place)
        m.d.sync += n_off.eq(n_off + on - rec.offered)


def hand_over(m, v, vic, vic_last, taken: list) -> None:
    """A walk's last states, for every slot-queue engine: EMIT offers victim ``vic`` on
    ``v`` (``taken`` happens as it moves; then IDLE after the last, else WALK); EMPTY
    offers the empty beat of a walk with nothing to evict."""
    with m.State("EMIT"):
        m.d.comb += [v.valid.eq(1), v.payload.index.eq(vic), v.payload.last.eq(vic_last)]
        with m.If(v.ready):
            m.d.sync += taken
            with m.If(vic_last):
                m.next = "IDLE"
            with m.Else():
                m.next = "WALK"
    with m.State("EMPTY"):
        m.d.comb += [v.valid.eq(1), v.payload.last.eq(1), v.payload.empty.eq(1)]
        with m.If(v.ready):
            m.next = "IDLE"
