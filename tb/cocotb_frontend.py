"""cocotb entry point: the CXL.mem front end on Verilator or Icarus (via :mod:`kvcxl.tb.runner`).

Random M2S messages from :class:`kvcxl.tb.frontend_model.FrontEndModel` through stream
Sources, random back-pressure on NDR, DRS and touch (stream Sinks; :mod:`kvcxl.tb.streams`);
every response and touch is compared with the model's (HDM decoder + line store).
Configuration in KVCXL_TB_CONFIG (JSON: seed, messages, results path; the shape and the HDM
setups are :mod:`kvcxl.tb.frontend_model`'s); the figures go to the results file.
"""

from __future__ import annotations

import json
import os

import cocotb

from kvcxl.cxl import mem as cxl
from kvcxl.tb.frontend_model import (
    ENTRY_SHIFT,
    LINES,
    SETUPS,
    FrontEndModel,
    ends_without_response,
    response,
)
from kvcxl.tb.streams import Clock, Pause, Sink, Source

OUTPUTS = ("ndr", "drs", "touch")
STALL = 0.3  # probability that an output is not ready in a cycle
ANSWER_CYCLES = 20  # a message not answered within this many cycles is a failure


class _Bench:
    """The front end's streams: Sources on req and rwd, Sinks on ndr, drs and touch."""

    def __init__(self, dut) -> None:
        self.clock = Clock(dut)
        self.src = {p: Source(self.clock, p) for p in ("req", "rwd")}
        self.sinks = {o: Sink(self.clock, o) for o in OUTPUTS}
        self.got: list = []  # responses and touches, in transfer order
        self.ld_ids: list[int] = []
        for o, sink in self.sinks.items():
            sink.keep = False
            sink.on_beat.append(lambda bits, o=o: self._take(o, bits))

    def _take(self, o: str, bits: int) -> None:
        if o == "touch":
            self.got.append(("touch", bits))
        else:
            r, ld_id = response(o, bits)
            self.got.append(r)
            self.ld_ids.append(ld_id)

    def back_pressure(self, rng) -> None:
        for sink in self.sinks.values():
            sink.pause = Pause(STALL, rng)

    def stalls(self) -> int:
        return sum(s.stalls for s in self.sinks.values())


async def _one_setup(bench: _Bench, dut, model: FrontEndModel, n_msgs: int) -> list:
    """Send ``n_msgs`` messages; returns the mismatches (expected, got) found."""
    for name, value in model.registers().items():
        getattr(dut, name).value = value
    bench.back_pressure(model.rng)
    stalls0, touches0 = bench.stalls(), bench.sinks["touch"].beats
    bad = []
    for msg in model.messages(n_msgs):
        want = model.expect(msg)
        bench.got, bench.ld_ids = [], []
        port = "rwd" if isinstance(msg, cxl.M2SRwD) else "req"
        bench.src[port].put(cxl.pack(msg))
        for _ in range(ANSWER_CYCLES):  # until answered (a response ends the message)
            await bench.clock.wait()
            if bench.ld_ids:
                break
        else:
            if not ends_without_response(msg):
                bad.append((want, "no response"))
        bad += [(("ld_id", msg.ld_id), ("ld_id", i)) for i in bench.ld_ids if i != msg.ld_id]
        if bench.got != want:
            bad.append((want, bench.got))
    model.counts["stalls"] += bench.stalls() - stalls0
    model.counts["touches"] += bench.sinks["touch"].beats - touches0
    return bad


@cocotb.test()
async def front_end_matches_hdm_and_line_store(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    bench = _Bench(dut)
    bench.clock.start_clock()
    await bench.clock.reset(cycles=2)
    bench.clock.start()
    await bench.clock.wait(10)  # let every combinational block settle before the first message
    bad, counts, store = [], {}, {}
    for i, (ways, granularity, position) in enumerate(SETUPS):
        # One device reprogrammed: its line store carries over from setup to setup.
        model = FrontEndModel(
            cfg["seed"] + i, ways, granularity, position, LINES, ENTRY_SHIFT, store
        )
        bad += await _one_setup(bench, dut, model, cfg["messages"])
        for k, v in model.counts.items():
            counts[k] = counts.get(k, 0) + v
    res = {
        "simulator": cocotb.SIM_NAME,
        "messages": cfg["messages"] * len(SETUPS),
        "mismatches": len(bad),
        "examples": [repr(b)[:300] for b in bad[:3]],
        "cycles": bench.clock.cycles,
        **counts,
    }
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert res["mismatches"] == 0, f"{res['mismatches']} mismatches: {res['examples']}"
