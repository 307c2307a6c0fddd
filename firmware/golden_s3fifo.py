"""The S3-FIFO golden step: the firmware's S3-FIFO as the RTL engine computes it.

The engine (``rtl/s3fifo.py``) keeps the resident entries in ``slots`` on two linked
queues over the slots, *small* and *main* (the lists and the per-slot counter, ``fresh``
and ``offered`` bits of :mod:`kvcxl.firmware.golden_clock`; a slot also records which
queue holds it and its entry id), and the ghost as a third linked list over entry *ids*
(``ids`` of them: a membership bit and two links per id), so that the ghost is exact: it
drops its oldest id when it grows past its length, and an id that comes back leaves it
from wherever it sits.  The host drives it with the commands of golden_clock plus two:

    SET p, v        a parameter (:class:`Param`): the move threshold, small's fill, main's
                    share, the ghost's length (integers the host derives from the
                    firmware's real-valued shares: :func:`settings`)
    ADMIT i         entry i is admitted: ``back[i]`` ← i in the ghost, and i leaves it
    INSERT s, i     slot s holds entry i: to main if ``back[i]`` or (no walk has asked for
                    a victim yet and small holds ``small_full`` or more), else to small;
                    counter 0, fresh, not offered
    TOUCH s         a read: fresh → not fresh; else counter + 1, saturating at ref_max
    RESET s         counter 0, not fresh
    OFFER s, b      offered ← b
    REMOVE s        unlink s from its queue
    WALK k          evict min(k, offered slots) victims; k > 0 marks the cache as having
                    evicted (the batch's own arrivals, which the host evicts, count too)

The walk is :class:`kvcxl.firmware.policies.s3fifo.S3FifoPolicy.walk` with its moves
made as it goes: from main while main holds more than ``main_max`` or small offers
nothing (unless main offers nothing): main's oldest offered slot with a counter above 0
is moved to main's head with min(counter, 3) − 1, one at 0 is the victim; otherwise
small's oldest offered slots, each with a counter ≥ the threshold moved to main's head
with counter 0, until one below it is the victim and its id enters the ghost.  The
firmware looks at main's live entries and then at those the walk moved, in the order they
moved; the linked main queue holds exactly that order, since a move links at the head.

ADMIT is separate from INSERT because the host holds a batch's arrivals back until the
walk is done (the batch rule of :mod:`kvcxl.firmware.policies.queued`), while the
firmware takes them out of the ghost when they arrive, before that walk adds ids to it.

``tests/test_golden_s3fifo.py`` replays random event sequences and whole traces through
it and requires the firmware's victims.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import IntEnum

import numpy as np

from . import golden_clock as gc
from .policies.s3fifo import MAIN_CAP

NONE = gc.NONE
Op = IntEnum("Op", {**{o.name: o.value for o in gc.Op}, "ADMIT": 6, "SET": 7})  # type: ignore[misc]
SMALL, MAIN = 1, 2  # a slot's queue (0: in none)


class Param(IntEnum):
    """What a SET command sets (its ``slot`` field)."""

    THRESHOLD = 0  # small's reuses that move an entry to main
    SMALL_FULL = 1  # small holds at least this many: full (ceil of the real share)
    MAIN_MAX = 2  # main holds more than this many: over its share (floor of the share)
    GHOST_LEN = 3  # ids the ghost keeps (0: no ghost)


def settings(capacity: int, small_ratio: float, ghost_ratio: float, threshold: int,
             ids: int) -> dict[Param, int]:  # fmt: skip
    """The integer parameters equal to the firmware's real-valued tests: n ≥ x ⇔ n ≥ ⌈x⌉
    and n > y ⇔ n > ⌊y⌋ for a whole n, with x and y computed as the firmware does; the
    ghost's length is at most ``ids`` (a ghost of every id never drops one)."""
    small = capacity * small_ratio
    return {
        Param.THRESHOLD: int(threshold),
        Param.SMALL_FULL: math.ceil(small),
        Param.MAIN_MAX: math.floor(capacity - small),
        Param.GHOST_LEN: min(int(capacity * ghost_ratio), ids),
    }


def ref_ceiling(threshold: int) -> int:
    """The counter's ceiling: saturating at max(threshold, 3) changes no test the walk makes
    (small's counter ≥ threshold, main's min(counter, 3))."""
    return max(int(threshold), MAIN_CAP)


class _List:
    """A linked list over ``n`` nodes, with golden_clock's link rules."""

    _link_head = gc.SlotQueue._link_head
    _unlink = gc.SlotQueue._unlink
    order = gc.SlotQueue.order  # tail (oldest) first

    def __init__(self, n: int) -> None:
        self.newer, self.older = [NONE] * n, [NONE] * n
        self.head = self.tail = NONE


class S3Queue:
    """The S3-FIFO engine's state and its commands."""

    def __init__(self, slots: int, ids: int, ref_ceiling: int) -> None:
        if slots < 1 or ids < 1:
            raise ValueError(f"slots = {slots}, ids = {ids}: each must be >= 1")
        self.slots, self.ids, self.ref_max = slots, ids, int(ref_ceiling)
        self.ref = np.zeros(slots, np.int64)
        self.fresh = np.zeros(slots, bool)
        self.offered = np.zeros(slots, bool)
        self.inq = np.zeros(slots, np.int8)  # the slot's queue (0: none)
        self.id_of = np.zeros(slots, np.int64)
        self.q = {SMALL: _List(slots), MAIN: _List(slots)}
        self.n = {SMALL: 0, MAIN: 0}
        self.ghost = _List(ids)
        self.member = np.zeros(ids, bool)
        self.back = np.zeros(ids, bool)
        self.n_ghost = self.n_offered = 0
        self.evicted = False
        self.param = dict.fromkeys(Param, 0)

    # --- one command ---------------------------------------------------------------------
    def set(self, p: int, v: int) -> None:
        self.param[Param(p)] = int(v)

    def admit(self, i: int) -> None:
        self.back[i] = self.member[i]
        if self.member[i]:
            self.ghost._unlink(i)
            self.member[i] = False
            self.n_ghost -= 1

    def insert(self, s: int, i: int) -> None:
        if self.inq[s]:
            raise ValueError(f"INSERT {s}: the slot is in a queue already")
        warm = not self.evicted and self.n[SMALL] >= self.param[Param.SMALL_FULL]
        self.id_of[s], self.ref[s], self.fresh[s], self.offered[s] = i, 0, True, False
        self._push(s, MAIN if self.back[i] or warm else SMALL)

    # golden_clock's rules: a read, a fresh start, the host's eligibility
    touch = gc.SlotQueue.touch
    reset = gc.SlotQueue.reset
    offer = gc.SlotQueue.offer

    def remove(self, s: int) -> None:
        if self.inq[s]:
            self.offer(s, False)
            self._pop(s)

    def walk(self, k: int) -> list[int]:
        """The victims (slots) of one walk, in eviction order."""
        self.evicted = self.evicted or k > 0
        left = min(int(k), self.n_offered)
        small, main = self.q[SMALL], self.q[MAIN]
        s_cur, m_cur = small.tail, main.tail
        in_small = False  # small's turn lasts until its victim (or until it offers nothing)
        out: list[int] = []
        while left:
            s_cur, m_cur = self._offered_from(s_cur, small), self._offered_from(m_cur, main)
            over = self.n[MAIN] > self.param[Param.MAIN_MAX]
            if (in_small and s_cur != NONE) or not ((over or s_cur == NONE) and m_cur != NONE):
                if s_cur == NONE:  # nothing offered in either queue (k never exceeds it)
                    raise AssertionError("s3fifo walk ran out of slots")
                s, s_cur = s_cur, small.newer[s_cur]
                if self.ref[s] >= self.param[Param.THRESHOLD]:
                    self.ref[s] = 0
                    self._pop(s)
                    self._push(s, MAIN)
                    m_cur = s if m_cur == NONE else m_cur
                    in_small = True
                else:
                    out.append(self._evict(s))
                    self._ghost_push(int(self.id_of[s]))
                    in_small = False
                    left -= 1
            else:
                s = m_cur
                if self.ref[s] > 0:
                    self.ref[s] = min(int(self.ref[s]), MAIN_CAP) - 1
                    if s != main.head:  # the head moves to the head: stays
                        m_cur = main.newer[s]
                        self._pop(s)
                        self._push(s, MAIN)
                else:
                    m_cur = main.newer[s]
                    out.append(self._evict(s))
                    left -= 1
        return out

    # --- a command list, as the driver sends it ---------------------------------------------
    def run(self, cmds: Iterable[tuple[int, int, int, int]]) -> list[int]:
        """Apply (op, slot, arg, flag) commands in order; the victims of their walks."""
        out: list[int] = []
        for op, s, arg, _ in cmds:
            if Op(op) == Op.WALK:
                out += self.walk(arg)
            else:
                _APPLY[Op(op)](self, s, arg)
        return out

    def order(self, q: int) -> list[int]:
        """Queue ``q`` (SMALL or MAIN), tail (oldest) first."""
        return self.q[q].order()

    def ghost_order(self) -> list[int]:
        """The ghost's ids, oldest first."""
        return self.ghost.order()

    # --- the queues ------------------------------------------------------------------------
    def _offered_from(self, s: int, lst: _List) -> int:
        """The first offered slot of ``lst`` from ``s`` on (the walk steps over the rest)."""
        while s != NONE and not self.offered[s]:
            s = lst.newer[s]
        return s

    def _push(self, s: int, q: int) -> None:
        self.q[q]._link_head(s)
        self.inq[s] = q
        self.n[q] += 1

    def _pop(self, s: int) -> None:
        q = int(self.inq[s])
        self.q[q]._unlink(s)
        self.inq[s] = 0
        self.n[q] -= 1

    def _evict(self, s: int) -> int:
        self.offer(s, False)
        self._pop(s)
        return s

    def _ghost_push(self, i: int) -> None:
        """Id ``i`` enters the ghost (one already there keeps its place); past the ghost's
        length its oldest id is dropped."""
        if self.param[Param.GHOST_LEN] <= 0 or self.member[i]:
            return
        self.ghost._link_head(i)
        self.member[i] = True
        self.n_ghost += 1
        if self.n_ghost > self.param[Param.GHOST_LEN]:
            t = self.ghost.tail
            self.ghost._unlink(t)
            self.member[t] = False
            self.n_ghost -= 1


# What each command other than WALK does, given (engine, slot, arg).
_APPLY = {
    Op.SET: S3Queue.set,
    Op.ADMIT: lambda q, s, arg: q.admit(arg),
    Op.INSERT: S3Queue.insert,
    Op.TOUCH: lambda q, s, arg: q.touch(s),
    Op.RESET: lambda q, s, arg: q.reset(s),
    Op.OFFER: lambda q, s, arg: q.offer(s, bool(arg)),
    Op.REMOVE: lambda q, s, arg: q.remove(s),
}
