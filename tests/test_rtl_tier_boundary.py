"""The managed tiers' step boundary in RTL (rtl/tier_boundary.py) against the firmware's
plan (firmware/tiering.py ``background_plan``, as ``FirmwareSession._background`` calls it).

* the Q0.16 threshold bound equals the firmware's float test for every score;
* the host's split of a plan into sweeps of ``batch`` moves equals the firmware's plan on
  random boundaries and on every boundary of whole traces (pure Python, one sweep being
  the firmware's own plan over the sweep's integers);
* the engine in Amaranth's simulator: exhaustively over every table of 2 entries (tiers
  HBM / CXL DRAM / NVMe, scores T − 1, T, T + 1) and every budget and room up to the
  batch, each sweep equal to the firmware's plan and its invariants checked on their own;
  random boundaries and a trace's boundaries through the host's sweeps with random gaps
  and back-pressure; the planted ``sink_at_threshold`` defect is caught.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM, TIER_NVME
from kvcxl.rtl.tier_boundary import host_plan, plan_sweep, sweep_tiers, threshold_q16
from kvcxl.tb.tier_boundary_model import firmware_plan, random_boundary, trace_boundaries

TRACES = ("uniform", "retrieval", "zipf-sessions", "cyclic")
HANG = 1000  # cycles a sweep beat may wait before the engine counts as hung


@pytest.mark.parametrize("evict", [PolicyConfig.evict_threshold, 0.0, 1.0, 0.5, 1 / 3, 1e-9,
                                   1310 / 65536, 1311 / 65536])  # fmt: skip
def test_threshold_bound_is_the_firmware_test(evict):
    q = np.arange(fx.Q_ONE)
    t = threshold_q16(evict)
    assert np.array_equal(q < t, fx.from_q16(q) < evict)


def _py_sweep(threshold):
    return lambda tier, score, b, dr, ur: plan_sweep(tier, score, b, dr, ur, threshold)


def _check_split(bnd, batch: int) -> None:
    got = host_plan(
        _py_sweep(threshold_q16(bnd.evict_threshold)), bnd.tier, bnd.score, bnd.budget,
        bnd.room, bnd.nvme_room, batch,
    )  # fmt: skip
    assert got == (bnd.down, bnd.up), (batch, bnd.budget, bnd.room, bnd.nvme_room)


@pytest.mark.parametrize("batch", [1, 3, 8, 64])
def test_host_sweeps_equal_the_firmware_plan_on_random_boundaries(batch):
    rng = random.Random(batch)
    moved = 0
    for _ in range(400):
        bnd = random_boundary(rng, batch=batch)
        _check_split(bnd, batch)
        moved += len(bnd.down) + len(bnd.up)
    assert moved > 0


@pytest.mark.parametrize("workload", TRACES)
def test_host_sweeps_equal_the_firmware_on_trace_boundaries(workload):
    found = trace_boundaries(workload, cxl_share=0.05)
    assert sum(len(b.down) for b in found) > 0
    for bnd in found:
        for batch in (5, 16, 256):
            _check_split(bnd, batch)


# --- the engine in Amaranth's simulator -----------------------------------------------------


def _run_engine(dut, sweeps, rng: random.Random, stall: float = 0.3, gap: float = 0.2):
    """Run ``sweeps`` (tier, score, budget, down_room, up_room, threshold) through ``dut`` in
    one simulation; each sweep's moves as (index, up, score), and the cycles taken."""
    from amaranth.sim import Simulator

    lanes = dut.lanes
    out: list[list[tuple[int, int, int]]] = []
    cycles = [0]

    async def bench(ctx):
        for tier, score, budget, down_room, up_room, thr in sweeps:
            ctx.set(dut.threshold, thr)
            ctx.set(dut.budget, budget)
            ctx.set(dut.down_room, down_room)
            ctx.set(dut.up_room, up_room)
            n = -(-tier.size // lanes)
            for a in range(n):
                lane = []
                for i in range(lanes):
                    e = a * lanes + i
                    t = int(tier[e]) if e < tier.size else TIER_HBM
                    s = int(score[e]) if e < tier.size else 0
                    lane.append({"score": s, "tier": t})
                while rng.random() < gap:
                    await ctx.tick()
                    cycles[0] += 1
                ctx.set(dut.cand.payload, {"addr": a, "last": a == n - 1, "lane": lane})
                ctx.set(dut.cand.valid, 1)
                for _ in range(HANG):
                    *_, ready = await ctx.tick().sample(dut.cand.ready)
                    cycles[0] += 1
                    if ready:
                        break
                else:
                    out.append([(-1, -1, -1)])  # the engine never took the sweep
                    return
                ctx.set(dut.cand.valid, 0)
            moves = []
            for _ in range(HANG):
                r = int(rng.random() >= stall)
                ctx.set(dut.move.ready, r)
                pm = dut.move.payload
                *_, valid, idx, up, sc, last, empty = await ctx.tick().sample(
                    dut.move.valid, pm.index, pm.up, pm.score, pm.last, pm.empty
                )
                cycles[0] += 1
                if valid and r:
                    if not empty:
                        moves.append((int(idx), int(up), int(sc)))
                    if last:
                        break
            else:
                moves.append((-1, -1, -1))  # the plan never ended
            ctx.set(dut.move.ready, 0)
            out.append(moves)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return out, cycles[0]


def _invariants(tier, score, budget, down_room, up_room, thr, moves) -> list[str]:
    """What every plan must satisfy, checked without the firmware's plan."""
    bad = []
    ids = [i for i, _, _ in moves]
    if len(set(ids)) != len(ids):
        bad.append("an entry moved twice")
    downs = [(i, s) for i, u, s in moves if not u]
    ups = [(i, s) for i, u, s in moves if u]
    if any(u for _, u, _ in moves[: len(downs)]):
        bad.append("an up before a down")
    for i, s in downs:
        if not (tier[i] == TIER_CXL and score[i] < thr and s == score[i]):
            bad.append(f"down {i}: not a CXL DRAM entry below the threshold")
    for i, s in ups:
        if not (tier[i] == TIER_NVME and score[i] >= thr and s == score[i]):
            bad.append(f"up {i}: not an NVMe entry at or above the threshold")
    if len(moves) > budget or len(downs) > down_room or len(ups) > up_room + len(downs):
        bad.append("over the budget or a room")
    for seq, key in ((downs, 1), (ups, -1)):  # lowest (downs) / highest (ups) first, ties id
        if seq != sorted(seq, key=lambda x: (key * x[1], x[0])):
            bad.append("out of order")
    return bad


def _exhaustive(defect=None) -> tuple[int, list[str]]:
    from kvcxl.rtl.tier_boundary import TierBoundary

    thr = 5
    tiers = (TIER_HBM, TIER_CXL, TIER_NVME)
    sweeps, want = [], []
    for tv in itertools.product(tiers, repeat=2):
        for sv in itertools.product((thr - 1, thr, thr + 1), repeat=2):
            tier, score = np.array(tv, np.uint8), np.array(sv, np.int64)
            for b, dr, ur in itertools.product(range(3), repeat=3):
                sweeps.append((tier, score, b, dr, ur, thr))
                want.append(plan_sweep(tier, score, b, dr, ur, thr))
    dut = TierBoundary(2, 1, 2, defect=defect)
    got, _ = _run_engine(dut, sweeps, random.Random(1), stall=0.2, gap=0.0)
    bad = []
    for sw, g, w in zip(sweeps, got, want, strict=True):
        pairs = [(i, u) for i, u, _ in g]
        if pairs != w:
            bad.append(f"{sw[:5]}: engine {pairs}, firmware {w}")
        bad += _invariants(*sw, g)
    return len(sweeps), bad


@pytest.mark.hdl
def test_engine_exhaustive_on_two_entries():
    n, bad = _exhaustive()
    assert n == 9 * 9 * 27
    assert not bad, bad[:5]


@pytest.mark.hdl
def test_planted_sink_at_threshold_is_caught():
    _, bad = _exhaustive("sink_at_threshold")
    assert any("engine" in b for b in bad) and any("below the threshold" in b for b in bad)


@pytest.mark.hdl
def test_planted_ups_ignore_downs_is_caught():
    """The ups bounded by the budget, not by what the downs left (the formal check's
    second defect): a plan over its budget."""
    _, bad = _exhaustive("ups_ignore_downs")
    assert any("engine" in b for b in bad) and "over the budget or a room" in bad


@pytest.mark.hdl
def test_engine_host_sweeps_equal_the_firmware():
    """Random boundaries (up to 24 entries, 4 lanes, batch 4) and the boundaries of a trace
    (retrieval, 472 entries), through the host's sweeps of the engine."""
    from kvcxl.rtl.tier_boundary import TierBoundary

    rng = random.Random(7)
    cases = [random_boundary(rng, entries=24, batch=4) for _ in range(40)]
    cases += [b for b in trace_boundaries("retrieval", cxl_share=0.05) if b.down or b.up]
    dut = TierBoundary(512, 4, 4)
    for bnd in cases:
        thr = threshold_q16(bnd.evict_threshold)
        calls = []

        def sweep(tier, score, b, dr, ur, thr=thr, calls=calls):
            calls.append((tier.copy(), score, b, dr, ur, thr))
            return plan_sweep(tier, score, b, dr, ur, thr)

        host_plan(sweep, bnd.tier, bnd.score, bnd.budget, bnd.room, bnd.nvme_room, 4)
        got, _ = _run_engine(dut, calls, rng)
        want = [plan_sweep(*c) for c in calls]
        assert [[(i, u) for i, u, _ in g] for g in got] == want
        flat = [m for g in got for m in g]
        assert ([i for i, u, _ in flat if not u], [i for i, u, _ in flat if u]) == (
            bnd.down,
            bnd.up,
        )
        assert all(s == bnd.score[i] for i, _, s in flat)


def test_sweep_tiers_hides_uncreated_ids():
    from kvcxl.firmware.tiering import NONE

    t = sweep_tiers(np.array([NONE, TIER_CXL, TIER_NVME, TIER_HBM, 0], np.uint8))
    assert t.tolist() == [TIER_HBM, TIER_CXL, TIER_NVME, TIER_HBM, TIER_HBM]
    assert firmware_plan(t, np.zeros(5, np.int64), 0, 9, 9, 0.5) == ([], [])


@pytest.mark.slow
@pytest.mark.hdl
@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_tier_boundary_bench_on_both_simulators(sim):
    """The cocotb bench (tb/cocotb_tier_boundary.py): 60 random boundaries and every moving
    boundary of three traces, each sweep and each boundary against the firmware."""
    from kvcxl.tb.runner import run_unit

    r = run_unit("tier_boundary", sim, count=60)
    assert r["mismatches"] == 0 and r["random_boundaries"] == 60
    for key in ("trace_boundaries", "downs", "ups", "moves_checked", "move_stalls", "cand_gaps"):
        assert r[key] > 0, f"{key} never exercised: {r}"


@pytest.mark.slow
@pytest.mark.hdl
def test_tier_boundary_bench_catches_the_planted_defect():
    from kvcxl.tb.runner import TbFailure, run_unit

    with pytest.raises(TbFailure, match="firmware"):
        run_unit("tier_boundary", "icarus", count=60, defect="sink_at_threshold")


@pytest.mark.slow
@pytest.mark.hdl
def test_rtl_sim_plans_every_boundary_of_a_replay_with_the_engine(tmp_path):
    """``kvcxl rtl sim --check --boundary``: the replay's step boundaries (uniform, 8 steps,
    10 % HBM: every boundary demotes its full budget of 256) each planned by the Verilated
    engine, equal to the firmware's moves."""
    import json

    from kvcxl.cli.main import main

    trace = tmp_path / "u.npz"
    assert main(["trace", "export", "--workload", "uniform", "--steps", "8", "--read",
                 "topk:4", "-o", str(trace)]) == 0  # fmt: skip
    out = tmp_path / "r.json"
    assert main(["rtl", "sim", "--trace", str(trace), "--budget", "10%", "--check",
                 "--boundary", "--no-progress", "--json", str(out)]) == 0  # fmt: skip
    b = json.loads(out.read_text())["boundary"]
    assert b["mismatches"] == 0 and b["moving_boundaries"] == b["trace_boundaries"] == 8
    assert b["downs"] == 8 * 256 and b["moves_checked"] == b["downs"] + b["ups"]
