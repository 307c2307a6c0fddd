"""cocotb entry point: a slot-queue engine (CLOCK or SIEVE) on Verilator or Icarus.

The bench is the engine's host: it streams random commands (``slot_queue_model.script``)
through a stream Source on ``cmd`` and takes the victims through a Sink on ``victim``
with random back-pressure; the victims of every WALK must equal the golden step's
(:class:`kvcxl.firmware.golden_clock.SlotQueue`).  A Monitor on the ``visit`` tap counts
what the walks did (slots stepped over, counters taken down, victims).  Configuration in
KVCXL_TB_CONFIG (JSON: design, commands, seed, results path).
"""

from __future__ import annotations

import json
import os
import random

import cocotb

from kvcxl.rtl import layouts as L
from kvcxl.tb.slot_queue_model import SLOTS, script
from kvcxl.tb.streams import Clock, Monitor, Pause, Sink, Source

STALL = 0.3  # probability that victim is not ready in a cycle
KINDS = {L.VISIT_SKIP: "skipped", L.VISIT_DECREMENT: "decremented", L.VISIT_VICTIM: "evicted"}


@cocotb.test()
async def slot_queue_matches_the_golden_step(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    policy = cfg["design"]
    rng = random.Random(cfg["seed"])
    ceiling, cmds, want = script(policy, cfg["commands"], rng)
    index_bits = max((SLOTS - 1).bit_length(), 1)
    count_bits = SLOTS.bit_length()
    dut.ref_max.value = ceiling
    clock = Clock(dut)
    src = Source(clock, "cmd", L.slot_cmd_layout(index_bits, count_bits))
    sink = Sink(clock, "victim", L.slot_victim_layout(index_bits), Pause(STALL, rng))
    visits = dict.fromkeys(KINDS.values(), 0)

    def on_visit(beat: dict) -> None:
        visits[KINDS[beat["kind"]]] += 1

    Monitor(clock, "visit", L.slot_visit_layout(index_bits)).on_beat.append(on_visit)
    clock.start_clock()
    await clock.reset(cycles=2)
    clock.start()
    for op, s, arg, keep in cmds:
        src.put({"op": op, "slot": s, "arg": arg, "keep": keep})
    got: list[list[int]] = []
    walk: list[int] = []
    bad: list[str] = []
    while len(got) < len(want):
        beat = await sink.recv(timeout=20 * SLOTS * (ceiling + 2) + 50 * len(cmds))
        if beat is None:
            bad.append(f"walk {len(got)}: no last victim (a hang); got {got[-3:]} so far")
            break
        if not beat["empty"]:
            walk.append(beat["index"])
        if beat["last"]:
            got.append(walk)
            walk = []
    if not bad:  # (a hung engine takes no more commands)
        await src.flush()
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            bad.append(f"walk {i}: victims {g}, golden step {w}")
    res = {
        "simulator": cocotb.SIM_NAME,
        "design": policy,
        "ref_max": ceiling,
        "commands": len(cmds),
        "walks": len(got),
        "empty_walks": sum(1 for w in want if not w),
        "victims": sum(len(w) for w in got),
        **visits,
        "mismatches": len(bad),
        "examples": [b[:300] for b in bad[:3]],
        "cycles": clock.cycles,
        "victim_stalls": sink.stalls,
        "cmd_stalls": src.stalls,
    }
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert not bad, f"{len(bad)} mismatches: {res['examples']}"
