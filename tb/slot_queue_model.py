"""What the slot-queue engines (CLOCK, SIEVE) must answer: random host commands and the
golden step's victims for them (:class:`kvcxl.firmware.golden_clock.SlotQueue`).

Used by the Amaranth-simulator test (tests/test_rtl_clock.py) and by the cocotb bench
on Verilator and Icarus (tb/cocotb_slot_queue.py).  The commands are the ones a host may
send: INSERT only a slot not in the queue; TOUCH, RESET, OFFER and REMOVE any slot (the
engine ignores what does not apply); WALK any k from 0 to beyond the slots, with or
without ``keep``.
"""

from __future__ import annotations

import random

from kvcxl.firmware import golden_clock as gc

SLOTS = 8  # small, so that walks wrap, counters saturate and the queue fills and empties
# Relative frequency of each command.
MIX = {gc.Op.INSERT: 6, gc.Op.TOUCH: 6, gc.Op.RESET: 1, gc.Op.OFFER: 6, gc.Op.REMOVE: 1,
       gc.Op.WALK: 3}  # fmt: skip


def params() -> dict:
    """``kvcxl.rtl.export.build("clock" | "sieve", **params())``."""
    return {"entries": SLOTS}


def script(
    policy: str, n: int, rng: random.Random, slots: int = SLOTS
) -> tuple[int, list[tuple[int, int, int, int]], list[list[int]]]:
    """(ref_max, ``n`` commands, the victims of each WALK in order) for one random run.

    CLOCK's counter width is drawn from 1 to 3 bits; every 4th WALK offers every slot in
    the queue first (so long walks that wrap and drain happen)."""
    ceiling = gc.ref_max(policy, rng.randint(1, 3) if policy == "clock" else 1)
    q = gc.SlotQueue(slots, policy, ceiling)
    ops, weights = list(MIX), list(MIX.values())
    cmds: list[tuple[int, int, int, int]] = []
    walks: list[list[int]] = []
    while len(cmds) < n:
        op = rng.choices(ops, weights)[0]
        free = [s for s in range(slots) if not q.inq[s]]
        if op == gc.Op.INSERT and not free:
            op = gc.Op.TOUCH
        s = rng.choice(free) if op == gc.Op.INSERT else rng.randrange(slots)
        arg = flag = 0
        if op == gc.Op.OFFER:
            queued = [t for t in range(slots) if q.inq[t]]
            if queued and rng.random() < 0.8:
                s = rng.choice(queued)
            arg = rng.random() < 0.8
        elif op == gc.Op.WALK:
            arg, flag, s = rng.randint(0, slots), int(rng.random() < 0.3), 0
            if len(walks) % 4 == 3:
                for t in range(slots):
                    cmds.append((gc.Op.OFFER, t, 1, 0))
                    q.offer(t, True)
        cmd = (int(op), s, int(arg), flag)
        cmds.append(cmd)
        got = q.run([cmd])
        if op == gc.Op.WALK:
            walks.append(got)
    return ceiling, cmds, walks
