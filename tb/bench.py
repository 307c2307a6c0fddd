"""Benchmarks of the testbench: the RTL's simulation speed on each simulator, the same test side
by side, and the Verilator trace harness (``kvcxl rtl sim``) in the same run (listed in
``kvcxl bench`` as the RTL part's figure)."""

from __future__ import annotations

from collections.abc import Callable

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
    out["verilator_harness"] = _harness_speed(quick)
    out["harness_over_cocotb_verilator"] = round(
        out["verilator_harness"]["cycles_per_s"] / out["verilator"]["cycles_per_s"], 1
    )
    return out


def _harness_speed(quick: bool) -> dict:
    """The C++-driven Verilated PolicyEngine replaying a workload (its victims checked)."""
    from kvcxl.emu.shape import PRESETS
    from kvcxl.emu.workloads import compile_workload, make_workload
    from kvcxl.rtl.verilated import EngineShape

    from .trace_sim import run_stream

    steps = 8 if quick else 32
    stream = compile_workload(make_workload("multi-turn", PRESETS["ci"], seed=0), steps)
    shape = EngineShape(1024, 4, 64)
    r = run_stream(stream, "25%", shape, check=True)["rtl"]
    return {
        "test": f"multi-turn, ci preset, {steps} steps, budget 25%, PolicyEngine "
        f"{shape.entries} entries, {shape.lanes} lanes, batch {shape.batch}, --check",
        **{k: r[k] for k in ("cycles", "model_s", "model_cpu_s", "wall_s", "build_s")},
        **{k: r[k] for k in ("cycles_per_s", "cycles_per_cpu_s")},
        **{k: r[k] for k in ("entry_updates", "entry_updates_per_s", "entry_updates_per_cpu_s")},
    }


def benches() -> dict[str, Callable[[bool], dict]]:
    return {"rtl_tb_cycles_per_s": _sim_speed}
