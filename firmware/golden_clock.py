"""The slot-queue golden step: CLOCK and SIEVE as the RTL engine computes them.

The engine (``rtl/slot_queue.py``) keeps the resident entries in ``slots``; the queue
order is a doubly linked list over the slots (``newer`` toward the head, ``older``
toward the tail), the same list :mod:`kvcxl.firmware.policies.queued` keeps over entry
ids, so a slot's place in the queue is independent of its number.  Each slot holds a
reference counter (CLOCK's n-bit counter; SIEVE's visited bit is a 1-bit counter), a
``fresh`` bit (resident, not yet read: the next read is the admission read and sets no
bit) and an ``offered`` bit (the host's eligibility: resident, unpinned, not read in
this batch).  The host drives it with commands, one at a time:

    INSERT s        link s at the head: counter 0, fresh, not offered
    TOUCH s         a read: fresh → not fresh; else counter + 1, saturating at ref_max
    RESET s         counter 0, not fresh (the entry starts afresh; its place is kept)
    OFFER s, b      offered ← b
    REMOVE s        unlink s (SIEVE: a hand on s moves to the next newer slot)
    WALK k, keep    evict min(k, offered slots) victims by the policy's walk

CLOCK's walk starts at the tail: an offered slot with a counter above 0 is decremented
and moved to the head, one at 0 is the victim; a slot not offered is stepped over and
keeps its place.  SIEVE's walk starts at the hand (at the tail when it has none, or when
a ``keep`` walk evicted the hand's own slot): an
offered visited slot is cleared and stays, an offered unvisited one is the victim; past
the head it wraps to the tail; the hand stops at the slot after the last victim
(``keep``: the hand stays where it was).  Victims are unlinked as they are found.

This is the firmware's CLOCK and SIEVE (:mod:`kvcxl.firmware.policies.clock`,
:mod:`~kvcxl.firmware.policies.sieve`) written as the commands a host sends;
``tests/test_rtl_clock_golden.py`` replays whole traces through it and requires the
firmware's victims.  The RTL's scoreboard predicts every victim with :class:`SlotQueue`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray

POLICIES = ("clock", "sieve")
NONE = -1  # no slot (end of the list; SIEVE's hand at the tail)
REF_BITS = 8  # the counter's width in the engine: CLOCK's clock_bits is at most 8


class Op(IntEnum):
    """Command opcodes (the engine's ``cmd.op`` field)."""

    INSERT = 0
    TOUCH = 1
    RESET = 2
    OFFER = 3
    REMOVE = 4
    WALK = 5


OP_BITS = 3


def ref_max(policy: str, clock_bits: int = 1) -> int:
    """The counter's ceiling: 2**clock_bits − 1 for CLOCK, 1 (the visited bit) for SIEVE."""
    if policy not in POLICIES:
        raise ValueError(f"policy = {policy!r}: must be one of {', '.join(POLICIES)}")
    if policy == "sieve":
        return 1
    if not 1 <= clock_bits <= REF_BITS:
        raise ValueError(f"clock_bits = {clock_bits}: must be in [1, {REF_BITS}]")
    return (1 << clock_bits) - 1


class SlotQueue:
    """The engine's state and its commands (the golden step of the slot-queue engine)."""

    def __init__(self, slots: int, policy: str, ref_ceiling: int) -> None:
        if slots < 1:
            raise ValueError(f"slots = {slots}: must be >= 1")
        ref_max(policy)  # validates the name
        self.slots, self.policy, self.ref_max = slots, policy, int(ref_ceiling)
        self.ref = np.zeros(slots, np.int64)
        self.fresh = np.zeros(slots, bool)
        self.offered = np.zeros(slots, bool)
        self.inq = np.zeros(slots, bool)
        self.newer = [NONE] * slots
        self.older = [NONE] * slots
        self.head = self.tail = self.hand = NONE
        self.n_offered = 0

    # --- one command ---------------------------------------------------------------------
    def insert(self, s: int) -> None:
        if self.inq[s]:
            raise ValueError(f"INSERT {s}: the slot is in the queue already")
        self.inq[s], self.ref[s], self.fresh[s], self.offered[s] = True, 0, True, False
        self._link_head(s)

    def touch(self, s: int) -> None:
        if self.fresh[s]:
            self.fresh[s] = False
        else:
            self.ref[s] = min(int(self.ref[s]) + 1, self.ref_max)

    def reset(self, s: int) -> None:
        self.ref[s], self.fresh[s] = 0, False

    def offer(self, s: int, on: bool) -> None:
        on = bool(on) and bool(self.inq[s])
        self.n_offered += int(on) - int(self.offered[s])
        self.offered[s] = on

    def remove(self, s: int) -> None:
        if not self.inq[s]:
            return
        if self.hand == s:
            self.hand = self.newer[s]
        self._unlink(s)
        self.offer(s, False)
        self.inq[s] = False

    def walk(self, k: int, keep_hand: bool = False) -> list[int]:
        """The victims (slots) of one walk, in eviction order."""
        left = min(int(k), self.n_offered)
        out: list[int] = []
        if left <= 0:
            return out
        h = self.hand
        cur = self.tail if self.policy == "clock" or h == NONE or not self.inq[h] else h
        while left:
            if cur == NONE:  # past the head: wrap to the tail
                cur = self.tail
            nxt = self.newer[cur]
            if self.offered[cur]:
                if self.ref[cur] > 0:
                    if self.policy == "clock":
                        self.ref[cur] -= 1
                        if cur != self.head:  # the head moves to the head: stays
                            self._unlink(cur)
                            self._link_head(cur)
                        else:
                            nxt = cur
                    else:
                        self.ref[cur] = 0
                else:
                    self._unlink(cur)
                    self.offer(cur, False)
                    self.inq[cur] = False
                    out.append(cur)
                    left -= 1
                    if self.policy == "sieve" and not keep_hand and not left:
                        self.hand = nxt
            cur = nxt
        return out

    # --- a command list, as the driver sends it ---------------------------------------------
    def run(self, cmds: Iterable[tuple[int, int, int, int]]) -> list[int]:
        """Apply (op, slot, arg, flag) commands in order; the victims of their walks."""
        out: list[int] = []
        for op, s, arg, flag in cmds:
            op = Op(op)
            if op == Op.INSERT:
                self.insert(s)
            elif op == Op.TOUCH:
                self.touch(s)
            elif op == Op.RESET:
                self.reset(s)
            elif op == Op.OFFER:
                self.offer(s, bool(arg))
            elif op == Op.REMOVE:
                self.remove(s)
            else:
                out += self.walk(arg, bool(flag))
        return out

    def order(self) -> list[int]:
        """The queue, tail (oldest) first."""
        out, s = [], self.tail
        while s != NONE:
            out.append(s)
            s = self.newer[s]
        return out

    def counters(self) -> NDArray:
        return self.ref.copy()

    # --- the linked list -----------------------------------------------------------------
    def _link_head(self, s: int) -> None:
        self.older[s], self.newer[s] = self.head, NONE
        if self.head == NONE:
            self.tail = s
        else:
            self.newer[self.head] = s
        self.head = s

    def _unlink(self, s: int) -> None:
        o, n = self.older[s], self.newer[s]
        if o == NONE:
            self.tail = n
        else:
            self.newer[o] = n
        if n == NONE:
            self.head = o
        else:
            self.older[n] = o
        self.older[s] = self.newer[s] = NONE
