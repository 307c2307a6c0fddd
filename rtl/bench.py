"""Benchmarks of the RTL: synthesis figures per lane count (listed in ``kvcxl bench``).

PolicyCore with 256 entries and batch 16 on the ECP5-85F (LFE5UM-85F, out of context),
placed and routed once per lane count: LUTs, FFs, block RAMs, DSPs, Fmax and the entry
updates/s that ``lanes × Fmax`` gives (the throughput is an Analytical model from the
measured Fmax; the resources and Fmax are Measured).
"""

from __future__ import annotations

from collections.abc import Callable

from tqdm import tqdm

from .synth import SynthConfig, run

TARGET = "ecp5-85k"
SHAPE = {"entries": 256, "batch": 16}
LANES = (1, 2, 4, 8, 16)
LANES_QUICK = (1, 2)


def _synth_lanes(quick: bool) -> dict:
    lanes = LANES_QUICK if quick else LANES
    out: dict = {
        "evidence": "Measured",
        "test": f"PolicyCore {SHAPE} on {TARGET}, lanes {list(lanes)}, seed 1, target 50 MHz",
        "lanes": {},
    }
    for n in tqdm(lanes, desc="synth", unit="config", leave=False):
        r = run(SynthConfig(target=TARGET, lanes=n, **SHAPE))
        out["lanes"][str(n)] = {
            key: r[key]
            for key in (
                "luts",
                "ffs",
                "brams",
                "dsps",
                "dsps_available",
                "fmax_mhz",
                "timing_met",
                "entry_updates_per_s",
                "critical_path",
                "synth_s",
                "pnr_s",
            )
        }
    return out


def benches() -> dict[str, Callable[[bool], dict]]:
    return {"rtl_synth_per_lanes": _synth_lanes}
