"""cocotb entry point: the CXL.mem front end on Verilator or Icarus (via :mod:`kvcxl.tb.runner`).

Random M2S messages from :class:`kvcxl.tb.frontend_model.FrontEndModel`, random
back-pressure on NDR, DRS and touch; every response and touch is compared with the
model's (HDM decoder + line store).  Configuration in KVCXL_TB_CONFIG (JSON: seed,
messages, lines, entry_shift, setups, results path); the figures go to the results file.
"""

from __future__ import annotations

import json
import os

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from kvcxl.firmware.cxl import mem as cxl
from kvcxl.tb.frontend_model import FrontEndModel, ends_without_response, response

OUTPUTS = ("ndr", "drs", "touch")


CHECKED = ("opcode", "tag", "ld_id", "poison", "data")  # the response fields compared


def _bits(value, port: str, model: FrontEndModel) -> int:
    """A payload as an integer.  On Icarus the responses' constant fields (meta field, meta
    value, DevLoad: combinational blocks without a changing input) stay X; they are not
    compared, so X there reads as 0, but an X in a compared field counts as a mismatch."""
    if value.is_resolvable:
        return int(value)
    s = str(value)  # most significant bit first
    if port != "touch":
        cls = cxl.S2M_NDR if port == "ndr" else cxl.S2M_DRS
        offs = cls.offsets()
        for i, c in enumerate(s):
            b = len(s) - 1 - i
            if c not in "01" and any(
                lsb <= b < lsb + w for n, (lsb, w) in offs.items() if n in CHECKED
            ):
                model.counts["x_in_checked"] = model.counts.get("x_in_checked", 0) + 1
        model.counts["x_unchecked"] = model.counts.get("x_unchecked", 0) + 1
    return int("".join(c if c in "01" else "0" for c in s), 2)


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
                bits = _bits(getattr(dut, f"{o}__payload").value, o, model)
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
    # One MemInv before the test: Icarus evaluates a combinational block only when an input
    # of it changes, and the front end's ready outputs depend on its state alone, which
    # reset leaves as it was; this moves the state (the front end takes a beat in IDLE).
    dut.req__payload.value = cxl.pack(cxl.M2SReq(opcode=cxl.M2SReqOpcode.MEM_INV, tag=0, addr=0))
    dut.req__valid.value = 1
    for o in OUTPUTS:
        getattr(dut, f"{o}__ready").value = 1
    await FallingEdge(dut.clk)
    dut.req__valid.value = 0
    for _ in range(6):
        await FallingEdge(dut.clk)
    cycles, bad, counts, store = [0], [], {}, {}
    for i, (ways, granularity, position) in enumerate(cfg["setups"]):
        # One device reprogrammed: its line store carries over from setup to setup.
        model = FrontEndModel(
            cfg["seed"] + i, ways, granularity, position, cfg["lines"], cfg["entry_shift"], store
        )
        bad += await _one_setup(dut, model, cfg["messages"], cycles)
        for k, v in model.counts.items():
            counts[k] = counts.get(k, 0) + v
    res = {
        "simulator": cocotb.SIM_NAME,
        "messages": cfg["messages"] * len(cfg["setups"]),
        "mismatches": len(bad) + counts.get("x_in_checked", 0),
        "examples": [repr(b)[:300] for b in bad[:3]],
        "cycles": cycles[0],
        **counts,
    }
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert res["mismatches"] == 0, f"{res['mismatches']} mismatches: {res['examples']}"
