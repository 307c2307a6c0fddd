"""cocotb entry point: the PolicyEngine top on Verilator or Icarus (via :mod:`kvcxl.tb.runner`).

Each step, through the top's streams (:mod:`kvcxl.tb.streams`: a Source per input, an
always-ready Sink per output): random weight reports and CXL.mem reads (the front end's
touch marks an entry read), an evaluation sweep (``hold``, ``keep``: the priorities within the step,
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

from kvcxl.cxl import mem as cxl
from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware import golden_step, prefetch
from kvcxl.tb.streams import Clock, Sink, Source
from kvcxl.tb.top_model import BASE, BATCH, BLOCK_TOKENS, BLOCKS, HEADS, LANES, LAYERS, N, config


def _ports() -> dict:
    """The payload layouts of the top's streams (from the design's own signature)."""
    from kvcxl.tb.top_model import build  # lazy: amaranth, for the layouts only

    top = build()
    top._MustUse__silence = True  # built for its signature, never elaborated
    m = top.signature.members
    return {n: m[n].signature.members["payload"].shape for n in INPUTS + OUTPUTS}


INPUTS = ("report", "step", "rec_w", "req", "rwd", "pf_touch", "table_w", "rope_w")
OUTPUTS = ("victim", "ndr", "drs", "pf_cand")  # always ready


async def _sweep(dut, src, victim, *, hold: int, keep: int, k: int) -> list[tuple[int, int]]:
    """A step beat and its eviction pass: [(index, priority)] in victim order."""
    stale = victim.drain()
    if stale:
        raise AssertionError(f"victims before the step: {stale}")
    dut.k.value = k
    src["step"].put({"hold": hold, "keep": keep})
    got = []
    while True:
        p = await victim.recv(timeout=1000)
        if p is None:
            raise AssertionError("the eviction pass did not end")
        if not p["empty"]:
            got.append((p["index"], p["priority"]))
        if p["last"]:
            return got


@cocotb.test()
async def top_matches_firmware_int_mode(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    rng = random.Random(cfg["seed"])
    pc = config()
    ports = _ports()
    clock = Clock(dut)
    src = {n: Source(clock, n, ports[n]) for n in INPUTS}
    out = {n: Sink(clock, n, ports[n]) for n in OUTPUTS}
    out["ndr"].keep = out["drs"].keep = False  # the front end's answers: not this test's
    gp = golden_step.IntParams.from_config(pc, touch_q=0)  # 0: a read alone resets idle
    regs = {
        "alpha": gp.alpha_q, "touch": gp.touch_q, "shift": gp.shift, "k": BATCH, "window": 2,
        "depth": 1, "blend_rope": fx.blend_to_q16(pc.prefetch_blend)[0], "hdm_commit": 1,
        "hdm_base": BASE >> 28, "hdm_size": 1, "hdm_ig": 0, "hdm_iw": 0, "hdm_pos": 0,
    }  # fmt: skip
    for name, value in regs.items():
        getattr(dut, name).value = value
    clock.start_clock()
    await clock.reset(cycles=2)
    clock.start()
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
        await src["rec_w"].send({"addr": g, "data": recs})
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
            await src["report"].send({"index": e, "weight": wt})
            w[e], read[e] = max(w[e], wt), True
            counts["reports"] += 1
        for _ in range(rng.randrange(0, 4)):  # host reads through CXL.mem
            e = rng.randrange(N)
            msg = cxl.M2SReq(opcode=cxl.M2SReqOpcode.MEM_RD, tag=e, addr=(BASE >> 6) + e)
            await src["req"].send(cxl.pack(msg))
            await clock.wait(10)
            read[e] = True
            counts["cxl_reads"] += 1
        # Within the step: score as stored, idle 0 if touched, nothing written back.
        k = rng.randrange(0, BATCH + 1)
        mid = golden_step.evaluate(score, idle, w, read, ~pinned, k, gp)
        got = await _sweep(dut, src, out["victim"], hold=1, keep=1, k=k)
        compare(f"step {step} evaluation (k {k})", got, mid.pairs())
        counts["evaluations"] += 1
        # The update sweep (the weight buffer was kept).
        r = golden_step.step(score, idle, w, read, ~pinned, BATCH, gp)
        score, idle = r.score, r.idle
        got = await _sweep(dut, src, out["victim"], hold=0, keep=0, k=BATCH)
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
        src["pf_touch"].put(touch)
        got_pf = []
        while (p := await out["pf_cand"].recv(timeout=200)) is not None:
            if not p["empty"]:
                got_pf.append(p["id"])
            if p["last"]:
                break
        compare(f"step {step} prefetch {t}", got_pf, want_pf)
    res = {"simulator": cocotb.SIM_NAME, "mismatches": len(bad), "examples": bad[:3], **counts}
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert not bad, f"{len(bad)} mismatches: {bad[:3]}"
