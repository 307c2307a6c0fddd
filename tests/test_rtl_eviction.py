"""EvictionEngine with one lane (its insertion gated on `pending`, without the compare with
the last slot in series): every pass's victims equal the contract's order (priority
descending, index ascending, eligible only) under random back-pressure on both streams,
with ties and k below, at and above the eligible count."""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.hdl


def _passes(entries: int, batch: int, seed: int) -> tuple[list, list]:
    from amaranth.sim import Simulator

    from kvcxl.rtl.eviction import EvictionEngine

    dut = EvictionEngine(entries, 1, batch, q_bits=16)
    rng = random.Random(seed)
    passes = []
    for _ in range(6):
        prio = [rng.choice([rng.randrange(1 << 16), 5, 5, 0]) for _ in range(entries)]
        eligible = [rng.random() < 0.8 for _ in range(entries)]
        passes.append((prio, eligible, rng.choice([batch, batch, rng.randrange(batch + 1)])))
    got: list = []

    async def bench(ctx):
        for prio, eligible, k in passes:
            ctx.set(dut.k, k)
            i = 0
            while i < entries:
                ctx.set(dut.cand.valid, int(rng.random() < 0.8))
                ctx.set(dut.cand.payload.addr, i)
                ctx.set(dut.cand.payload.last, int(i == entries - 1))
                ctx.set(dut.cand.payload.lane[0].priority, prio[i])
                ctx.set(dut.cand.payload.lane[0].eligible, int(eligible[i]))
                await ctx.delay(1e-9)
                took = ctx.get(dut.cand.valid) and ctx.get(dut.cand.ready)
                await ctx.tick()
                i += bool(took)
            ctx.set(dut.cand.valid, 0)
            out = []
            while True:
                ready = rng.random() < 0.7
                ctx.set(dut.victim.ready, int(ready))
                await ctx.delay(1e-9)
                if ctx.get(dut.victim.valid) and ready:
                    out.append(
                        (ctx.get(dut.victim.payload.index), ctx.get(dut.victim.payload.empty))
                    )
                    last = ctx.get(dut.victim.payload.last)
                    await ctx.tick()
                    if last:
                        break
                else:
                    await ctx.tick()
            ctx.set(dut.victim.ready, 0)
            got.append(out)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    want = []
    for prio, eligible, k in passes:
        order = sorted((i for i in range(entries) if eligible[i]), key=lambda i: (-prio[i], i))
        want.append([(i, 0) for i in order[:k]] or [(0, 1)])
    return got, want


@pytest.mark.parametrize(("entries", "batch", "seed"), [(40, 20, 1), (64, 17, 2), (24, 9, 3)])
def test_one_lane_victims_follow_the_contract(entries, batch, seed):
    got, want = _passes(entries, batch, seed)
    assert got == want


@pytest.mark.parametrize("batch", [1, 2, 9])
def test_one_lane_drain_reaches_the_last_slot(batch):
    """The systolic top-k's drain: a sweep without bubbles whose last entry ranks first
    (or exactly `batch`-th) sends a wavefront down every slot after the last beat, and the
    `batch`-th victim is right only if the pass waits for it to reach the last slot.  The
    first victim is offered `batch + 1` cycles after the last beat is taken (slot 0 takes it
    the cycle after, the last slot `batch − 1` cycles later)."""
    from amaranth.sim import Simulator

    from kvcxl.rtl.eviction import EvictionEngine

    entries = 16
    dut = EvictionEngine(entries, 1, batch, q_bits=16)
    passes = [
        [100 + i for i in range(entries)],  # the last entry ranks first
        [7] * (entries - batch) + [9] * (batch - 1) + [8],  # the last ranks `batch`-th
        [3] * entries,  # ties only: index order
    ]
    got, waits = [], []

    async def bench(ctx):
        ctx.set(dut.k, batch)
        ctx.set(dut.victim.ready, 1)
        for prio in passes:
            for i in range(entries):
                ctx.set(dut.cand.valid, 1)
                ctx.set(dut.cand.payload.addr, i)
                ctx.set(dut.cand.payload.last, int(i == entries - 1))
                ctx.set(dut.cand.payload.lane[0].priority, prio[i])
                ctx.set(dut.cand.payload.lane[0].eligible, 1)
                await ctx.delay(1e-9)
                while not ctx.get(dut.cand.ready):
                    await ctx.tick()
                    await ctx.delay(1e-9)
                await ctx.tick()
            ctx.set(dut.cand.valid, 0)
            out, wait = [], 0
            while True:
                await ctx.delay(1e-9)
                wait += 1
                if ctx.get(dut.victim.valid):
                    if not out:
                        waits.append(wait)
                    out.append(ctx.get(dut.victim.payload.index))
                    if ctx.get(dut.victim.payload.last):
                        await ctx.tick()
                        break
                await ctx.tick()
            got.append(out)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    want = [sorted(range(entries), key=lambda i: (-p[i], i))[:batch] for p in passes]
    assert got == want
    assert waits == [batch + 1] * len(passes)
