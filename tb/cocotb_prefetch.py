"""cocotb entry point: the PrefetchEngine on Verilator or Icarus (via :mod:`kvcxl.tb.runner`).

The testbench is the engine's score memory (a synchronous read port always enabled, as
the PolicyEngine's shadow score memory is: the address of one rising edge is answered
before the next; a clock endpoint) and its host, through stream Sources and a Sink
(:mod:`kvcxl.tb.streams`): for each parameter set of
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
from kvcxl.tb.streams import Clock, Pause, Sink, Source

STALL = 0.3  # probability that cand is not ready in a cycle


class ScoreMemory:
    """The engine's score memory as a clock endpoint: the address a rising edge registers is
    answered at the next falling edge."""

    def __init__(self, clock: Clock, scores) -> None:
        self.dut, self.scores, self.addr = clock.dut, scores, None
        self.dut.score_data.value = 0
        clock.add(self)

    def drive(self) -> None:
        if self.addr is not None:
            a = self.addr
            self.dut.score_data.value = int(self.scores[a]) if a < self.scores.size else 0

    def sample(self) -> None:
        self.addr = int(self.dut.score_addr.value)


@cocotb.test()
async def prefetch_matches_firmware_int_mode(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    rng = random.Random(cfg["seed"])
    cfgs = configs()
    max_w, _ = sizes(cfgs)
    scores = random_scores(rng)
    ports = _ports()
    clock = Clock(dut)
    ScoreMemory(clock, scores)
    touch = Source(clock, "touch", ports["touch"])
    rope_w = Source(clock, "rope_w", ports["rope_w"])
    cand = Sink(clock, "cand", ports["cand"], Pause(STALL, rng))
    clock.start_clock()
    await clock.reset(cycles=2)
    clock.start()
    cases, bad = 0, []
    for pc in cfgs:
        table, regs = registers(pc, max_w)
        for a, v in enumerate(table):
            rope_w.put({"addr": a, "data": v})
        await rope_w.flush()
        for name, value in regs.items():
            getattr(dut, name).value = value
        for _ in range(cfg["touches"]):
            t = (rng.randrange(LAYERS), rng.randrange(HEADS), rng.randrange(BLOCKS))
            touch.put({"layer": t[0], "head": t[1], "block": t[2]})
            got = []
            while True:
                p = await cand.recv(timeout=2000)
                if p is None:
                    bad.append(f"touch {t}: no last candidate within 2000 cycles")
                    break
                if not p["empty"]:
                    got.append((p["id"], p["rank"]))
                if p["last"]:
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
        "cycles": clock.cycles,
        "cand_stalls": cand.stalls,
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
