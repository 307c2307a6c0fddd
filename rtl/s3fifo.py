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

The per-id memories and ``idm`` are block RAM, read synchronously: a word comes the cycle
after its address (:func:`kvcxl.rtl.slot_queue.block_ram`, not registered again), a
write to the same word in the address's cycle forwarded.  ``meta``, ``newer`` and
``older`` are read combinationally (LUT RAM), as the walk decides on a slot in the cycle
it names it.

A walk keeps a cursor per queue (small's and main's oldest slot not yet looked at) and
steps each past slots not offered before it decides (``s_ok``, ``m_ok``: the cursor is on
an offered slot or past the head), as the firmware's cursors do.  A move links the slot
at main's head, so main's cursor meets the moved slots after main's own, in the order
they moved: the firmware's order.

Cycles: SET / TOUCH / RESET / OFFER / REMOVE 1, ADMIT 2 (the ghost's words read, then
written; the next command taken in the second), INSERT 3 (its ghost word read as the
command is taken; its queue and links, then the old head's); a walk 1 per slot looked at
plus 1 for a cursor to settle on the slot it stands on, 2 more per move (its links), 2-4
more per small victim (its id read; the id into the ghost, the oldest id out; none with
no ghost kept) and 1 per victim handed over (``victim`` ready).

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

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out

from kvcxl.firmware import golden_s3fifo as gs
from kvcxl.firmware.policies.s3fifo import MAIN_CAP

from . import layouts as L
from .slot_queue import block_ram, entry_cases, hand_over

DEFECTS = (None, "offer_ignored", "stuck_cursor", "main_clears", "ghost_to_small")
REF_BITS = 5  # the counter's ceiling is max(threshold, 3) <= 16
Op, P, SMALL, MAIN = gs.Op, gs.Param, gs.SMALL, gs.MAIN


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
        mems = {
            "meta": Memory(shape=meta_l, depth=N, init=[]),
            "newer": Memory(shape=unsigned(pb), depth=N, init=[]),
            "older": Memory(shape=unsigned(pb), depth=N, init=[]),
        }
        for name, mem in mems.items():
            m.submodules[name] = mem
        rd = {k: v.read_port(domain="comb") for k, v in mems.items()}
        wr = {k: v.write_port() for k, v in mems.items()}
        ra, ga = Signal(pb), Signal(gb)  # the slot read this cycle; the id read (block RAM)
        s_cur = Signal(pb)
        for k in ("meta", "newer", "older"):
            m.d.comb += rd[k].addr.eq(ra)
        rec, n_of, o_of = rd["meta"].data, rd["newer"].data, rd["older"].data
        # The ghost and the slots' ids in block RAM (slot_queue.block_ram), each word the
        # cycle after its address: the ghost's at ``ga``, a slot's id at small's cursor.
        for name, shape, depth, addr in (
            ("idm", unsigned(self.id_bits), N, s_cur), ("gmeta", gmeta_l, self.ids, ga),
            ("gnewer", unsigned(gb), self.ids, ga), ("golder", unsigned(gb), self.ids, ga),
        ):  # fmt: skip
            wr[name], rd[name] = block_ram(m, name, shape, depth, addr, registered=False)
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
        evicted = Signal()
        m_cur, mover = Signal(pb), Signal(pb)
        cr = Signal.like(self.cmd.payload)  # an ADMIT, while its id's ghost words are read
        inserting = Signal()  # OWN places an INSERT's slot (its id's ghost words read)
        s_ok, m_ok, in_small, walking = Signal(), Signal(), Signal(), Signal()
        link_q = Signal(2)  # the queue `mover` joins
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

        def unlink_any():
            """Unlink the slot read this cycle from whichever queue holds it."""
            with m.If(rec.q == MAIN):
                unlink_slot(MAIN)
            with m.Else():
                unlink_slot(SMALL)

        def write_meta(s, ref, fresh, offered, q):
            m.d.comb += wr["meta"].addr.eq(s), wr["meta"].en.eq(1)
            m.d.comb += [
                wr["meta"].data.ref.eq(ref), wr["meta"].data.fresh.eq(fresh),
                wr["meta"].data.offered.eq(offered), wr["meta"].data.q.eq(q),
            ]  # fmt: skip

        def to_head(s, q):
            """Link slot ``s`` (in no list) at queue ``q``'s head: OWN writes its links, LINK
            the old head's (one write port per memory: a move's unlink takes this cycle)."""
            m.d.sync += [mover.eq(s), link_q.eq(q)]
            m.next = "OWN"

        def tap(kind, s):
            m.d.comb += [
                self.visit.valid.eq(1), self.visit.payload.kind.eq(kind),
                self.visit.payload.slot.eq(s),
            ]  # fmt: skip

        c, v = self.cmd.payload, self.victim

        def take():
            """Take the next command: its slot read now (LUT RAM), its id's ghost words
            (block RAM) there the next cycle, when ADMIT and INSERT use them."""
            m.d.comb += [ra.eq(c.slot), ga.eq(c.arg), self.cmd.ready.eq(1)]
            with m.If(self.cmd.valid):
                with m.Switch(c.op):
                    with m.Case(Op.SET):
                        with m.Switch(c.slot):
                            for p in P:
                                with m.Case(p):
                                    m.d.sync += par[p].eq(c.arg)
                    with m.Case(Op.ADMIT):
                        m.d.sync += cr.eq(c)
                        m.next = "ADMIT"
                    with m.Case(Op.INSERT):  # placed in OWN, its id's `back` read by then
                        put("idm", c.slot, c.arg)
                        m.d.sync += [mover.eq(c.slot), inserting.eq(1), walking.eq(0)]
                        m.next = "OWN"
                    entry_cases(m, c, rec, rec.q, rec.q != 0, write_meta, n_off, self.ref_max)
                    with m.Case(Op.REMOVE):
                        with m.If(rec.q != 0):
                            unlink_any()
                            write_meta(c.slot, rec.ref, rec.fresh, 0, 0)
                            m.d.sync += n_off.eq(n_off - rec.offered)
                    with m.Case(Op.WALK):
                        kk = Mux(c.arg < n_off, c.arg, n_off)
                        m.d.sync += [
                            left.eq(kk), s_cur.eq(tails[SMALL]), m_cur.eq(tails[MAIN]),
                            s_ok.eq(0), m_ok.eq(0), in_small.eq(0), walking.eq(1),
                            evicted.eq(evicted | (c.arg != 0)),
                        ]  # fmt: skip
                        m.next = "WALK"
                        with m.If(kk == 0):
                            m.next = "EMPTY"

        with m.FSM():
            with m.State("IDLE"):
                take()
            with m.State("ADMIT"):  # the id leaves the ghost; the next command is taken
                m.next = "IDLE"
                put("gmeta", cr.arg, Cat(Const(0, 1), grec.member))
                with m.If(grec.member):
                    unlink(gn_of, go_of, g_head, g_tail, "gnewer", "golder", GNONE)
                    m.d.sync += n_ghost.eq(n_ghost - 1)
                take()  # its writes are the slots' memories' and idm's, ADMIT's the ghost's
            with m.State("OWN"):
                with m.If(inserting):  # main on a ghost hit, or while warming up
                    back = 0 if self.defect == "ghost_to_small" else grec.back
                    warm = ~evicted & (count[SMALL] >= par[P.SMALL_FULL])
                    q = Mux(back | warm, MAIN, SMALL)
                    write_meta(mover, 0, 1, 0, q)
                    m.d.comb += [self.placed.valid.eq(1), self.placed.main.eq(q == MAIN)]
                    with m.If(q == MAIN):
                        m.d.sync += count[MAIN].eq(count[MAIN] + 1)
                    with m.Else():
                        m.d.sync += count[SMALL].eq(count[SMALL] + 1)
                    m.d.sync += [link_q.eq(q), inserting.eq(0)]
                    put("older", mover, Mux(q == MAIN, heads[MAIN], heads[SMALL]))
                with m.Else():
                    put("older", mover, Mux(link_q == MAIN, heads[MAIN], heads[SMALL]))
                put("newer", mover, NONE)
                m.next = "LINK"
            with m.State("LINK"):  # link `mover` at its queue's head (its own links are set)
                for q in (SMALL, MAIN):
                    with m.If(link_q == q):
                        with m.If(heads[q] == NONE):
                            m.d.sync += tails[q].eq(mover)
                        with m.Else():
                            put("newer", heads[q], mover)
                        m.d.sync += heads[q].eq(mover)
                m.next = "IDLE"
                with m.If(walking):
                    m.next = "WALK"
            with m.State("WALK"):
                offered = rec.offered if self.defect != "offer_ignored" else rec.q != 0
                main_turn = ((count[MAIN] > par[P.MAIN_MAX]) | (s_cur == NONE)) & (m_cur != NONE)
                from_small = (in_small & (s_cur != NONE)) | ~main_turn
                with m.If(~s_ok):  # step small's cursor to an offered slot (or past the head)
                    self._step(m, ra, s_cur, s_ok, offered, n_of, NONE, tap)
                with m.Elif(~m_ok):
                    self._step(m, ra, m_cur, m_ok, offered, n_of, NONE, tap)
                with m.Elif(from_small):
                    m.d.comb += ra.eq(s_cur)
                    m.d.sync += [s_cur.eq(n_of), s_ok.eq(0)]
                    with m.If(rec.ref >= par[P.THRESHOLD]):  # to main's head, counter 0
                        tap(L.VISIT_PROMOTE, s_cur)
                        write_meta(s_cur, 0, rec.fresh, rec.offered, MAIN)
                        unlink_slot(SMALL)
                        m.d.sync += [count[MAIN].eq(count[MAIN] + 1), in_small.eq(1)]
                        with m.If(m_cur == NONE):
                            m.d.sync += m_cur.eq(s_cur)
                        to_head(s_cur, MAIN)
                    with m.Else():  # the victim; its id enters the ghost
                        self._victim(m, tap, write_meta, unlink_slot, SMALL, s_cur, rec,
                                     n_off, left, vic, vic_last)  # fmt: skip
                        m.d.sync += in_small.eq(0)
                        m.next = "GID"
                        with m.If(par[P.GHOST_LEN] == 0):  # no ghost kept: nothing to read
                            m.next = "EMIT"
                with m.Else():
                    m.d.comb += ra.eq(m_cur)
                    with m.If(rec.ref != 0):
                        tap(L.VISIT_DECREMENT, m_cur)
                        down = (
                            0
                            if self.defect == "main_clears"
                            else (Mux(rec.ref > MAIN_CAP, MAIN_CAP, rec.ref) - 1)
                        )
                        write_meta(m_cur, down, rec.fresh, rec.offered, MAIN)
                        with m.If(m_cur != heads[MAIN]):  # the head moves to the head: stays
                            unlink_slot(MAIN, counted=False)
                            m.d.sync += [m_cur.eq(n_of), m_ok.eq(0)]
                            to_head(m_cur, MAIN)
                    with m.Else():
                        self._victim(m, tap, write_meta, unlink_slot, MAIN, m_cur, rec,
                                     n_off, left, vic, vic_last)  # fmt: skip
                        m.d.sync += [m_cur.eq(n_of), m_ok.eq(0)]
                        m.next = "EMIT"
            with m.State("GID"):  # the victim's id (read at small's cursor): its ghost words
                m.d.comb += ga.eq(s_id)
                m.d.sync += gid.eq(s_id)
                m.next = "GHOST"
            with m.State("GHOST"):  # id `gid` enters the ghost unless it is there or none kept
                with m.If((par[P.GHOST_LEN] == 0) | grec.member):
                    m.next = "EMIT"
                with m.Else():
                    put("gmeta", gid, Cat(Const(1, 1), grec.back))
                    put("golder", gid, g_head)
                    put("gnewer", gid, GNONE)
                    m.next = "GLINK"
            with m.State("GLINK"):
                with m.If(g_head == GNONE):
                    m.d.sync += g_tail.eq(gid)
                with m.Else():
                    put("gnewer", g_head, gid)
                m.d.sync += [g_head.eq(gid), n_ghost.eq(n_ghost + 1)]
                # the oldest id's words are read now (gnewer's write above forwarded)
                m.d.comb += ga.eq(Mux(g_head == GNONE, gid, g_tail))
                with m.If(n_ghost + 1 > par[P.GHOST_LEN]):
                    m.next = "GDROP"
                with m.Else():
                    m.next = "EMIT"
            with m.State("GDROP"):  # the oldest id leaves
                put("gmeta", g_tail, Cat(Const(0, 1), grec.back))
                with m.If(gn_of == GNONE):
                    m.d.sync += g_head.eq(GNONE)
                with m.Else():
                    put("golder", gn_of, GNONE)
                m.d.sync += [g_tail.eq(gn_of), n_ghost.eq(n_ghost - 1)]
                m.next = "EMIT"
            hand_over(m, v, vic, vic_last, [])
        return m

    def _step(self, m, ra, cur, ok, offered, n_of, none, tap):
        """A cursor on a slot not offered steps to the next newer one (tapped as a skip)."""
        m.d.comb += ra.eq(cur)
        with m.If((cur == none) | offered):
            m.d.sync += ok.eq(1)
        with m.Else():
            tap(L.VISIT_SKIP, cur)
            if self.defect != "stuck_cursor":
                m.d.sync += cur.eq(n_of)

    @staticmethod
    def _victim(m, tap, write_meta, unlink_slot, q, cur, rec, n_off, left, vic, vic_last):
        """Slot ``cur`` of queue ``q`` is the victim: out of its queue, handed over next."""
        tap(L.VISIT_VICTIM, cur)
        unlink_slot(q)
        write_meta(cur, rec.ref, rec.fresh, 0, 0)
        m.d.sync += [n_off.eq(n_off - rec.offered), left.eq(left - 1), vic.eq(cur),
                     vic_last.eq(left == 1)]  # fmt: skip
