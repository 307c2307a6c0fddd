"""Benchmarks of the testbench (listed in ``kvcxl bench``).

``rtl_tb_cycles_per_s``: the RTL's simulation speed through cocotb on each simulator, the same
test side by side (Verilator, Icarus).

``rtl_sim``: the C++-driven Verilator harness of ``kvcxl rtl sim`` on whole ``--check``
replays (the 1,024-entry 4-lane EMA engine; the CLOCK and SIEVE slot-queue engines), beside
Verilator's own rate on each design (a tight C++ loop clocking it, no harness work: the
limit) and the cocotb + Verilator test of ``rtl_tb_cycles_per_s``, in one run: cycles/s and
the harness's ratio to cocotb.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvcxl.firmware import fixedpoint as fx

from .runner import run_core

SHAPE = {"entries": 16, "lanes": 4, "batch": 4}


def _sim_speed(quick: bool) -> dict:
    steps = 200 if quick else 2000
    out: dict = {"evidence": "Measured", "test": f"PolicyCore {SHAPE}, {steps} steps, seed 1"}
    for sim in ("verilator", "icarus"):
        r = run_core(sim, steps=steps, seed=1, **SHAPE)
        out[sim] = {
            "cycles": r["bus_cycles"],
            "wall_s": r["wall_s"],
            "cycles_per_s": r["cycles_per_s"],
            "entry_updates_per_s": round(r["entry_updates_checked"] / r["wall_s"], 1),
            "build_s": r["build_s"],
        }
    out["verilator_over_icarus"] = round(
        out["verilator"]["cycles_per_s"] / out["icarus"]["cycles_per_s"], 2
    )
    return out


def _load() -> list[float]:
    import os

    return [round(x, 2) for x in os.getloadavg()]


def _rtl_sim(quick: bool) -> dict:
    """The trace harness on each engine (``--check``), its design's free-running rate, and
    cocotb + Verilator on the PolicyCore test, in one run."""
    from kvcxl.common.sizes import BYTES, Budget
    from kvcxl.emu.shape import PRESETS
    from kvcxl.emu.workloads import compile_workload, make_workload
    from kvcxl.rtl.verilated import EngineShape, SlotEngine, VerilatedEngine

    from .trace_sim import run_stream

    steps = 8 if quick else 32
    free = 200_000 if quick else 2_000_000
    stream = compile_workload(make_workload("multi-turn", PRESETS["ci"], seed=0), steps)
    what = f"multi-turn, ci preset, {steps} steps, budget 25%, --check"
    out: dict = {"evidence": "Measured", "load_average_before": _load(), "engines": {}}
    for policy in ("ema", "clock", "sieve"):
        shape = EngineShape(1024, 4 if policy == "ema" else 1, 64)
        r = run_stream(stream, Budget.parse("25%", BYTES), shape, check=True, policy=policy)["rtl"]
        if policy == "ema":
            eng = VerilatedEngine(shape)
            eng.reset(0, 0, 0, np.zeros(fx.DECAY_TABLE_SIZE, np.uint32))
            rng, n = np.random.default_rng(0), shape.entries  # every entry eligible
            eng.write_records(
                np.arange(shape.groups), rng.integers(0, 1 << 16, n), rng.integers(0, 256, n),
                np.zeros(n, np.uint8), np.ones(n, np.uint8),
            )  # fmt: skip
            limit = eng.free_run(free, shape.batch)
            design = f"PolicyEngine {shape.entries} entries, {shape.lanes} lanes, batch 64"
        else:
            limit = SlotEngine(shape.entries, policy).free_run(free)
            design = f"{policy} slot-queue engine, {shape.entries} slots"
        out["engines"][policy] = {
            "test": f"{what}; {design}",
            **{k: r[k] for k in ("cycles", "model_s", "model_cpu_s", "wall_s", "build_s")},
            **{k: r[k] for k in ("cycles_per_s", "cycles_per_cpu_s", "run_cycles_per_s")},
            "verilator_free_run": limit,
            "of_free_run_per_cpu_s": round(r["cycles_per_cpu_s"] / limit["cycles_per_cpu_s"], 3),
        }
    cocotb_steps = 200 if quick else 2000
    c = run_core("verilator", steps=cocotb_steps, seed=1, **SHAPE)
    out["cocotb_verilator"] = {
        "test": f"PolicyCore {SHAPE}, {cocotb_steps} steps, seed 1",
        "cycles": c["bus_cycles"],
        "wall_s": c["wall_s"],
        "cycles_per_s": c["cycles_per_s"],
        "build_s": c["build_s"],
    }
    for policy, e in out["engines"].items():
        out[f"{policy}_harness_over_cocotb"] = round(
            e["cycles_per_s"] / out["cocotb_verilator"]["cycles_per_s"], 1
        )
    out["load_average_after"] = _load()
    return out


def benches() -> dict[str, Callable[[bool], dict]]:
    return {"rtl_tb_cycles_per_s": _sim_speed, "rtl_sim": _rtl_sim}
