"""What the S3-FIFO engine must answer: random host commands and the golden step's
victims for them (:class:`kvcxl.firmware.golden_s3fifo.S3Queue`).

Used by the Amaranth-simulator test (tests/test_rtl_s3fifo.py) and by the cocotb bench
on Verilator and Icarus (tb/cocotb_slot_queue.py, which runs this engine too).  The
parameters are drawn first and sent as SET commands; then the commands a host may send:
INSERT a free slot with an entry id not resident, right after that id's ADMIT; a stray
ADMIT of any id not resident; TOUCH, RESET, OFFER and REMOVE any slot (mostly one in a
queue); WALK any k from 0
to beyond the slots.  Twice as many ids as slots, so that evicted ids fill the ghost and
come back.
"""

from __future__ import annotations

import random

from kvcxl.firmware import golden_s3fifo as gs

SLOTS, IDS = 8, 16
Op = gs.Op
MIX = {Op.INSERT: 6, Op.ADMIT: 1, Op.TOUCH: 6, Op.RESET: 1, Op.OFFER: 6, Op.REMOVE: 1,
       Op.WALK: 3}  # fmt: skip


def params() -> dict:
    """``kvcxl.rtl.export.build("s3fifo", **params())``."""
    return {"entries": SLOTS, "ids": IDS}


def script(
    n: int, rng: random.Random, slots: int = SLOTS, ids: int = IDS, ghost: int | None = None
) -> tuple[int, list[tuple[int, int, int, int]], list[list[int]]]:
    """(ref_max, ``n`` commands or a few more, the victims of each WALK in order) for one
    random run; every 4th WALK offers every slot in a queue first.  ``ghost``: the ghost's
    length (else drawn)."""
    threshold = rng.randint(1, 3)
    ceiling = gs.ref_ceiling(threshold)
    q = gs.S3Queue(slots, ids, ceiling)
    setting = {gs.Param.THRESHOLD: threshold, gs.Param.SMALL_FULL: rng.randint(1, slots // 2),
               gs.Param.MAIN_MAX: rng.randint(1, slots // 2 + 1),
               gs.Param.GHOST_LEN: rng.choice([0, 2, ids // 2, ids]) if ghost is None
               else ghost}  # fmt: skip
    cmds = [(int(Op.SET), int(p), v, 0) for p, v in setting.items()]
    q.run(cmds)
    ops, weights = list(MIX), list(MIX.values())
    walks: list[list[int]] = []

    def send(cmd: tuple[int, int, int, int]) -> None:
        cmds.append(cmd)
        got = q.run([cmd])
        if cmd[0] == Op.WALK:
            walks.append(got)

    while len(cmds) < n:
        op = rng.choices(ops, weights)[0]
        free = [s for s in range(slots) if not q.inq[s]]
        resident = {int(q.id_of[s]) for s in range(slots) if q.inq[s]}
        away = [i for i in range(ids) if i not in resident]
        if op == Op.INSERT and free:
            i = rng.choice(away)
            send((int(Op.ADMIT), 0, i, 0))
            send((int(Op.INSERT), rng.choice(free), i, 0))
        elif op == Op.ADMIT:
            send((int(Op.ADMIT), 0, rng.choice(away), 0))
        elif op == Op.WALK:
            if len(walks) % 4 == 3:
                for t in range(slots):
                    send((int(Op.OFFER), t, 1, 0))
            send((int(Op.WALK), 0, rng.randint(0, slots), 0))
        else:  # OFFER, TOUCH, RESET, REMOVE (INSERT with no free slot: TOUCH), mostly of a
            # slot in a queue (reads raise main's counters above 1)
            queued = [t for t in range(slots) if q.inq[t]]
            s = rng.choice(queued) if queued and rng.random() < 0.8 else rng.randrange(slots)
            arg = int(rng.random() < 0.8) if op == Op.OFFER else 0
            send((int(op if op != Op.INSERT else Op.TOUCH), s, arg, 0))
    return ceiling, cmds, walks
