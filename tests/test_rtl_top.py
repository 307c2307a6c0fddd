"""PolicyEngine end to end: weight reports and CXL.mem reads → step → victims and prefetch.

Amaranth's simulator; the expected victims come from the firmware's integer golden step
(kvcxl.firmware.golden_step) and the expected
prefetch order from kvcxl.firmware.prefetch, as in the cocotb scoreboard.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

pytestmark = pytest.mark.hdl

LAYERS, HEADS, BLOCKS, LANES, BATCH = 2, 2, 4, 4, 4
N = LAYERS * HEADS * BLOCKS
BASE = 4 << 30


def test_policy_engine_steps_match_the_firmware():
    from amaranth.sim import Simulator

    from kvcxl.cxl import mem as cxl
    from kvcxl.firmware import fixedpoint as fx
    from kvcxl.firmware import golden_step, prefetch
    from kvcxl.firmware.config import PolicyConfig
    from kvcxl.rtl.export import default_decay
    from kvcxl.rtl.top import PolicyEngine

    cfg = PolicyConfig().with_(prefetch_window=32, prefetch_depth=1)
    block_tokens = 16
    rope = fx.rope_table(2, block_tokens, cfg.prefetch_distance_scale)
    dut = PolicyEngine(
        LAYERS,
        HEADS,
        BLOCKS,
        LANES,
        BATCH,
        lines=N,
        entry_shift=6,
        decay_init=default_decay(cfg),
        rope_init=rope,
    )
    rng = random.Random(11)
    # Touch threshold 0: a read alone (a CXL.mem read, a zero-weight report) resets idle,
    # so the front end's touch path changes the victims.
    gp = golden_step.IntParams.from_config(cfg, touch_q=0)
    score = np.zeros(N, dtype=np.int64)
    idle = np.array([rng.choice([0, 100, 3000, fx.IDLE_MAX]) for _ in range(N)])
    pinned = np.array([rng.random() < 0.2 for _ in range(N)])
    checked = {"steps": 0, "victims": 0, "cxl_reads": 0, "reports": 0, "prefetch": 0}

    async def put(ctx, stream, value=None, **fields):
        if value is not None:
            ctx.set(
                stream.payload.as_value()
                if hasattr(stream.payload, "as_value")
                else stream.payload,
                value,
            )
        for k, v in fields.items():
            ctx.set(getattr(stream.payload, k), v)
        ctx.set(stream.valid, 1)
        await ctx.tick().until(stream.ready)
        ctx.set(stream.valid, 0)

    async def bench(ctx):
        ctx.set(dut.alpha, gp.alpha_q)
        ctx.set(dut.touch, gp.touch_q)
        ctx.set(dut.shift, gp.shift)
        ctx.set(dut.k, BATCH)
        ctx.set(dut.window, 2)
        ctx.set(dut.depth, 1)
        ctx.set(dut.blend_rope, fx.blend_to_q16(cfg.prefetch_blend)[0])
        ctx.set(dut.hdm_commit, 1)
        ctx.set(dut.hdm_base, BASE >> 28)
        ctx.set(dut.hdm_size, 1)
        ctx.set(dut.ndr.ready, 1)
        ctx.set(dut.drs.ready, 1)
        for g in range(N // LANES):
            recs = [
                {
                    "score": 0,
                    "idle": int(idle[g * LANES + i]),
                    "pinned": int(pinned[g * LANES + i]),
                    "resident": 1,
                }
                for i in range(LANES)
            ]
            from kvcxl.rtl import layouts as L

            lay = L.record_write_layout(LANES, 2)
            await put(ctx, dut.rec_w, L.pack(lay, {"addr": g, "data": recs}))
        for step in range(12):
            w = np.zeros(N, dtype=np.int64)
            read = np.zeros(N, dtype=bool)
            for _ in range(rng.randrange(0, 10)):
                e, wt = rng.randrange(N), rng.choice([0, 300, 65535, rng.randrange(65536)])
                await put(ctx, dut.report, index=e, weight=wt)
                w[e] = max(w[e], wt)
                read[e] = True
                checked["reports"] += 1
            for _ in range(rng.randrange(0, 4)):  # host reads through CXL.mem
                e = rng.randrange(N)
                msg = cxl.M2SReq(opcode=cxl.M2SReqOpcode.MEM_RD, tag=e, addr=(BASE >> 6) + e)
                await put(ctx, dut.req, cxl.pack(msg))
                for _ in range(10):
                    await ctx.tick()
                read[e] = True
                checked["cxl_reads"] += 1
            # Model of the step.
            nonlocal score, idle
            r = golden_step.step(score, idle, w, read, ~pinned, BATCH, gp)
            score, idle = r.score, r.idle
            want = r.victims.tolist()
            ctx.set(dut.victim.ready, 1)
            ctx.set(dut.step.valid, 1)
            got = []
            done = False
            for _ in range(200):
                if ctx.get(dut.step.ready):
                    ctx.set(dut.step.valid, 0)
                if ctx.get(dut.victim.valid):
                    p = ctx.get(dut.victim.payload)
                    if not p.empty:
                        got.append(int(p.index))
                    done = bool(p.last)
                await ctx.tick()
                if ctx.get(dut.step.ready):
                    ctx.set(dut.step.valid, 0)
                if done:
                    break
            ctx.set(dut.step.valid, 0)
            assert got == want, f"step {step}: victims {got}, want {want}"
            checked["steps"] += 1
            checked["victims"] += len(got)
            # Prefetch from a touch, ranked with the scores just computed.
            t = (rng.randrange(LAYERS), rng.randrange(HEADS), rng.randrange(BLOCKS))
            await put(ctx, dut.pf_touch, layer=t[0], head=t[1], block=t[2])
            c = prefetch.propose(
                [t[0]],
                [t[1]],
                [t[2]],
                n_layers=LAYERS,
                n_blocks=BLOCKS,
                block_tokens=block_tokens,
                config=cfg,
            )
            cid = (c.layer * HEADS + c.head) * BLOCKS + c.block
            ranks = prefetch.rank(c.distance_blocks, score[cid], block_tokens, cfg, mode="int")
            want_pf = prefetch.order(cid, ranks).tolist()
            ctx.set(dut.pf_cand.ready, 1)
            got_pf = []
            for _ in range(100):
                if ctx.get(dut.pf_cand.valid):
                    p = ctx.get(dut.pf_cand.payload)
                    if not p.empty:
                        got_pf.append(int(p.id))
                    if p.last:
                        await ctx.tick()
                        break
                await ctx.tick()
            assert got_pf == want_pf, f"step {step}: prefetch {got_pf}, want {want_pf}"
            checked["prefetch"] += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert checked["steps"] == 12 and checked["victims"] > 0
    assert checked["cxl_reads"] > 0 and checked["reports"] > 0
