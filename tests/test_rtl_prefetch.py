"""PrefetchEngine RTL against kvcxl.firmware.prefetch (propose, int-mode rank, order)."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytestmark = pytest.mark.hdl

LAYERS, HEADS, BLOCKS, BLOCK_TOKENS = 6, 2, 12, 16


def _entry_id(layer, head, block):
    return (np.asarray(layer) * HEADS + np.asarray(head)) * BLOCKS + np.asarray(block)


def _expected(touch, scores, config):
    from kvcxl.firmware import prefetch

    c = prefetch.propose(
        [touch[0]],
        [touch[1]],
        [touch[2]],
        n_layers=LAYERS,
        n_blocks=BLOCKS,
        block_tokens=BLOCK_TOKENS,
        config=config,
    )
    ids = _entry_id(c.layer, c.head, c.block)
    ranks = prefetch.rank(c.distance_blocks, scores[ids], BLOCK_TOKENS, config, mode="int")
    order = prefetch.order(ids, ranks)
    by_id = dict(zip(ids.tolist(), ranks.tolist(), strict=True))
    return [(int(i), int(by_id[int(i)])) for i in order]


def _run(seed: int, configs, touches_per_config: int = 6):
    from amaranth.hdl import Module
    from amaranth.lib.memory import Memory
    from amaranth.sim import Simulator

    from kvcxl.firmware import fixedpoint as fx
    from kvcxl.rtl.prefetch import PrefetchEngine

    rng = random.Random(seed)
    max_w = max(fx.window_blocks(c.prefetch_window, BLOCK_TOKENS) for c in configs)
    max_d = max(c.prefetch_depth for c in configs)
    scores = np.array(
        [
            rng.choice([0, 7, fx.Q_MAX, rng.randrange(fx.Q_ONE)])
            for _ in range(LAYERS * HEADS * BLOCKS)
        ]
    )
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
            wb = fx.window_blocks(cfg.prefetch_window, BLOCK_TOKENS)
            table = fx.rope_table(max_w, BLOCK_TOKENS, cfg.prefetch_distance_scale)
            for a, v in enumerate(table):  # parameter change: new RoPE table and blend
                ctx.set(dut.rope_w.payload.as_value(), int(v) << len(dut.rope_w.payload.addr) | a)
                ctx.set(dut.rope_w.valid, 1)
                await ctx.tick()
            ctx.set(dut.rope_w.valid, 0)
            ctx.set(dut.window, wb)
            ctx.set(dut.depth, cfg.prefetch_depth)
            ctx.set(dut.blend_rope, fx.blend_to_q16(cfg.prefetch_blend)[0])
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
                want = _expected(t, scores, cfg)
                assert got == want, f"touch {t} cfg {cfg}: got {got}, want {want}"
                cases += 1

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return cases


def test_prefetch_matches_firmware_int_mode():
    from kvcxl.firmware.config import PolicyConfig

    base = PolicyConfig()
    configs = [
        base.with_(prefetch_window=32, prefetch_depth=2),
        base.with_(prefetch_window=16, prefetch_depth=1, prefetch_blend=(1.0, 0.0)),
        base.with_(
            prefetch_window=32,
            prefetch_depth=2,
            prefetch_blend=(0.0, 1.0),
            prefetch_distance_scale=10.0,
        ),
        base.with_(prefetch_window=0, prefetch_depth=2),
        base.with_(prefetch_depth=0, prefetch_window=32),
    ]
    assert _run(3, configs) == 6 * len(configs)
