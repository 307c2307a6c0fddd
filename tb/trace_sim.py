"""Whole traces through the Verilated PolicyEngine (``kvcxl rtl sim``).

The simulator's replay (:func:`kvcxl.emu.sim.simulator.simulate`, numpy engine) drives
a :class:`~kvcxl.firmware.session.FirmwareSession` whose policy is
:class:`kvcxl.rtl.engine_policy.EnginePolicy`: every event of the trace (writes,
lazy creates, read batches, step ends) reaches the RTL as the device's host would send
it, and the victims the RTL chooses are the replay's victims.  With ``check`` the
firmware's integer mode runs beside it and the first differing pass stops the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvcxl.common.sizes import Budget
from kvcxl.emu.sim.simulator import SimOptions, simulate, victims_table
from kvcxl.emu.workloads.stream import ReadStream
from kvcxl.firmware.config import PolicyConfig
from kvcxl.rtl.engine_policy import EnginePolicy
from kvcxl.rtl.slot_policy import S3FifoSlotPolicy, SlotPolicy
from kvcxl.rtl.verilated import EngineShape, SlotEngine, VerilatedEngine
from kvcxl.rtl.verilated_records import DramShape, RecordEngine

SLOT_POLICIES = ("clock", "sieve", "s3fifo")
POLICIES = ("ema", *SLOT_POLICIES)


def run_stream(
    stream: ReadStream,
    budget: Budget,
    shape: EngineShape,
    *,
    check: bool = False,
    config: PolicyConfig | None = None,
    progress: Callable[[int], None] | None = None,
    policy: str = "ema",
    dram: DramShape | None = None,
) -> dict[str, Any]:
    """Replay ``stream`` with the RTL choosing every victim; the simulator's result plus the
    harness's figures, and ``victims`` (the columns of ``victims_table``).  ``policy``:
    ``ema`` (the PolicyEngine) or ``clock`` / ``sieve`` / ``s3fifo`` (the slot-queue engine
    with ``shape.entries`` slots, S3-FIFO's ghost over the trace's entry ids; lanes and batch
    do not apply).  ``dram``: the EMA engine with its
    records in device DRAM (RecordStreamEngine) behind that DRAM model, its table sized to
    the trace's record count (``shape.entries`` does not apply)."""
    if policy in SLOT_POLICIES:
        return _run_slots(stream, budget, shape, policy, check, config, progress)
    total = stream.n_entries * stream.shape.entry_bytes
    opts = SimOptions(
        policy="ema",
        budget_bytes=budget.resolve(total),
        config=config or PolicyConfig(),
        mode="int",
        # the firmware's placement, as `kvcxl simulate`: with managed tiers (the default)
        # the host session splits the eligible entries into layers and the RTL picks in each
        record_victims=True,
        engine="numpy",
    )
    if dram is not None:
        n = -(-stream.n_entries // shape.lanes) * shape.lanes
        shape = EngineShape(n, shape.lanes, shape.batch, shape.defect)
        engine: VerilatedEngine | RecordEngine = RecordEngine(shape, dram)
    else:
        engine = VerilatedEngine(shape)
    made: list[EnginePolicy] = []

    def factory(cfg: PolicyConfig, table) -> EnginePolicy:
        made.append(EnginePolicy(cfg, table, engine, check=check))
        return made[0]

    t0 = time.perf_counter()
    res = simulate(stream, opts, progress=progress, policy=factory)
    wall = time.perf_counter() - t0
    pol = made[0]
    victims = victims_table(stream, res.pop("_victims"))
    cycles, sim_s, cpu_s = engine.cycles, engine.seconds, engine.cpu_seconds
    upd = pol.stats["entry_updates"]
    res.pop("per_step", None)
    res.update(
        engine="verilator",
        rtl={
            "evidence": "Simulated (Verilator)",
            "design": "record_stream" if dram is not None else "policy_engine",
            "entries": shape.entries,
            "lanes": shape.lanes,
            "batch": shape.batch,
            "defect": shape.defect,
            "tables": pol.tables,
            "checked": check,
            **pol.stats,
            **_run_timing(cycles, sim_s, cpu_s, wall, engine.build_s),
            "entry_updates_per_s": round(upd / sim_s, 1) if sim_s else None,
            "entry_updates_per_cpu_s": round(upd / cpu_s, 1) if cpu_s else None,
            **(engine.figures() if isinstance(engine, RecordEngine) else {}),
        },
        victims=victims,
    )
    return res


def _run_slots(
    stream: ReadStream,
    budget: Budget,
    shape: EngineShape,
    policy: str,
    check: bool,
    config: PolicyConfig | None,
    progress: Callable[[int], None] | None,
) -> dict[str, Any]:
    """The replay with a slot-queue engine (CLOCK, SIEVE or S3-FIFO) choosing every victim."""
    total = stream.n_entries * stream.shape.entry_bytes
    opts = SimOptions(
        policy=policy,
        budget_bytes=budget.resolve(total),
        config=config or PolicyConfig(),
        record_victims=True,
        engine="numpy",
    )
    s3 = policy == "s3fifo"
    engine = SlotEngine(shape.entries, policy, shape.defect, ids=stream.n_entries if s3 else None)
    made: list[SlotPolicy] = []

    def factory(cfg: PolicyConfig, table) -> SlotPolicy:
        if s3:
            made.append(S3FifoSlotPolicy(cfg, table, engine, check=check))
        else:
            made.append(SlotPolicy(cfg, table, engine, policy, check=check))
        return made[0]

    t0 = time.perf_counter()
    res = simulate(stream, opts, progress=progress, policy=factory)
    wall = time.perf_counter() - t0
    victims = victims_table(stream, res.pop("_victims"))
    cycles, sim_s, cpu_s = engine.cycles, engine.seconds, engine.cpu_seconds
    res.pop("per_step", None)
    res.update(
        engine="verilator",
        rtl={
            "evidence": "Simulated (Verilator)",
            "design": policy,
            "slots": shape.entries,
            **({"ids": stream.n_entries} if s3 else {}),
            "defect": shape.defect,
            "checked": check,
            **made[0].stats,
            **_run_timing(cycles, sim_s, cpu_s, wall, engine.build_s),
        },
        victims=victims,
    )
    return res


def _run_timing(cycles: int, sim_s: float, cpu_s: float, wall: float, build_s: float) -> dict:
    """A Verilated run's cycles and times, and its rates per wall second in the model (the
    C++ driver's calls), per CPU second there (the machine may be shared) and per wall
    second of the whole replay (the Python session and ``--check``'s firmware included)."""
    return {
        "cycles": cycles,
        "model_s": round(sim_s, 4),
        "model_cpu_s": round(cpu_s, 4),
        "wall_s": round(wall, 3),
        "build_s": round(build_s, 2),
        "cycles_per_s": round(cycles / sim_s, 1) if sim_s else None,
        "cycles_per_cpu_s": round(cycles / cpu_s, 1) if cpu_s else None,
        "run_cycles_per_s": round(cycles / wall, 1) if wall else None,
    }
