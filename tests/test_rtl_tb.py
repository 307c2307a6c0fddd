"""cocotb + pyuvm testbenches of the policy engine RTL, bit-exact against kvcxl.firmware.

Each simulator runs ≥ 10 k eviction passes and ≥ 100 k entry updates with random
back-pressure, table rewrites into corner scenarios and parameter changes mid-run;
the seed is printed (set KVCXL_TB_SEED to replay one).  A planted tie-break defect
must be caught.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.hdl]

STEPS = 10_000
CORE = {"entries": 16, "lanes": 4, "batch": 4}


def _seed() -> int | None:
    s = os.environ.get("KVCXL_TB_SEED")
    return int(s) if s else None


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_core_bit_exact(sim):
    from kvcxl.tb.runner import run_core

    r = run_core(sim, steps=STEPS, seed=_seed(), **CORE)
    print(
        f"{sim}: seed {r['config']['seed']}, {r['bus_cycles']} cycles, {r['cycles_per_s']} cycles/s"
    )
    assert r["entry_mismatches"] == 0 and r["pass_mismatches"] == 0
    assert r["wrong_victims"] == 0 and r["misordered_victims"] == 0
    assert r["entry_updates_checked"] >= 100_000
    assert r["passes_checked"] >= 10_000 and r["audited_passes"] == r["passes_checked"]
    # Every corner case was actually exercised, not just planned.
    for corner in (
        "tie_passes",
        "score_saturations",
        "idle_saturations",
        "all_pinned_passes",
        "empty_passes",
        "batch_over_eligible_passes",
        "k_zero_passes",
        "param_changes",
        "bus_upd_stalls",
        "bus_upd_gaps",
        "bus_victim_stalls",
    ):
        assert r[corner] > 0, f"corner {corner} never happened (seed {r['config']['seed']})"


def test_planted_tie_break_defect_is_caught():
    from kvcxl.tb.runner import run_core

    r = run_core("icarus", steps=300, seed=_seed(), defect="tie_off_by_one", **CORE)
    assert r["pass_mismatches"] > 0
    assert r["misordered_victims"] > 0
    assert r["entry_mismatches"] == 0  # the defect is in eviction only


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_front_end_on_both_simulators(sim):
    """The CXL.mem front end's Verilog on Verilator and Icarus: 150 random M2S messages per HDM
    setup (1, 2, 4 ways), every response and touch against kvcxl.tb.frontend_model."""
    from kvcxl.tb.runner import run_frontend

    r = run_frontend(sim, messages=150, seed=_seed())
    print(f"{sim}: {r['messages']} messages, {r['cycles']} cycles, {r['run_s']} s")
    assert r["mismatches"] == 0 and r["messages"] == 450
    for key in ("reads", "nxm", "writes", "touches", "stalls", "spec", "inv"):
        assert r[key] > 0, f"{key} never exercised: {r}"


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_prefetch_on_both_simulators(sim):
    """The PrefetchEngine's Verilog on Verilator and Icarus: 6 random touches under each of five
    parameter sets, every candidate list against kvcxl.firmware.prefetch (int mode)."""
    from kvcxl.tb.runner import run_prefetch

    r = run_prefetch(sim, touches=6, seed=_seed())
    print(f"{sim}: {r['touches']} touches, {r['cycles']} cycles, {r['run_s']} s")
    assert r["mismatches"] == 0 and r["touches"] == 30 and r["cand_stalls"] > 0


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_top_on_both_simulators(sim):
    """The PolicyEngine top's Verilog on Verilator and Icarus: 12 steps of weight reports and
    CXL.mem reads, an evaluation sweep (hold, keep) and an update sweep per step, and a
    prefetch request, every victim list and prefetch list against kvcxl.firmware."""
    from kvcxl.tb.runner import run_top

    r = run_top(sim, steps=12, seed=_seed())
    print(f"{sim}: {r['steps']} steps, {r['victims']} victims, {r['run_s']} s")
    assert r["mismatches"] == 0 and r["steps"] == 12 and r["evaluations"] == 12
    assert r["victims"] > 0 and r["cxl_reads"] > 0 and r["reports"] > 0


@pytest.mark.parametrize("design", ["clock", "sieve"])
@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_slot_queue_engines_on_both_simulators(sim, design):
    """CLOCK and SIEVE engines (8 slots) on Verilator and Icarus: 400 random host commands,
    every walk's victims against the golden step (firmware/golden_clock.py)."""
    from kvcxl.tb.runner import run_unit

    r = run_unit(design, sim, count=400, seed=_seed())
    print(f"{sim} {design}: {r['walks']} walks, {r['victims']} victims, {r['cycles']} cycles")
    assert r["mismatches"] == 0 and r["commands"] >= 400
    for key in ("victims", "empty_walks", "skipped", "decremented", "victim_stalls"):
        assert r[key] > 0, f"{key} never exercised: {r}"


@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_s3fifo_engine_on_both_simulators(sim):
    """The S3-FIFO engine (8 slots, 16 ids) on Verilator and Icarus: 400 random host
    commands, every walk's victims against the golden step (firmware/golden_s3fifo.py).
    Seed 2 unless KVCXL_TB_SEED says otherwise: some seeds draw a ghost of length 0 or a
    main queue never over its share, whose walks never move a slot in main."""
    from kvcxl.tb.runner import run_unit

    r = run_unit("s3fifo", sim, count=400, seed=_seed() or 2)
    print(f"{sim} s3fifo: {r['walks']} walks, {r['victims']} victims, {r['cycles']} cycles")
    assert r["mismatches"] == 0 and r["commands"] >= 400
    for key in ("victims", "empty_walks", "skipped", "decremented", "promoted", "victim_stalls"):
        assert r[key] > 0, f"{key} never exercised: {r}"


def test_s3fifo_bench_catches_a_planted_defect():
    """An id found in the ghost entering small (ghost_to_small) must fail the bench."""
    from kvcxl.tb.runner import TbFailure, run_unit

    with pytest.raises(TbFailure, match="walk"):
        run_unit("s3fifo", "icarus", count=400, seed=_seed() or 2, defect="ghost_to_small")


def test_slot_queue_bench_catches_a_planted_defect():
    """The walk ignoring the offered bit (victim_unoffered) must fail the CLOCK bench."""
    from kvcxl.tb.runner import TbFailure, run_unit

    with pytest.raises(TbFailure, match="walk"):
        run_unit("clock", "icarus", count=400, seed=_seed(), defect="victim_unoffered")
