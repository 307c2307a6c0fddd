"""Benchmarks of the testbench: the RTL's simulation speed on each simulator, the same test side
by side (listed in ``kvcxl bench`` as the RTL part's figure)."""

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
    return out


def benches() -> dict[str, Callable[[bool], dict]]:
    return {"rtl_tb_cycles_per_s": _sim_speed}
