"""cocotb entry point: the TierBoundary engine (rtl/tier_boundary.py) on Verilator or Icarus.

Step boundaries, random (``tier_boundary_model.random_boundary``) and from whole traces
replayed by the simulator with managed tiers (``trace_boundaries``: the firmware session's
own inputs and moves), each planned by the host's sweeps
(:func:`kvcxl.rtl.tier_boundary.host_sweeps`): a stream Source puts each sweep's beats on
``cand`` with random gaps, a Sink takes ``move`` with random back-pressure, and the
scoreboard compares every sweep with the firmware's plan over its integers
(``plan_sweep``: ``background_plan`` itself), and every boundary's moves, in order, with
what the firmware session decided.  Configuration in KVCXL_TB_CONFIG (JSON: design, plans,
seed, results path).
"""

from __future__ import annotations

import json
import os
import pickle
import random

import cocotb

from kvcxl.firmware.formulas import TIER_HBM
from kvcxl.rtl.tier_boundary import (
    host_sweeps,
    move_layout,
    plan_sweep,
    sweep_layout,
    threshold_q16,
)
from kvcxl.tb.streams import Clock, Pause, Sink, Source
from kvcxl.tb.tier_boundary_model import BATCH, ENTRIES, LANES, random_boundary, trace_boundaries

STALL, GAP = 0.3, 0.2  # probabilities: move not ready, a cand beat withheld
TRACES = ("uniform", "retrieval", "zipf-sessions")  # CXL DRAM at 5 % of the entries


class Bench:
    def __init__(self, dut, rng: random.Random, entries: int = ENTRIES, batch: int = BATCH):
        self.dut, self.batch = dut, batch
        self.clock = Clock(dut)
        addr_bits = max((entries // LANES - 1).bit_length(), 1)
        self.cand = Source(self.clock, "cand", sweep_layout(LANES, addr_bits), Pause(GAP, rng))
        index_bits = max((entries - 1).bit_length(), 1)
        self.move = Sink(self.clock, "move", move_layout(index_bits), Pause(STALL, rng))
        self.sweeps = self.bad_sweeps = 0
        self.bad: list[str] = []

    async def start(self) -> None:
        self.clock.start_clock()
        await self.clock.reset(cycles=2)
        self.clock.start()

    async def sweep(self, tier, score, budget, down_room, up_room, thr, hang: int):
        """One sweep; its moves as (index, up, score), or None if the plan never ended."""
        d = self.dut
        d.threshold.value, d.budget.value = thr, budget
        d.down_room.value, d.up_room.value = down_room, up_room
        n = -(-tier.size // LANES)
        for a in range(n):
            lane = []
            for i in range(LANES):
                e = a * LANES + i
                inside = e < tier.size
                lane.append({"score": int(score[e]) if inside else 0,
                             "tier": int(tier[e]) if inside else TIER_HBM})  # fmt: skip
            self.cand.put({"addr": a, "last": int(a == n - 1), "lane": lane})
        moves = []
        while True:
            beat = await self.move.recv(timeout=hang)
            if beat is None:
                return None
            if not beat["empty"]:
                moves.append((beat["index"], beat["up"], beat["score"]))
            if beat["last"]:
                return moves

    async def boundary(self, bnd, where: str) -> int:
        """Plan one boundary through the host's sweeps; the moves it made."""
        thr = threshold_q16(bnd.evict_threshold)
        gen = host_sweeps(bnd.tier, bnd.score, bnd.budget, bnd.room, bnd.nvme_room, self.batch)
        hang = 4 * (bnd.tier.size // LANES + 1) + 40 * self.batch + 100
        try:
            req = next(gen)
            while True:
                got = await self.sweep(*req, thr, hang)
                self.sweeps += 1
                want = plan_sweep(*req, thr)
                if got is None:
                    self.bad.append(f"{where}: sweep {self.sweeps} never ended (a hang)")
                    return 0
                pairs = [(i, u) for i, u, _ in got]
                scores_ok = all(s == int(req[1][i]) for i, _, s in got)
                if pairs != want or not scores_ok:
                    self.bad_sweeps += 1
                    self.bad.append(f"{where}: sweep moves {got}, firmware {want}")
                req = gen.send(pairs)
        except StopIteration as done:
            down, up = done.value
        if (down, up) != (bnd.down, bnd.up):
            self.bad.append(f"{where}: moves {down} / {up}, firmware {bnd.down} / {bnd.up}")
        return len(down) + len(up)


@cocotb.test()
async def tier_boundary_test(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    rng = random.Random(cfg["seed"])
    bench = Bench(dut, rng, cfg.get("entries", ENTRIES), cfg.get("batch", BATCH))
    await bench.start()
    res = {"simulator": cocotb.SIM_NAME, "design": cfg["design"], "random_boundaries": 0,
           "trace_boundaries": 0, "moving_boundaries": 0, "downs": 0, "ups": 0,
           "moves_checked": 0}  # fmt: skip
    cases = [("random", i, random_boundary(rng)) for i in range(cfg["plans"])]
    if "boundaries" in cfg:  # a replay's recorded boundaries (kvcxl rtl sim --boundary)
        with open(cfg["boundaries"], "rb") as f:
            cases += [("replay", i, b) for i, b in enumerate(pickle.load(f))]
    else:
        for wl in TRACES:
            found = trace_boundaries(wl, cxl_share=0.05)
            cases += [(wl, i, b) for i, b in enumerate(found) if b.down or b.up]
    for src, i, bnd in cases:
        res["random_boundaries" if src == "random" else "trace_boundaries"] += 1
        res["moving_boundaries"] += bool(bnd.down or bnd.up)
        res["downs"] += len(bnd.down)
        res["ups"] += len(bnd.up)
        res["moves_checked"] += await bench.boundary(bnd, f"{src} boundary {i}")
        if len(bench.bad) > 20:
            break
    res.update(
        sweeps=bench.sweeps,
        mismatches=len(bench.bad),
        examples=[b[:300] for b in bench.bad[:3]],
        cycles=bench.clock.cycles,
        move_stalls=bench.move.stalls,
        cand_gaps=bench.cand.gaps,
    )
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert not bench.bad, f"{len(bench.bad)} mismatches: {res['examples']}"
