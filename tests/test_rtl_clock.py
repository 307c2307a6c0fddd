"""The slot-queue engines (rtl/slot_queue.py) in Amaranth's simulator: every victim of
random host commands against the golden step (firmware/golden_clock.py), with random
back-pressure on ``victim``."""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.hdl
HANG = 2000  # cycles a walk may take here (8 slots, counters of at most 3 bits)


def _run(policy: str, seed: int, n: int = 300, defect: str | None = None) -> tuple[list, list]:
    from kvcxl.rtl.slot_queue import SlotQueueEngine
    from kvcxl.tb.slot_queue_model import SLOTS, script

    rng = random.Random(seed)
    ceiling, cmds, want = script(policy, n, rng)
    return drive(SlotQueueEngine(SLOTS, policy, defect=defect), ceiling, cmds, rng), want


def drive(dut, ceiling: int, cmds: list, rng: random.Random) -> list:
    """Every WALK's victims from ``dut`` (a slot-queue engine) in Amaranth's simulator."""
    from amaranth.sim import Simulator

    got: list[list] = []

    async def bench(ctx):
        ctx.set(dut.ref_max, ceiling)
        for op, s, arg, flag in cmds:
            ctx.set(dut.cmd.payload, {"op": op, "slot": s, "arg": arg, "keep": flag})
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
            ctx.set(dut.cmd.valid, 0)
            if op != 5:
                continue
            walk: list = []
            for _ in range(HANG):
                r = int(rng.random() < 0.7)
                ctx.set(dut.victim.ready, r)
                pv = dut.victim.payload
                *_, valid, index, last, empty = await ctx.tick().sample(
                    dut.victim.valid, pv.index, pv.last, pv.empty
                )
                if valid and r:
                    if not empty:
                        walk.append(int(index))
                    if last:
                        break
            else:
                got.append([*walk, "hang"])  # no last victim: the walk never ended
                return
            got.append(walk)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return got


# CLOCK's seeds 5 and 40 look at the head again (a counter above 0 there): its words held,
# not read again. A counter not written into the held word fails 5 (a hang); words not
# held (read again from the last address named) fail 40; seeds 1-3 never look there.
@pytest.mark.parametrize(
    ("policy", "seed"),
    [("clock", 1), ("clock", 2), ("clock", 3), ("clock", 5), ("clock", 40), ("sieve", 1),
     ("sieve", 2), ("sieve", 3)],
)  # fmt: skip
def test_engine_equals_the_golden_step(policy, seed):
    got, want = _run(policy, seed)
    assert sum(len(w) for w in want) > 30 and any(len(w) == 0 for w in want)
    assert got == want


@pytest.mark.parametrize(
    ("policy", "defect", "seed"),
    [
        ("clock", "victim_unoffered", 1),
        ("clock", "stuck_hand", 1),
        ("clock", "clock_clears", 11),  # 2-bit counters (1 bit cannot tell the two)
        ("sieve", "keep_visited", 1),
        ("sieve", "clear_stays", 1),
    ],
)
def test_a_planted_defect_changes_the_victims(policy, defect, seed):
    got, want = _run(policy, seed, defect=defect)
    assert got != want
