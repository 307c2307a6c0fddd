"""PrefetchEngine RTL against kvcxl.firmware.prefetch (propose, int-mode rank, order), in
Amaranth's simulator; the model (kvcxl.tb.prefetch_model) is shared with the cocotb test
on Verilator and Icarus."""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.hdl


def _run(seed: int, configs, touches_per_config: int = 6):
    from amaranth.hdl import Module
    from amaranth.lib.memory import Memory
    from amaranth.sim import Simulator

    from kvcxl.rtl.prefetch import PrefetchEngine
    from kvcxl.tb.prefetch_model import (
        BLOCKS,
        HEADS,
        LAYERS,
        expected,
        random_scores,
        registers,
        sizes,
    )

    rng = random.Random(seed)
    max_w, max_d = sizes(configs)
    scores = random_scores(rng)
    dut = PrefetchEngine(LAYERS, HEADS, BLOCKS, max_w, max_d)
    m = Module()
    m.submodules.dut = dut
    m.submodules.scores = mem = Memory(shape=16, depth=scores.size, init=scores.tolist())
    rp = mem.read_port()
    m.d.comb += [rp.addr.eq(dut.score_addr), dut.score_data.eq(rp.data)]
    cases = 0

    async def bench(ctx):
        nonlocal cases
        for cfg in configs:
            table, regs = registers(cfg, max_w)
            for a, v in enumerate(table):  # parameter change: new RoPE table and blend
                ctx.set(dut.rope_w.payload.as_value(), v << len(dut.rope_w.payload.addr) | a)
                ctx.set(dut.rope_w.valid, 1)
                await ctx.tick()
            ctx.set(dut.rope_w.valid, 0)
            for name, value in regs.items():
                ctx.set(getattr(dut, name), value)
            for _ in range(touches_per_config):
                t = (rng.randrange(LAYERS), rng.randrange(HEADS), rng.randrange(BLOCKS))
                ctx.set(dut.touch.payload.layer, t[0])
                ctx.set(dut.touch.payload.head, t[1])
                ctx.set(dut.touch.payload.block, t[2])
                ctx.set(dut.touch.valid, 1)
                await ctx.tick().until(dut.touch.ready)
                ctx.set(dut.touch.valid, 0)
                got = []
                while True:
                    ctx.set(dut.cand.ready, int(rng.random() > 0.3))
                    if ctx.get(dut.cand.valid) and ctx.get(dut.cand.ready):
                        p = ctx.get(dut.cand.payload)
                        if not p.empty:
                            got.append((int(p.id), int(p.rank)))
                        if p.last:
                            await ctx.tick()
                            break
                    await ctx.tick()
                want = expected(t, scores, cfg)
                assert got == want, f"touch {t} cfg {cfg}: got {got}, want {want}"
                cases += 1

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return cases


def test_prefetch_matches_firmware_int_mode():
    from kvcxl.tb.prefetch_model import configs

    cfgs = configs()
    assert _run(3, cfgs) == 6 * len(cfgs)
