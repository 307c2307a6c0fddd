"""What the TierBoundary engine must answer: the firmware's step-boundary moves.

The expected plan of every boundary is :func:`firmware_plan`: the arguments
``FirmwareSession._background`` hands :func:`kvcxl.firmware.tiering.background_plan`
with threshold placement (each entry's placement value the float of its Q0.16 score,
sinks below ``evict_threshold``, rises at or above it), computed here from the same
tier array, scores, budget and rooms the engine is given.  Inputs are random
(:func:`random_boundary`) or the boundaries of a whole trace replayed by the simulator
with managed tiers (:func:`trace_boundaries`, the session's own inputs and moves).

Used by the Amaranth-simulator test (tests/test_rtl_tier_boundary.py) and by the cocotb
bench on Verilator and Icarus (tb/cocotb_tier_boundary.py).
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM, TIER_NVME
from kvcxl.firmware.tiering import NONE, background_plan

# The bench's engine: room for the traces' tables (up to 1 536 entries), 16 moves a sweep.
ENTRIES, LANES, BATCH = 2048, 4, 16
RANDOM_ENTRIES = 64  # entries of a random boundary (at most)
TRACE = {"workload": "multi-turn", "steps": 8, "budget": "10%"}  # trace-derived boundaries


def params() -> dict:
    """``kvcxl.rtl.export.build("tier_boundary", **params())``."""
    return {"entries": ENTRIES, "lanes": LANES, "batch": BATCH}


@dataclass
class Boundary:
    """One step boundary's inputs (as the session holds them) and the firmware's moves."""

    tier: NDArray  # per entry id: firmware/tiering.py's tier codes (NONE: not created)
    score: NDArray  # per entry id: Q0.16
    budget: int  # background_moves
    room: int  # free CXL DRAM entries
    nvme_room: int  # free NVMe entries
    evict_threshold: float
    down: list[int]  # the firmware's moves, in order
    up: list[int]


def firmware_plan(
    tier: NDArray, score: NDArray, budget: int, room: int, nvme_room: int, evict: float
) -> tuple[list[int], list[int]]:
    """The firmware's (downs, ups): ``FirmwareSession._background``'s call, threshold
    placement, integer mode (each placement value ``from_q16`` of the score)."""
    tier = np.asarray(tier)
    in_cxl = np.flatnonzero(tier == TIER_CXL)
    in_nvme = np.flatnonzero(tier == TIER_NVME)
    v_cxl = np.asarray(fx.from_q16(np.asarray(score)[in_cxl]), dtype=np.float64)
    v_nvme = np.asarray(fx.from_q16(np.asarray(score)[in_nvme]), dtype=np.float64)
    if budget == 0:  # the session returns before planning
        return [], []
    down, up = background_plan(
        in_cxl, v_cxl, v_cxl < evict, in_nvme, v_nvme, v_nvme >= evict, budget, room,
        nvme_room,
    )  # fmt: skip
    return [int(i) for i in down], [int(i) for i in up]


def random_boundary(
    rng: random.Random, entries: int = RANDOM_ENTRIES, batch: int = BATCH
) -> Boundary:
    """Random tiers (some ids not created), scores clustered at the threshold's bound with
    ties, budgets from 0 to three sweeps' worth, rooms from 0 to unbounded, and thresholds
    at 0, 1, the default and random."""
    from kvcxl.rtl.tier_boundary import threshold_q16

    evict = rng.choice([PolicyConfig.evict_threshold, 0.0, 1.0, rng.random() * 0.2, 0.5])
    t = threshold_q16(evict)
    n = rng.randint(1, entries)
    codes = [TIER_HBM, TIER_CXL, TIER_NVME, NONE]
    w = [rng.random() for _ in codes]
    tier = np.array(rng.choices(codes, w, k=n), dtype=np.uint8)
    pool = [0, fx.Q_MAX, max(t - 1, 0), min(t, fx.Q_MAX), min(t + 1, fx.Q_MAX)]
    pool += [rng.randrange(fx.Q_ONE) for _ in range(3)]
    score = np.array([rng.choice(pool) for _ in range(n)], dtype=np.int64)
    budget = rng.choice([0, 1, batch, rng.randint(0, 3 * batch)])
    room = rng.choice([0, 1, rng.randint(0, batch), 1 << 62])
    nvme_room = rng.choice([0, 1, rng.randint(0, 2 * batch), 1 << 62])
    down, up = firmware_plan(tier, score, budget, room, nvme_room, evict)
    return Boundary(tier, score, budget, room, nvme_room, evict, down, up)


@contextmanager
def recording(found: list[Boundary]):
    """Record into ``found`` every step boundary a firmware session plans while the block
    runs (its inputs as the session holds them, and its moves): the boundaries of a replay,
    the simulator's or ``kvcxl rtl sim``'s, for the engine to plan again."""
    from kvcxl.firmware.session import FirmwareSession

    plan = FirmwareSession._background

    def tapped(self, tick):  # type: ignore[no-untyped-def]
        cfg, lower = self.config, self.lower
        n = self.table.n
        tier = lower.tier[:n].copy() if lower.tier.size >= n else lower.tier.copy()
        ids = np.arange(tier.size, dtype=np.int64)
        score = np.asarray(self.policy.score_q16(ids), dtype=np.int64)
        room, nvme_room = lower.room(), lower.nvme_room()
        before = len(self._moves)
        plan(self, tick)
        moves = self._moves[before:]
        down = [int(i) for ids_, src, _ in moves if src == TIER_CXL for i in ids_]
        up = [int(i) for ids_, src, _ in moves if src == TIER_NVME for i in ids_]
        found.append(
            Boundary(tier, score, cfg.background_moves, room, nvme_room, cfg.evict_threshold,
                     down, up)
        )  # fmt: skip

    FirmwareSession._background = tapped  # type: ignore[method-assign]
    try:
        yield
    finally:
        FirmwareSession._background = plan  # type: ignore[method-assign]


def trace_boundaries(
    workload: str = TRACE["workload"],
    steps: int = TRACE["steps"],
    budget: str = TRACE["budget"],
    *,
    cxl_share: float = 0.2,
    nvme_share: float = 0.6,
    config: PolicyConfig | None = None,
) -> list[Boundary]:
    """Every step boundary of ``workload`` replayed by the simulator (numpy engine, integer
    EMA, managed tiers, threshold placement) with CXL DRAM and NVMe holding
    ``cxl_share`` and ``nvme_share`` of the workload's entries (so that both rooms bind):
    the session's inputs and the moves it decided."""
    from kvcxl.common.sizes import BYTES, as_budget
    from kvcxl.emu.shape import PRESETS
    from kvcxl.emu.sim.simulator import SimOptions, simulate
    from kvcxl.emu.workloads import compile_workload, make_workload

    stream = compile_workload(make_workload(workload, PRESETS["ci"], seed=0), steps, read="topk:4")
    eb = stream.shape.entry_bytes
    total = stream.n_entries * eb
    cfg = (config or PolicyConfig()).with_(tier_management="managed", placement_mode="thresholds")
    hbm = as_budget(budget, BYTES).resolve(total)
    n = stream.n_entries
    cxl = max(int(n * cxl_share), 1)
    nvme = max(n - hbm // eb - cxl, int(n * nvme_share))
    opts = SimOptions(policy="ema", budget_bytes=hbm, config=cfg, mode="int", engine="numpy",
                      cxl_bytes=cxl * eb, nvme_bytes=nvme * eb)  # fmt: skip
    found: list[Boundary] = []
    with recording(found):
        simulate(stream, opts)
    return found


def run_boundaries(
    found: list[Boundary],
    sim: str = "verilator",
    *,
    seed: int = 1,
    lanes: int = LANES,
    batch: int = BATCH,
) -> dict:
    """The cocotb bench on recorded boundaries only (an engine sized for the largest table):
    every sweep and every boundary's moves against the firmware's."""
    import pickle

    from kvcxl.rtl import designs, toolchain
    from kvcxl.rtl.export import build, to_verilog, write_if_changed
    from kvcxl.tb import runner

    toolchain.apply_env()
    d = designs.get("tier_boundary")
    n = max((b.tier.size for b in found), default=1)
    entries = max(-(-n // lanes) * lanes, lanes)
    shape = {"entries": entries, "lanes": lanes, "batch": batch}
    bdir = runner.build_root() / f"{sim}-tier_boundary-{entries}x{lanes}-b{batch}"
    src = bdir / f"{d.module}.v"
    text = to_verilog(build("tier_boundary", **shape), d.module)
    write_if_changed(src, runner.icarus_start(text) if sim == "icarus" else text)
    path = bdir / "boundaries.pkl"
    path.write_bytes(pickle.dumps(found))
    cfg = {**shape, "plans": 0, "boundaries": str(path), "seed": seed,
           "design": "tier_boundary", "results": str(bdir / f"results-{seed}.json")}  # fmt: skip
    res, *_ = runner._cocotb(sim, src, d.module, bdir, f"kvcxl.tb.{d.bench}", cfg, seed)
    return res
