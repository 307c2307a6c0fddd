"""ScoringEngine RTL against the integer golden step (kvcxl.firmware.golden_step), beat by beat,
on small tables.

The PolicyCore testbenches (Verilator, Icarus) sweep 4-word tables; here every table
size from one word up runs under random back-pressure, so the pipeline's read-after-
write cases (a word read again before or while its update is written back) are hit."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytestmark = pytest.mark.hdl


def _run(entries: int, lanes: int, beats: int, seed: int) -> int:
    from amaranth.sim import Simulator

    from kvcxl.firmware import fixedpoint as fx
    from kvcxl.firmware import golden_step as gs
    from kvcxl.rtl.scoring import ScoringEngine

    rng = random.Random(seed)
    table = fx.decay_table(0.05, 2)
    dut = ScoringEngine(entries, lanes, decay_init=table)
    groups = entries // lanes
    alpha, touch, shift = fx.alpha_to_q16(0.3), fx.to_q16(0.01), 2
    params = gs.IntParams(alpha, touch, shift, table)
    # Weights near both ends and random; about half the entries read per beat.
    weights = [
        [rng.choice([0, 1, fx.Q_MAX, rng.randrange(fx.Q_ONE)]) for _ in range(lanes)]
        for _ in range(beats)
    ]
    reads = [[rng.random() < 0.5 for _ in range(lanes)] for _ in range(beats)]
    # Expected outputs, in order: every record starts at zero (not resident, not pinned).
    score = np.zeros(entries, dtype=np.int64)
    idle = np.zeros(entries, dtype=np.int64)
    expected = []
    for b in range(beats):
        base = (b % groups) * lanes
        for i in range(lanes):
            e = base + i
            w = weights[b][i]
            touched = gs.touches(w, reads[b][i], touch)
            score[e], idle[e] = gs.advance(score[e], idle[e], w, touched, alpha)
            prio = gs.priorities(score[e], idle[e], params)
            expected.append((b % groups, int(score[e]), int(idle[e]), int(prio)))
    got = []

    async def bench(ctx):
        ctx.set(dut.alpha, alpha)
        ctx.set(dut.touch, touch)
        ctx.set(dut.shift, shift)
        sent = 0
        while len(got) < len(expected):
            if sent < beats and rng.random() < 0.8:
                for i in range(lanes):
                    ctx.set(dut.upd.payload.weight[i], weights[sent][i])
                ctx.set(dut.upd.payload.read, sum(int(r) << i for i, r in enumerate(reads[sent])))
                ctx.set(dut.upd.valid, 1)
            else:
                ctx.set(dut.upd.valid, 0)
            ready = rng.random() < 0.6
            ctx.set(dut.out.ready, ready)
            await ctx.delay(1e-9)  # settle the combinational handshakes
            took_in = ctx.get(dut.upd.valid) and ctx.get(dut.upd.ready)
            if ctx.get(dut.out.valid) and ready:
                addr = ctx.get(dut.out.payload.addr)
                for i in range(lanes):
                    lane = dut.out.payload.lane[i]
                    got.append(
                        (addr, ctx.get(lane.score), ctx.get(lane.idle), ctx.get(lane.priority))
                    )
            await ctx.tick()
            sent += bool(took_in)
        ctx.set(dut.upd.valid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert [(a, s, i, p) for a, s, i, p in got] == expected
    return len(got)


@pytest.mark.parametrize(("entries", "lanes"), [(1, 1), (2, 2), (2, 1), (3, 1), (8, 2), (12, 4)])
def test_scoring_engine_matches_the_golden_model(entries, lanes):
    checked = _run(entries, lanes, beats=120, seed=entries * 100 + lanes)
    assert checked == 120 * lanes
