"""Benchmarks of the RTL (listed in ``kvcxl bench``): synthesis figures per lane count, and
each real board's bitstream.

``rtl_synth_per_lanes``: PolicyCore with 256 entries and batch 16 on the ECP5-85F
(LFE5UM-85F, out of context), placed and routed once per lane count: LUTs, FFs, block
RAMs, DSPs, Fmax and the entry updates/s that ``lanes × Fmax`` gives (the throughput is
an Analytical model from the measured Fmax; the resources and Fmax are Measured).

``rtl_board_bitstream``: the board top (engine + UART host link) built for each board of
:data:`kvcxl.rtl.board.BOARDS` (``--quick``: the iCEBreaker's only): resources, Fmax,
build time and bitstream size (Measured).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from kvcxl.common.progress import progress

from .synth import SynthConfig, run

TARGET = "ecp5-85k"
SHAPE = {"entries": 256, "batch": 16}
LANES = (1, 2, 4, 8, 16)
LANES_QUICK = (1, 2)
BOARD_FIGURES = (
    "luts",
    "ffs",
    "brams",
    "dsps",
    "fmax_mhz",
    "timing_met",
    "build_s",
    "bitstream_bytes",
)


def _synth_lanes(quick: bool) -> dict:
    lanes = LANES_QUICK if quick else LANES
    out: dict = {
        "evidence": "Measured",
        "test": f"PolicyCore {SHAPE} on {TARGET}, lanes {list(lanes)}, seed 1, target 50 MHz",
        "lanes": {},
    }
    bar, update = progress(len(lanes), "synth", "config")
    for n in lanes:
        r = run(SynthConfig(target=TARGET, lanes=n, **SHAPE))
        update(1)
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
    bar.close()
    return out


def _boards(quick: bool) -> dict:
    from .bitstream import build
    from .board import BOARDS

    out: dict = {"evidence": "Measured", "seed": 1}
    for name in ("icebreaker",) if quick else tuple(BOARDS):
        with tempfile.TemporaryDirectory() as tmp:
            r = build(name, Path(tmp), seed=1)
        out[name] = {
            "device": r["device"],
            "shape": r["shape"],
            "clock_mhz": r["clock_mhz"],
            **{k: r[k] for k in BOARD_FIGURES},
            **{f"{k}_available": r[f"{k}_available"] for k in ("luts", "brams", "dsps")},
        }
    return out


def benches() -> dict[str, Callable[[bool], dict]]:
    return {"rtl_synth_per_lanes": _synth_lanes, "rtl_board_bitstream": _boards}
