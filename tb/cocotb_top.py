"""cocotb entry point: the PolicyEngine top on Verilator or Icarus (via :mod:`kvcxl.tb.runner`).

Each step: random weight reports and CXL.mem reads (the front end's touch marks an
entry read), an evaluation sweep (``hold``, ``keep``: the priorities within the step,
nothing written back), the update sweep, then a prefetch request.  Every victim list is
compared with the firmware's integer golden step (:mod:`kvcxl.firmware.golden_step`:
``evaluate`` within the step, ``step`` at its end) and every prefetch list with
:mod:`kvcxl.firmware.prefetch`.  Configuration in KVCXL_TB_CONFIG (JSON: seed, steps,
results path).
"""

from __future__ import annotations

import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware import golden_step, prefetch
from kvcxl.firmware.cxl import mem as cxl
from kvcxl.rtl import layouts as L
from kvcxl.tb.top_model import BASE, BATCH, BLOCK_TOKENS, BLOCKS, HEADS, LANES, LAYERS, N, config


def _ports() -> dict:
    """The payload layouts of the top's streams (from the design's own signature)."""
    from kvcxl.tb.top_model import build  # lazy: amaranth, for the layouts only

    top = build()
    top._MustUse__silence = True  # built for its signature, never elaborated
    m = top.signature.members
    names = ("report", "step", "rec_w", "victim", "pf_touch", "pf_cand")
    return {n: m[n].signature.members["payload"].shape for n in names}


async def _put(dut, name: str, bits: int) -> None:
    """One beat on input stream ``name`` (from a falling edge, back at a falling edge)."""
    getattr(dut, f"{name}__payload").value = bits
    getattr(dut, f"{name}__valid").value = 1
    while True:
        await ReadOnly()
        ok = int(getattr(dut, f"{name}__ready").value)
        await RisingEdge(dut.clk)
        await FallingEdge(dut.clk)
        if ok:
            break
    getattr(dut, f"{name}__valid").value = 0


async def _sweep(dut, ports, *, hold: int, keep: int, k: int) -> list[tuple[int, int]]:
    """A step beat and its eviction pass: [(index, priority)] in victim order."""
    victim = L.unpacker(ports["victim"])
    dut.k.value = k
    dut.step__payload.value = L.pack(ports["step"], {"hold": hold, "keep": keep})
    dut.step__valid.value = 1
    dut.victim__ready.value = 1
    got, stepped = [], False
    for _ in range(1000):
        await ReadOnly()
        accepted = int(dut.step__valid.value) and int(dut.step__ready.value)
        done = False
        if int(dut.victim__valid.value):
            p = victim(int(dut.victim__payload.value))
            if not p["empty"]:
                got.append((p["index"], p["priority"]))
            done = bool(p["last"])
        await RisingEdge(dut.clk)
        await FallingEdge(dut.clk)
        if accepted:
            stepped = True
            dut.step__valid.value = 0
        if done and stepped:
            return got
    raise AssertionError("the eviction pass did not end")


@cocotb.test()
async def top_matches_firmware_int_mode(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    rng = random.Random(cfg["seed"])
    pc = config()
    ports = _ports()
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    for s in ("report", "step", "rec_w", "req", "rwd", "pf_touch", "table_w", "rope_w"):
        getattr(dut, f"{s}__valid").value = 0
    for s in ("victim", "ndr", "drs", "pf_cand"):
        getattr(dut, f"{s}__ready").value = 1
    gp = golden_step.IntParams.from_config(pc, touch_q=0)  # 0: a read alone resets idle
    regs = {
        "alpha": gp.alpha_q, "touch": gp.touch_q, "shift": gp.shift, "k": BATCH, "window": 2,
        "depth": 1, "blend_rope": fx.blend_to_q16(pc.prefetch_blend)[0], "hdm_commit": 1,
        "hdm_base": BASE >> 28, "hdm_size": 1, "hdm_ig": 0, "hdm_iw": 0, "hdm_pos": 0,
    }  # fmt: skip
    for name, value in regs.items():
        getattr(dut, name).value = value
    dut.rst.value = 1
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0
    # Scores of every size (not only 0), so that the evaluation sweep's "score as stored"
    # decides victims: with all scores 0 an evaluation that updated them would go unseen.
    score = np.array(
        [rng.choice([0, 7, 30000, fx.Q_MAX, rng.randrange(fx.Q_ONE)]) for _ in range(N)]
    )
    idle = np.array([rng.choice([0, 1, 3, 100, 3000, fx.IDLE_MAX]) for _ in range(N)])
    pinned = np.array([rng.random() < 0.2 for _ in range(N)])
    for g in range(N // LANES):
        recs = [
            {"score": int(score[g * LANES + i]), "idle": int(idle[g * LANES + i]),
             "pinned": int(pinned[g * LANES + i]), "resident": 1}
            for i in range(LANES)
        ]  # fmt: skip
        await _put(dut, "rec_w", L.pack(ports["rec_w"], {"addr": g, "data": recs}))
    pf_cand = L.unpacker(ports["pf_cand"])
    bad: list[str] = []
    counts = {"steps": 0, "victims": 0, "evaluations": 0, "reports": 0, "cxl_reads": 0}

    def compare(what: str, got, want) -> None:
        if got != want:
            bad.append(f"{what}: got {got}, want {want}"[:300])

    for step in range(cfg["steps"]):
        w = np.zeros(N, dtype=np.int64)
        read = np.zeros(N, dtype=bool)
        for _ in range(rng.randrange(0, 10)):
            e, wt = rng.randrange(N), rng.choice([0, 300, 65535, rng.randrange(65536)])
            await _put(dut, "report", L.pack(ports["report"], {"index": e, "weight": wt}))
            w[e], read[e] = max(w[e], wt), True
            counts["reports"] += 1
        for _ in range(rng.randrange(0, 4)):  # host reads through CXL.mem
            e = rng.randrange(N)
            msg = cxl.M2SReq(opcode=cxl.M2SReqOpcode.MEM_RD, tag=e, addr=(BASE >> 6) + e)
            await _put(dut, "req", cxl.pack(msg))
            for _ in range(10):
                await FallingEdge(dut.clk)
            read[e] = True
            counts["cxl_reads"] += 1
        # Within the step: score as stored, idle 0 if touched, nothing written back.
        k = rng.randrange(0, BATCH + 1)
        mid = golden_step.evaluate(score, idle, w, read, ~pinned, k, gp)
        got = await _sweep(dut, ports, hold=1, keep=1, k=k)
        compare(f"step {step} evaluation (k {k})", got, mid.pairs())
        counts["evaluations"] += 1
        # The update sweep (the weight buffer was kept).
        r = golden_step.step(score, idle, w, read, ~pinned, BATCH, gp)
        score, idle = r.score, r.idle
        got = await _sweep(dut, ports, hold=0, keep=0, k=BATCH)
        compare(f"step {step} update", got, r.pairs())
        counts["steps"] += 1
        counts["victims"] += len(got)
        # Prefetch from a touch, ranked with the scores just computed.
        t = (rng.randrange(LAYERS), rng.randrange(HEADS), rng.randrange(BLOCKS))
        c = prefetch.propose(
            [t[0]], [t[1]], [t[2]],
            n_layers=LAYERS, n_blocks=BLOCKS, block_tokens=BLOCK_TOKENS, config=pc,
        )  # fmt: skip
        cid = (c.layer * HEADS + c.head) * BLOCKS + c.block
        ranks = prefetch.rank(c.distance_blocks, score[cid], BLOCK_TOKENS, pc, mode="int")
        want_pf = prefetch.order(cid, ranks).tolist()
        touch = {"layer": t[0], "head": t[1], "block": t[2]}
        await _put(dut, "pf_touch", L.pack(ports["pf_touch"], touch))
        got_pf = []
        for _ in range(200):
            await ReadOnly()
            p = pf_cand(int(dut.pf_cand__payload.value)) if int(dut.pf_cand__valid.value) else {}
            await RisingEdge(dut.clk)
            await FallingEdge(dut.clk)
            if p and not p["empty"]:
                got_pf.append(p["id"])
            if p and p["last"]:
                break
        compare(f"step {step} prefetch {t}", got_pf, want_pf)
    res = {"simulator": cocotb.SIM_NAME, "mismatches": len(bad), "examples": bad[:3], **counts}
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert not bad, f"{len(bad)} mismatches: {bad[:3]}"
