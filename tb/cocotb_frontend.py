"""cocotb entry point: the CXL.mem front end on Verilator or Icarus (via :mod:`kvcxl.tb.runner`).

Random M2S messages from :class:`kvcxl.tb.frontend_model.FrontEndModel`, random
back-pressure on NDR, DRS and touch; every response and touch is compared with the
model's (HDM decoder + line store).  Configuration in KVCXL_TB_CONFIG (JSON: seed,
messages, results path; the shape and the HDM setups are :mod:`kvcxl.tb.frontend_model`'s);
the figures go to the results file.
"""

from __future__ import annotations

import json
import os

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from kvcxl.firmware.cxl import mem as cxl
from kvcxl.tb.frontend_model import (
    ENTRY_SHIFT,
    LINES,
    SETUPS,
    FrontEndModel,
    ends_without_response,
    response,
)

OUTPUTS = ("ndr", "drs", "touch")


async def _one_setup(dut, model: FrontEndModel, n_msgs: int, cycles: list[int]) -> list:
    """Send ``n_msgs`` messages; returns the mismatches (expected, got) found."""
    rng = model.rng
    for name, value in model.registers().items():
        getattr(dut, name).value = value
    bad = []
    for msg in model.messages(n_msgs):
        want = model.expect(msg)
        got = []
        port = "rwd" if isinstance(msg, cxl.M2SRwD) else "req"
        getattr(dut, f"{port}__payload").value = cxl.pack(msg)
        getattr(dut, f"{port}__valid").value = 1
        done = False
        for _ in range(20):  # until accepted and answered
            for o in OUTPUTS:
                getattr(dut, f"{o}__ready").value = int(rng.random() > 0.3)
            await ReadOnly()  # what the coming rising edge transfers
            accepted = bool(getattr(dut, f"{port}__valid").value) and bool(
                getattr(dut, f"{port}__ready").value
            )
            for o in OUTPUTS:
                if not int(getattr(dut, f"{o}__valid").value):
                    continue
                if not int(getattr(dut, f"{o}__ready").value):
                    model.counts["stalls"] += 1
                    continue
                bits = int(getattr(dut, f"{o}__payload").value)
                if o == "touch":
                    model.counts["touches"] += 1
                    got.append(("touch", bits))
                else:
                    r, ld_id = response(o, bits)
                    got.append(r)
                    if ld_id != msg.ld_id:
                        bad.append((("ld_id", msg.ld_id), ("ld_id", ld_id)))
                    done = True
            await RisingEdge(dut.clk)
            await FallingEdge(dut.clk)
            cycles[0] += 1
            if accepted:
                getattr(dut, f"{port}__valid").value = 0
            if done:
                break
        else:
            if not ends_without_response(msg):
                bad.append((want, "no response"))
        getattr(dut, f"{port}__valid").value = 0
        if got != want:
            bad.append((want, got))
    return bad


@cocotb.test()
async def front_end_matches_hdm_and_line_store(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    for o in ("req", "rwd"):
        getattr(dut, f"{o}__valid").value = 0
    dut.rst.value = 1
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0
    for _ in range(10):  # let every combinational block settle before the first message
        await FallingEdge(dut.clk)
    cycles, bad, counts, store = [0], [], {}, {}
    for i, (ways, granularity, position) in enumerate(SETUPS):
        # One device reprogrammed: its line store carries over from setup to setup.
        model = FrontEndModel(
            cfg["seed"] + i, ways, granularity, position, LINES, ENTRY_SHIFT, store
        )
        bad += await _one_setup(dut, model, cfg["messages"], cycles)
        for k, v in model.counts.items():
            counts[k] = counts.get(k, 0) + v
    res = {
        "simulator": cocotb.SIM_NAME,
        "messages": cfg["messages"] * len(SETUPS),
        "mismatches": len(bad),
        "examples": [repr(b)[:300] for b in bad[:3]],
        "cycles": cycles[0],
        **counts,
    }
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert res["mismatches"] == 0, f"{res['mismatches']} mismatches: {res['examples']}"
