"""A step boundary's moves on the transfer timeline (docs/timeline.md, "boundary record"):
a run whose cold entries sink to NVMe at every boundary keeps the NVMe busy for exactly
their bytes over its bandwidth, on both engines, and energy counts them once."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.timing import TierTiming
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads.stream import from_trace
from kvcxl.firmware.config import PolicyConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sim_regressions import ENTRY, SHAPE


def _sinking() -> object:
    """8 steps, each reading 128 new blocks once at weight 0.001 (context s at step s: 2
    layers × 2 KV heads × 32 blocks), so each write pushes the previous step's 128 out."""
    recs = [(s, s, layer, head, b, 0.001) for s in range(8) for layer in range(2)
            for head in range(2) for b in range(32)]  # fmt: skip
    cols = list(zip(*recs, strict=True))
    return from_trace(Trace(
        step=np.array(cols[0]), context=np.array(cols[1]), layer=np.array(cols[2]),
        head=np.array(cols[3]), block=np.array(cols[4]), weight=np.array(cols[5]),
        shape=SHAPE, source="hand-written",
    ))  # fmt: skip


@pytest.mark.parametrize("engine", ["numpy", "fast"])
def test_a_sinking_run_keeps_the_nvme_busy_for_its_bytes(engine: str) -> None:
    stream = _sinking()
    t = TierTiming()
    opts = SimOptions(
        policy="ema", budget_bytes=128 * ENTRY, timeline=True, engine=engine,
        config=PolicyConfig(anchor_zone_size=0), granularity="step",
    )  # fmt: skip
    r = simulate(stream, opts)
    sunk = r["bytes_moved"]["cxl->nvme"]
    assert sunk == 896 * ENTRY  # every step's blocks but the last's (Simulated)
    assert "hbm->nvme" not in r["bytes_moved"] and "nvme->hbm" not in r["bytes_moved"]
    tl = r["timeline"]
    assert tl["bytes"]["nvme"] == sunk
    # NVMe utilisation = its bytes over its bandwidth, over the run's horizon
    assert tl["utilisation"]["nvme"] * tl["horizon_ns"] == pytest.approx(sunk / t.nvme_gbps)
    assert tl["utilisation"]["nvme"] > 0.5  # the sinks outlast the run's compute
    assert tl["queueing"]["background"]["stages"] >= 2 * 7  # two stages per boundary's sink


def test_both_engines_give_the_same_timeline() -> None:
    stream = _sinking()
    out = []
    for engine in ("numpy", "fast"):
        opts = SimOptions(
            policy="ema", budget_bytes=128 * ENTRY, cxl_bytes=256 * ENTRY, timeline=True,
            engine=engine, config=PolicyConfig(anchor_zone_size=0, placement_mode="weighted"),
        )  # fmt: skip
        r = simulate(stream, opts)
        r.pop("engine")
        out.append(r)
    assert out[0]["timeline"]["bytes"]["nvme"] > 0
    assert out[0] == out[1]
