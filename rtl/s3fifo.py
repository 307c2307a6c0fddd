"""S3FifoEngine: S3-FIFO's small and main queues over linked slots, and an exact ghost.

The golden step is :mod:`kvcxl.firmware.golden_s3fifo` (commands, the two queues, the
ghost, the walk); this is that step in hardware, one command at a time on ``cmd`` (the
slot-queue engine's command layout, ``arg`` wide enough for an entry id) and the victims
of each WALK on ``victim``.

Per slot, four memories with one write port each: ``meta`` (counter, fresh, offered, the
queue: 0 none, 1 small, 2 main), ``newer`` and ``older`` (both queues' links: a slot is in
one queue at a time; ``NONE`` = ``slots``) and ``idm`` (its entry id).  Per id, three:
``gmeta`` (in the ghost, ``back``: it was when last admitted), ``gnewer`` and ``golder``
(the ghost's links; ``GNONE`` = ``ids``).  Registers: each list's head and tail, the
counts of small, main, offered slots and ghost ids, the four SET parameters, ``evicted``.

All seven are block RAM, read synchronously, each word registered once more
(:func:`kvcxl.rtl.slot_queue.block_ram`, CLOCK's form), so that no decision starts at a
RAM's clock-to-out: a slot's words (``idm`` with them) are there two cycles after its
address, an id's ghost words too; a write to that word in the address's cycle is
forwarded.  Main's share, small's fill and small's threshold are compared beforehand,
registered or narrowed (ECP5-85F: 105.01 MHz at 1 024 slots and 4 096 ids, against 36.74
with the slot links in LUT RAM read combinationally).

A walk keeps a cursor per queue (small's and main's oldest slot not yet looked at) and
steps each past slots not offered before it decides (``s_ok``, ``m_ok``: the cursor is on
an offered slot or past the head), as the firmware's cursors do; the look that settles a
cursor on an offered slot decides on it at once when the turn is that queue's.  A move
links the slot at main's head, so main's cursor meets the moved slots after main's own,
in the order they moved: the firmware's order.

Cycles, from a command taken to the next one taken: SET 1; TOUCH / RESET / OFFER /
REMOVE 2 (the slot's words read, then written as the next command is taken); ADMIT 2
(the id's ghost words read, then written); INSERT 2 (its newer link; then its ghost
word's ``back`` places it in small or main and links it).  A walk 1 to start, then 3 per
slot looked at (the cursor chosen, the read, the decision): 2 per slot stepped past, 2
to look again at the slot last read, 1 for main's head decided again (its words held);
2 more per move (its links), 2-4 more per small victim (into the ghost, the oldest id
out; none with no ghost kept) and 1 per victim handed over (``victim`` ready).

``visit`` taps every decision as golden_clock's engines do, with ``VISIT_PROMOTE`` for a
slot small moves to main (``VISIT_DECREMENT``: main's move to its head); ``placed`` taps
the queue each INSERT chooses (``main``), for the formal check of the ghost.

Planted defects (``defect=``; named apart from CLOCK's, since a defect names its check):
``offer_ignored`` (the walk ignores the offered bit), ``stuck_cursor`` (a cursor does not
step past a slot it may not evict), ``main_clears``
(main's move sets the counter to 0, not min(counter, 3) − 1), ``ghost_to_small`` (an id
found in the ghost enters small, not main).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import Out

from kvcxl.firmware import golden_s3fifo as gs
from kvcxl.firmware.policies.s3fifo import MAIN_CAP

from . import layouts as L
from .slot_queue import block_ram, entry_cases, hand_over

DEFECTS = (None, "offer_ignored", "stuck_cursor", "main_clears", "ghost_to_small")
REF_BITS = 5  # the counter's ceiling is max(threshold, 3) <= 16
Op, P, SMALL, MAIN = gs.Op, gs.Param, gs.SMALL, gs.MAIN


def main_down(ref: Value) -> Value:
    """min(``ref``, MAIN_CAP) − 1 for a counter ``ref`` above 0, without a carry chain: 2 at
    3 or more, else ``ref``'s bit 1 (1 → 0, 2 → 1)."""
    assert MAIN_CAP == 3, MAIN_CAP  # the bit form below is for a cap of 3
    big = (ref[2:] != 0) | (ref[0] & ref[1]) if len(ref) > 2 else ref[0] & ref[1]
    return Mux(big, MAIN_CAP - 1, ref[1])


def arg_bits(slots: int, ids: int, ref_bits: int = REF_BITS) -> int:
    """``arg``'s width: a victim count (<= slots), an entry id, a SET value (small's fill at
    most slots + 1, the ghost's length at most ids, the threshold at most 2**ref_bits − 1:
    16 at the default width)."""
    return max((slots + 1).bit_length(), ids.bit_length(), ref_bits)


class S3FifoEngine(wiring.Component):
    def __init__(
        self, slots: int, ids: int, *, ref_bits: int = REF_BITS, defect: str | None = None
    ):
        if defect not in DEFECTS:
            raise ValueError(f"defect = {defect!r}: must be one of {DEFECTS}")
        if slots < 1 or ids < 1:
            raise ValueError(f"slots = {slots}, ids = {ids}: each must be >= 1")
        self.slots, self.ids, self.defect, self.ref_bits = slots, ids, defect, ref_bits
        # a SET names its parameter in the slot field: at least 2 bits for the four
        self.index_bits = max((slots - 1).bit_length(), 2)
        self.id_bits = max((ids - 1).bit_length(), 1)
        self.arg_bits = arg_bits(slots, ids, ref_bits)
        members = L.slot_engine_members(self.index_bits, self.arg_bits, ref_bits, MAIN_CAP)
        placed = wiring.Signature({"valid": Out(1), "main": Out(1)})
        super().__init__({**members, "placed": Out(placed)})

    def elaborate(self, platform):
        m = Module()
        N, NONE, GNONE = self.slots, self.slots, self.ids
        pb, gb = N.bit_length(), self.ids.bit_length()
        meta_l = data.StructLayout(
            {"ref": unsigned(self.ref_bits), "fresh": 1, "offered": 1, "q": 2}
        )
        gmeta_l = data.StructLayout({"member": 1, "back": 1})
        # ra: the slot read, its words two cycles later; ga: the id read, its words the next
        ra, ga = Signal(pb), Signal(gb)
        cur, s_cur = Signal(pb), Signal(pb)
        m.d.comb += ra.eq(cur)  # unless a state names another slot: the walk's, kept in view
        wr, rd = {}, {}
        for name, shape, depth, addr, reg in (
            ("meta", meta_l, N, ra, True), ("newer", unsigned(pb), N, ra, True),
            ("older", unsigned(pb), N, ra, True),
            ("idm", unsigned(self.id_bits), N, ra, True),
            ("gmeta", gmeta_l, self.ids, ga, True),
            ("gnewer", unsigned(gb), self.ids, ga, True),
            ("golder", unsigned(gb), self.ids, ga, True),
        ):  # fmt: skip
            wr[name], rd[name] = block_ram(m, name, shape, depth, addr, registered=reg)
        rec, n_of, o_of = rd["meta"], rd["newer"], rd["older"]
        s_id, grec, gn_of, go_of = rd["idm"], rd["gmeta"], rd["gnewer"], rd["golder"]

        def put(mem, addr, value):
            m.d.comb += [wr[mem].addr.eq(addr), wr[mem].data.eq(value), wr[mem].en.eq(1)]

        # each list's head and tail: small's and main's over slots, the ghost's over ids
        heads = {q: Signal(pb, init=NONE, name=f"head{q}") for q in (SMALL, MAIN)}
        tails = {q: Signal(pb, init=NONE, name=f"tail{q}") for q in (SMALL, MAIN)}
        g_head, g_tail = Signal(gb, init=GNONE), Signal(gb, init=GNONE)
        count = {q: Signal(range(N + 1), name=f"count{q}") for q in (SMALL, MAIN)}
        n_off, n_ghost = Signal(range(N + 1)), Signal(range(self.ids + 1))
        par = {p: Signal(self.arg_bits, name=p.name.lower()) for p in P}
        # the threshold as wide as a counter and one bit more (a counter never reaches
        # 2**ref_bits): small's test on a slot's word is then a short compare
        top = 2**self.ref_bits
        thr = Signal(range(top + 1))
        evicted = Signal()
        m_cur, mover = Signal(pb), Signal(pb)
        cr = Signal.like(self.cmd.payload)  # the command taken, held until it is done
        s_ok, m_ok, in_small = Signal(), Signal(), Signal()
        on_small = Signal()  # the walk looks at small's cursor (else main's)
        left = Signal(range(N + 1))
        vic, vic_last, gid = Signal(self.index_bits), Signal(), Signal(self.id_bits)

        def unlink(nxt, old, head, tail, newer_mem, older_mem, none):
            """Write the neighbours of a node (its links ``nxt``, ``old``) past it."""
            with m.If(old == none):
                m.d.sync += tail.eq(nxt)
            with m.Else():
                put(newer_mem, old, nxt)
            with m.If(nxt == none):
                m.d.sync += head.eq(old)
            with m.Else():
                put(older_mem, nxt, old)

        def unlink_slot(q, counted=True):
            unlink(n_of, o_of, heads[q], tails[q], "newer", "older", NONE)
            if counted:
                m.d.sync += count[q].eq(count[q] - 1)

        def write_meta(s, ref, fresh, offered, q):
            m.d.comb += wr["meta"].addr.eq(s), wr["meta"].en.eq(1)
            m.d.comb += [
                wr["meta"].data.ref.eq(ref), wr["meta"].data.fresh.eq(fresh),
                wr["meta"].data.offered.eq(offered), wr["meta"].data.q.eq(q),
            ]  # fmt: skip

        def to_head(s):
            """Move slot ``s`` (unlinked this cycle) to main's head: OWN writes its links,
            LINK the old head's (one write port per memory: the unlink takes this cycle)."""
            m.d.sync += mover.eq(s)
            m.next = "OWN"

        def link_head(q):
            """Slot ``mover`` (its own links written) becomes queue ``q``'s head."""
            with m.If(heads[q] == NONE):
                m.d.sync += tails[q].eq(mover)
            with m.Else():
                put("newer", heads[q], mover)
            m.d.sync += heads[q].eq(mover)

        def tap(kind, s):
            m.d.comb += [
                self.visit.valid.eq(1), self.visit.payload.kind.eq(kind),
                self.visit.payload.slot.eq(s),
            ]  # fmt: skip

        def look(s, small):
            """Read slot ``s`` for the walk's next look at small's (``small``) or main's
            cursor: two cycles, WLOAD, then WDECIDE."""
            m.d.comb += ra.eq(s)
            m.d.sync += [cur.eq(s), on_small.eq(small)]
            m.next = "WLOAD"

        def small_decides():
            """Small's decision on its cursor's slot ``cur``: to main's head with counter 0
            at or above the threshold, else the victim (its id then enters the ghost)."""
            m.d.sync += [s_cur.eq(n_of), s_ok.eq(0)]
            with m.If(rec.ref >= thr):
                tap(L.VISIT_PROMOTE, cur)
                write_meta(cur, 0, rec.fresh, rec.offered, MAIN)
                unlink_slot(SMALL)
                m.d.sync += [count[MAIN].eq(count[MAIN] + 1), in_small.eq(1)]
                with m.If(m_cur == NONE):  # main's cursor past its head: here now
                    m.d.sync += m_cur.eq(cur)
                to_head(cur)
            with m.Else():
                self._victim(m, tap, write_meta, unlink_slot, SMALL, cur, rec, n_off, left,
                             vic, vic_last)  # fmt: skip
                m.d.sync += [in_small.eq(0), gid.eq(s_id)]
                m.next = "GID"
                with m.If(par[P.GHOST_LEN] == 0):  # no ghost kept: nothing to read
                    m.next = "EMIT"

        c, v = self.cmd.payload, self.victim

        def take():
            """Take the next command: its slot read now (its words two cycles later, in
            EXEC), its id's ghost words the next cycle, when ADMIT and INSERT use them."""
            m.d.comb += [ra.eq(c.slot), ga.eq(c.arg), self.cmd.ready.eq(1)]
            with m.If(self.cmd.valid):
                m.d.sync += cr.eq(c)
                with m.Switch(c.op):
                    with m.Case(Op.SET):
                        with m.Switch(c.slot):
                            for p in P:
                                with m.Case(p):
                                    m.d.sync += par[p].eq(c.arg)
                        with m.If(c.slot == P.THRESHOLD):
                            m.d.sync += thr.eq(Mux(c.arg >= top, top, c.arg))
                        m.next = "IDLE"
                    with m.Case(Op.ADMIT):
                        m.next = "AWAIT"
                    with m.Case(Op.INSERT):  # placed in OWN, its id's `back` read by then
                        put("idm", c.slot, c.arg)
                        m.d.sync += mover.eq(c.slot)
                        m.next = "IWAIT"
                    with m.Case(Op.WALK):  # started once the command before has moved the ends
                        m.next = "WSTART"
                    with m.Default():
                        m.next = "LOAD"
            with m.Else():
                m.next = "IDLE"

        # whose turn it is, from registers alone: a cursor past its queue's head is settled
        s_set, m_set = s_ok | (s_cur == NONE), m_ok | (m_cur == NONE)
        # main over its share, registered: counts and parameters move at least two cycles
        # before a look uses it (a decision's effects land while the next slot is read)
        over = Signal()
        m.d.sync += over.eq(count[MAIN] > par[P.MAIN_MAX])
        # small at its fill, registered for PLACE: counts and parameters move at least a
        # cycle before (an INSERT is placed two cycles after it is taken)
        full = Signal()
        m.d.sync += full.eq(count[SMALL] >= par[P.SMALL_FULL])
        main_turn = (over | (s_cur == NONE)) & (m_cur != NONE)
        from_small = (in_small & (s_cur != NONE)) | ~main_turn
        # ... and, the cursor looked at standing on an offered slot, whether it decides now
        small_now = m_set & (in_small | ~(over & (m_cur != NONE)))
        main_now = s_set & ~(in_small & (s_cur != NONE)) & (over | (s_cur == NONE))

        with m.FSM():
            with m.State("IDLE"):
                take()
            with m.State("LOAD"):  # the slot's words come out of the block RAM
                m.next = "EXEC"
            with m.State("EXEC"):
                with m.Switch(cr.op):
                    entry_cases(m, cr, rec, rec.q, rec.q != 0, write_meta, n_off, self.ref_max)
                    with m.Case(Op.REMOVE):
                        with m.If(rec.q != 0):
                            with m.If(rec.q == MAIN):
                                unlink_slot(MAIN)
                            with m.Else():
                                unlink_slot(SMALL)
                            write_meta(cr.slot, rec.ref, rec.fresh, 0, 0)
                            m.d.sync += n_off.eq(n_off - rec.offered)
                take()
            with m.State("AWAIT"):  # the id's ghost words come out of the block RAM
                m.next = "ADMIT"
            with m.State("IWAIT"):  # an INSERT's slot: none newer (as the head of its queue)
                put("newer", mover, NONE)
                m.next = "PLACE"
            with m.State("ADMIT"):  # the id leaves the ghost; the next command is taken
                put("gmeta", cr.arg, Cat(Const(0, 1), grec.member))
                with m.If(grec.member):
                    unlink(gn_of, go_of, g_head, g_tail, "gnewer", "golder", GNONE)
                    m.d.sync += n_ghost.eq(n_ghost - 1)
                take()  # its writes are the slots' memories' and idm's, ADMIT's the ghost's
            with m.State("PLACE"):  # its id's ghost words are here: small or main
                back = 0 if self.defect == "ghost_to_small" else grec.back
                warm = ~evicted & full
                q = Mux(back | warm, MAIN, SMALL)  # main on a ghost hit, or while warming up
                write_meta(mover, 0, 1, 0, q)
                m.d.comb += [self.placed.valid.eq(1), self.placed.main.eq(q == MAIN)]
                for qq in (SMALL, MAIN):
                    with m.If(q == qq):
                        m.d.sync += count[qq].eq(count[qq] + 1)
                        put("older", mover, heads[qq])
                        link_head(qq)
                take()  # its writes forwarded to the slot the next command reads
            with m.State("OWN"):  # a moved slot's own links: after main's head, none newer
                put("older", mover, heads[MAIN])
                put("newer", mover, NONE)
                m.next = "LINK"
            with m.State("LINK"):  # then it is main's head
                link_head(MAIN)
                m.next = "WALK"
            with m.State("WSTART"):  # small's oldest slot looked at first (main's if none)
                m.d.sync += [
                    left.eq(Mux(cr.arg < n_off, cr.arg, n_off)), s_cur.eq(tails[SMALL]),
                    m_cur.eq(tails[MAIN]), s_ok.eq(0), m_ok.eq(0), in_small.eq(0),
                    evicted.eq(evicted | (cr.arg != 0)),
                ]  # fmt: skip
                some = tails[SMALL] != NONE
                look(Mux(some, tails[SMALL], tails[MAIN]), some)
                with m.If((cr.arg == 0) | (n_off == 0)):  # none to take, without the compare
                    m.next = "EMPTY"
            with m.State("WALK"):  # the next look: a cursor to settle, else whose turn it is
                small = ~s_set | (m_set & from_small)
                target = Mux(small, s_cur, m_cur)
                m.d.sync += [s_ok.eq(s_set), m_ok.eq(m_set)]
                # the slot looked at last: its words on their way (every state before this one
                # names `cur`; a look at another slot goes to WLOAD), no write since forwarded
                with m.If(target == cur):
                    m.d.sync += on_small.eq(small)
                    m.next = "WDECIDE"
                with m.Else():
                    look(target, small)
            with m.State("WLOAD"):
                m.next = "WDECIDE"
            with m.State("WDECIDE"):  # `cur`'s words, at small's cursor or main's
                m.d.comb += ga.eq(s_id)  # its id's ghost words, for GHOST if it is small's victim
                offered = rec.offered if self.defect != "offer_ignored" else rec.q != 0
                with m.If(cur == NONE):  # past the head: settled
                    m.next = "WALK"
                with m.Elif(~offered):  # step past it
                    tap(L.VISIT_SKIP, cur)
                    step = cur if self.defect == "stuck_cursor" else n_of
                    with m.If(on_small):
                        m.d.sync += [s_cur.eq(step), s_ok.eq(0)]
                    with m.Else():
                        m.d.sync += [m_cur.eq(step), m_ok.eq(0)]
                    look(step, on_small)
                with m.Elif(on_small & small_now):
                    small_decides()
                with m.Elif(~on_small & main_now):
                    with m.If(rec.ref != 0):
                        tap(L.VISIT_DECREMENT, cur)
                        down = 0 if self.defect == "main_clears" else main_down(rec.ref)
                        write_meta(cur, down, rec.fresh, rec.offered, MAIN)
                        with m.If(cur != heads[MAIN]):
                            unlink_slot(MAIN, counted=False)
                            m.d.sync += [m_cur.eq(n_of), m_ok.eq(0)]
                            to_head(cur)
                        with m.Else():  # the head stays and is decided on again next
                            # cycle, its words held (the counter as written), not read again
                            m.d.sync += [rec.eq(rec), n_of.eq(n_of), o_of.eq(o_of)]
                            m.d.sync += rec.ref.eq(down)
                    with m.Else():
                        self._victim(m, tap, write_meta, unlink_slot, MAIN, cur, rec,
                                     n_off, left, vic, vic_last)  # fmt: skip
                        m.d.sync += [m_cur.eq(n_of), m_ok.eq(0)]
                        m.next = "EMIT"
                with m.Else():  # settled, the other cursor's turn or still to settle
                    with m.If(on_small):
                        m.d.sync += s_ok.eq(1)
                    with m.Else():
                        m.d.sync += m_ok.eq(1)
                    m.next = "WALK"
            with m.State("GID"):  # the victim's id's ghost words, read as it was decided on
                m.next = "GHOST"
            with m.State("GHOST"):  # id `gid` enters the ghost unless it is there or none kept
                with m.If((par[P.GHOST_LEN] == 0) | grec.member):
                    m.next = "EMIT"
                with m.Else():
                    put("gmeta", gid, Cat(Const(1, 1), grec.back))
                    put("golder", gid, g_head)
                    put("gnewer", gid, GNONE)
                    m.next = "GLINK"
                # the oldest id's words, read now for GDROP (the ghost is not empty when it
                # drops: it holds more than its length, at least 1)
                m.d.comb += ga.eq(g_tail)
            with m.State("GLINK"):
                with m.If(g_head == GNONE):
                    m.d.sync += g_tail.eq(gid)
                with m.Else():
                    put("gnewer", g_head, gid)
                m.d.sync += [g_head.eq(gid), n_ghost.eq(n_ghost + 1)]
                with m.If(n_ghost + 1 > par[P.GHOST_LEN]):
                    m.next = "GDROP"
                with m.Else():
                    m.next = "EMIT"
            with m.State("GDROP"):  # the oldest id leaves
                # its newer id as read in GHOST, or `gid` if it was the only one (GLINK then
                # linked `gid` after it)
                nxt = Mux(gn_of == GNONE, gid, gn_of)
                put("gmeta", g_tail, Cat(Const(0, 1), grec.back))
                put("golder", nxt, GNONE)
                m.d.sync += [g_tail.eq(nxt), n_ghost.eq(n_ghost - 1)]
                m.next = "EMIT"
            hand_over(m, v, vic, vic_last, [])
        return m

    @staticmethod
    def _victim(m, tap, write_meta, unlink_slot, q, cur, rec, n_off, left, vic, vic_last):
        """Slot ``cur`` of queue ``q`` is the victim: out of its queue, handed over next."""
        tap(L.VISIT_VICTIM, cur)
        unlink_slot(q)
        write_meta(cur, rec.ref, rec.fresh, 0, 0)
        m.d.sync += [n_off.eq(n_off - rec.offered), left.eq(left - 1), vic.eq(cur),
                     vic_last.eq(left == 1)]  # fmt: skip
