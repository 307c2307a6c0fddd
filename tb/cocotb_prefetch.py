"""cocotb entry point: the PrefetchEngine on Verilator or Icarus (via :mod:`kvcxl.tb.runner`).

The testbench is the engine's score memory (a synchronous read port always enabled, as
the PolicyEngine's shadow score memory is: the address of one rising edge is answered
before the next) and its host: for each parameter set of
:func:`kvcxl.tb.prefetch_model.configs` it writes the RoPE table and the level inputs,
then touches random blocks and takes the candidates with random back-pressure; every
candidate list is compared with the firmware's (``prefetch_model.expected``).
Configuration in KVCXL_TB_CONFIG (JSON: seed, touches, results path).
"""

from __future__ import annotations

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from kvcxl.rtl import layouts as L
from kvcxl.tb.prefetch_model import (
    BLOCKS,
    HEADS,
    LAYERS,
    configs,
    expected,
    random_scores,
    registers,
    sizes,
)


@cocotb.test()
async def prefetch_matches_firmware_int_mode(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    rng = random.Random(cfg["seed"])
    cfgs = configs()
    max_w, _ = sizes(cfgs)
    scores = random_scores(rng)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.touch__valid.value = 0
    dut.rope_w__valid.value = 0
    dut.cand__ready.value = 0
    dut.score_data.value = 0
    dut.rst.value = 1
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0

    async def edge():
        """From the ReadOnly phase: cross one rising edge, answer the score read the edge
        registered, stop at the falling edge (where inputs change)."""
        addr = int(dut.score_addr.value)
        await RisingEdge(dut.clk)
        await FallingEdge(dut.clk)
        dut.score_data.value = int(scores[addr]) if addr < scores.size else 0

    ports = _ports()
    cand = L.unpacker(ports["cand"])
    cases, bad, cycles, stalls = 0, [], 0, 0
    for pc in cfgs:
        table, regs = registers(pc, max_w)
        for a, v in enumerate(table):
            dut.rope_w__payload.value = L.pack(ports["rope_w"], {"addr": a, "data": v})
            dut.rope_w__valid.value = 1
            await ReadOnly()
            await edge()
            cycles += 1
        dut.rope_w__valid.value = 0
        for name, value in regs.items():
            getattr(dut, name).value = value
        for _ in range(cfg["touches"]):
            t = (rng.randrange(LAYERS), rng.randrange(HEADS), rng.randrange(BLOCKS))
            dut.touch__payload.value = L.pack(
                ports["touch"], {"layer": t[0], "head": t[1], "block": t[2]}
            )
            dut.touch__valid.value = 1
            got, sent, done = [], False, False
            for _ in range(2000):
                dut.cand__ready.value = int(rng.random() > 0.3)
                await ReadOnly()
                if not sent and int(dut.touch__ready.value):
                    sent = True
                if int(dut.cand__valid.value):
                    if int(dut.cand__ready.value):
                        p = cand(int(dut.cand__payload.value))
                        if not p["empty"]:
                            got.append((p["id"], p["rank"]))
                        done = bool(p["last"])
                    else:
                        stalls += 1
                await edge()
                cycles += 1
                if sent:
                    dut.touch__valid.value = 0
                if done:
                    break
            want = expected(t, scores, pc)
            if got != want:
                bad.append(f"touch {t}: got {got}, want {want}")
            cases += 1
    res = {
        "simulator": cocotb.SIM_NAME,
        "touches": cases,
        "configs": len(cfgs),
        "mismatches": len(bad),
        "examples": [b[:300] for b in bad[:3]],
        "cycles": cycles,
        "cand_stalls": stalls,
    }
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert not bad, f"{len(bad)} mismatches: {res['examples']}"


def _ports() -> dict:
    """The payload layouts of the engine's touch, cand and rope_w streams."""
    from kvcxl.rtl.prefetch import PrefetchEngine  # lazy: amaranth, for the layouts only

    max_w, max_d = sizes(configs())
    eng = PrefetchEngine(LAYERS, HEADS, BLOCKS, max_w, max_d)
    eng._MustUse__silence = True  # built for its signature, never elaborated
    m = eng.signature.members
    return {n: m[n].signature.members["payload"].shape for n in ("touch", "cand", "rope_w")}
