"""Every parameter `kvcxl policy params` lists decides something (issue 24).

One table: for each parameter, two values within its range, the context that makes it
matter (policy, tier rules, prefetch) and, where docs/policy.md states which way it
pushes, the measured quantity and the sign of its change.  Each row replays the same
small workload twice (numpy engine, audit on) and requires some decision — a victim, a
tier, a lower-tier move, a prefetch, a pass — to differ; a direction row also requires
the stated direction.  ``PARAMS`` and ``POLICY_PARAMS`` must be covered exactly, so a
new parameter without a row fails here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, _Replay
from kvcxl.emu.timeline.resources import offload_preset
from kvcxl.emu.timing import TierTiming
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware.config import PARAMS, PolicyConfig
from kvcxl.firmware.formulas import TIER_CXL, TIER_NVME
from kvcxl.firmware.policy_params import POLICY_PARAMS

SHAPE = PRESETS["ci"].with_(context_tokens=256)
MANAGED = {"tier_management": "managed"}
WEIGHTED = {"tier_management": "managed", "placement_mode": "weighted"}
# Every listed parameter has a row: aggregation combines the synthetic query heads as the
# stream is compiled (the sweep passes it to compile_workload), and pcie_contention sets the
# host-offload timing (--timing offload), which moves step times, not decisions.
NOT_A_REPLAY_DECISION: set[str] = set()


@dataclass(frozen=True)
class Row:
    name: str
    a: Any
    b: Any
    base: dict = field(default_factory=dict)
    policy: str = "ema"
    mode: str = "float"
    prefetch: bool = False
    prefetch_limit: int = 64
    cxl: float | None = None  # CXL DRAM as a fraction of the KV (None: room for all)
    workload: tuple[str, int] = ("multi-turn", 256)  # (name, context tokens), 12 steps
    # (metric, +1 or −1): going from a to b moves the metric this way (docs/policy.md).
    pushes: tuple[str, int] | None = None
    offload: bool = False  # CXL DRAM timed as host offload at the row's pcie_contention


ROWS = [
    Row("alpha", 0.2, 0.9),
    # The stream's weights are combined over each GQA group by it (compile_workload).
    Row("aggregation", "max", "mean"),
    # Timing only: the offload baseline's link share; a larger share serves misses sooner.
    Row("pcie_contention", 0.32, 0.87, offload=True, pushes=("stall_ns", -1)),
    # Dense reads touch nearly every entry read at the default touch threshold, so idle
    # counts differ only between whole contexts and β cannot reorder them: a higher
    # threshold lets entries of one context age apart.
    Row("beta", 0.001, 0.5, {"touch_threshold": 0.2}),
    Row("touch_threshold", 0.0, 0.5),
    Row("anchor_zone_size", 0, 100, pushes=("pinned", +1)),
    Row("keep_threshold", 0.1, 0.5, MANAGED, pushes=("protected", -1)),
    Row("evict_threshold", 0.02, 0.09, pushes=("misses_nvme", +1)),
    Row("placement_mode", "thresholds", "weighted", MANAGED),
    Row("placement_weights", (0.25, 0.55, 0.2), (0.7, 0.1, 0.2), WEIGHTED),
    Row("placement_cuts", (0.3, 0.6), (0.5, 0.9), WEIGHTED, pushes=("evictions", +1)),
    Row(
        "prefetch_window",
        16,
        128,
        prefetch=True,
        prefetch_limit=1024,
        workload=("cyclic", 1024),
        pushes=("prefetched_entries", +1),
    ),
    Row("prefetch_distance_scale", 1.0, 1000.0, prefetch=True, prefetch_limit=2),
    Row("prefetch_blend", (0.6, 0.4), (0.0, 1.0), prefetch=True, prefetch_limit=2),
    Row("prefetch_depth", 1, 2, prefetch=True, pushes=("prefetched_entries", +1)),
    Row("eviction_batch", 4, 64, {"eviction_passes": "batched"}, pushes=("evictions", +1)),
    Row("persistent_metadata", True, False),
    Row("pinned_fraction", 0.0, 0.25, pushes=("pinned", +1)),
    Row("decay_shift", 0, 8, mode="int", workload=("multi-turn", 1024)),
    Row("eviction_passes", "exact", "batched", pushes=("evictions", +1)),
    Row("cxl_order", "fifo", "policy", cxl=0.05),
    Row("tier_management", "static", "managed"),
    Row(
        "background_moves",
        1,
        4096,
        {**MANAGED, "evict_threshold": 0.09},
        pushes=("cxl_to_nvme", +1),
    ),
    Row("sink_tokens", 4, 64, policy="sink-window"),
    Row("recent_tokens", 16, 128, policy="h2o"),
    Row("lrfu_lambda", 0.1, 0.9, policy="lrfu"),
    Row("lfu_tie_break", "lru", "index", policy="lfu"),
    Row("seed", 0, 1, policy="random"),
    Row("ema_floor", 0.0, 0.05, policy="ema-floor"),
    # The EMA's own rules: every tie-break value moves a victim (touched entries tie at 0).
    Row("ema_tie_break", "id", "last-touch"),
    Row("ema_tie_break", "last-touch", "score"),
    Row("ema_tie_break", "score", "age"),
    Row("ema_touch_resets_idle", True, False),
    # Queue policies: dense multi-turn reads re-read every entry of a context together, so
    # counters and queue shares matter only where reads are sparse (uniform).
    Row("clock_bits", 1, 3, policy="clock", workload=("uniform", 256)),
    Row("s3fifo_small_ratio", 0.05, 0.9, policy="s3fifo", workload=("uniform", 1024)),
    Row("s3fifo_ghost_ratio", 0.0, 0.9, policy="s3fifo"),
    Row("s3fifo_move_threshold", 1, 4, policy="s3fifo", workload=("uniform", 256)),
    Row("slru_segments", 1, 4, policy="slru"),
    # W-TinyLFU: its admission decisions differ once the sketch's counts do (sparse reads).
    Row("wtinylfu_window", 0.01, 0.3, policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_main", "slru", "fifo", policy="wtinylfu", workload=("uniform", 256)),
    # ... and each queue policy as the main (each its own class behind the filter)
    Row("wtinylfu_main", "fifo", "clock", policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_main", "clock", "sieve", policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_main", "sieve", "s3fifo", policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_main", "s3fifo", "arc", policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_probation", 0.2, 0.8, policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_sketch_width", 0.05, 14.0, policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_sketch_hashes", 1, 10, policy="wtinylfu", workload=("uniform", 256)),
    Row("wtinylfu_sample", 1, 32, policy="wtinylfu", workload=("uniform", 1024)),
]


_STREAMS: dict[tuple[str, int, str], Any] = {}


def _stream(workload: tuple[str, int] = ("multi-turn", 256), aggregation: str = "max") -> Any:
    key = (*workload, aggregation)
    if key not in _STREAMS:
        name, tokens = workload
        shape = SHAPE.with_(context_tokens=tokens)
        _STREAMS[key] = compile_workload(
            make_workload(name, shape, seed=1), 12, aggregation=aggregation
        )
    return _STREAMS[key]


def _run(row: Row, value: Any) -> tuple[dict, dict[str, float]]:
    """One replay: its decisions (to compare) and its metrics (for the direction)."""
    cfg = PolicyConfig.from_mapping({**row.base, row.name: value})
    stream = _stream(row.workload, cfg.aggregation)
    kv = stream.kv_bytes
    timing = TierTiming()
    if row.offload:
        p = offload_preset(cfg.pcie_contention)
        timing = TierTiming(cxl_latency_ns=p.cxl_latency_ns, cxl_gbps=p.cxl_gbps)
    opts = SimOptions(
        policy=row.policy, mode=row.mode, budget_bytes=kv // 4, config=cfg, engine="numpy",
        audit=True, record_victims=True, prefetch=row.prefetch, prefetch_limit=row.prefetch_limit,
        cxl_bytes=None if row.cxl is None else int(kv * row.cxl), granularity="layer",
        timing=timing,
    )  # fmt: skip
    rep = _Replay(stream, opts)
    res = rep.run(None)
    assert res["audit_faults"] == 0, (row.name, value)
    fw = rep.fw
    victims = [(int(s), d.tolist()) for d, _, s in res["_victims"]]
    decisions = {
        "victims": victims,
        "tiers": rep.tiers.tier[: fw.table.n].tolist(),
        "moved": rep.tiers.moved.tolist(),
        "prefetched": res["prefetched_entries"],
        "passes": res["cache"]["eviction_passes"],
    }
    if row.offload:  # (time, not a decision: what pcie_contention moves)
        decisions["stall_ns"] = res["stall_ns_per_step_mean"]
    resident = np.flatnonzero(fw.resident())
    protected = 0
    if fw.policy.scored:
        protected = int(np.count_nonzero(fw.policy.score(resident) >= cfg.keep_threshold))
    metrics = {
        "pinned": res["cache"]["pinned"],
        "misses_nvme": res["misses_nvme"],
        "prefetched_entries": res["prefetched_entries"],
        "evictions": res["cache"]["evictions"],
        "protected": protected,
        "cxl_to_nvme": int(rep.tiers.moved[TIER_CXL, TIER_NVME]),
        "stall_ns": res["stall_ns_per_step_mean"],
    }
    return decisions, metrics


def test_the_table_covers_every_listed_parameter() -> None:
    listed = set(PARAMS) | set(POLICY_PARAMS)
    rows = {r.name for r in ROWS}
    assert rows | NOT_A_REPLAY_DECISION == listed, sorted(listed ^ (rows | NOT_A_REPLAY_DECISION))
    assert not rows & NOT_A_REPLAY_DECISION


_NAMES = [r.name for r in ROWS]


@pytest.mark.parametrize(
    "row", ROWS, ids=[r.name if _NAMES.count(r.name) == 1 else f"{r.name}={r.b}" for r in ROWS]
)
def test_moving_the_parameter_changes_a_decision(row: Row) -> None:
    da, ma = _run(row, row.a)
    db, mb = _run(row, row.b)
    assert da != db, f"{row.name}: {row.a!r} and {row.b!r} decide the same everywhere"
    if row.pushes is not None:
        metric, sign = row.pushes
        assert np.sign(mb[metric] - ma[metric]) == sign, (
            f"{row.name} {row.a!r} → {row.b!r}: {metric} went {ma[metric]} → {mb[metric]}, "
            f"docs/policy.md says {'up' if sign > 0 else 'down'}"
        )


def test_managed_tiers_keep_every_entry_in_one_tier_with_cxl_full() -> None:
    """Managed tiers, policy-ordered CXL DRAM at 5 % of the KV, batched passes: the per-event
    tier checks hold and CXL DRAM never holds more than its capacity."""
    stream = _stream()
    cfg = PolicyConfig(
        tier_management="managed", cxl_order="policy", eviction_passes="batched",
        eviction_batch=8,
    )  # fmt: skip
    opts = SimOptions(
        budget_bytes=stream.kv_bytes // 4, cxl_bytes=stream.kv_bytes // 20, config=cfg,
        engine="numpy", audit=True, check=True,
    )  # fmt: skip
    rep = _Replay(stream, opts)
    res = rep.run(None)
    assert res["audit_faults"] == 0
    lower = rep.fw.lower.tier[: rep.fw.table.n]
    t = rep.tiers.tier[: rep.fw.table.n]
    for code in (TIER_CXL, TIER_NVME):  # the firmware's map is the media's
        assert np.array_equal(lower == code, t == code)


@pytest.mark.parametrize(
    ("passes", "batch", "left", "n_passes"),
    [("exact", 4, 10, 3), ("batched", 4, 9, 1), ("batched", 2, 9, 2), ("batched", 8, 5, 1)],
)
def test_batched_passes_evict_whole_batches_ranked_as_each_begins(
    passes: str, batch: int, left: int, n_passes: int
) -> None:
    """13 entries written one at a time into 10 slots (LRU: 0 is the oldest).  Exact evicts
    the one-entry overflow at each of writes 11–13 (3 passes, 10 left); batched evicts a
    whole batch, the oldest first, when the overflow comes, and the room it leaves takes
    the next writes without a new ranking; the audit checks every pass."""
    from kvcxl.firmware.session import FirmwareSession

    cfg = PolicyConfig(eviction_passes=passes, eviction_batch=batch)
    fw = FirmwareSession("lru", 10, cfg, audit=True)
    ids = fw.describe(np.zeros(13), np.zeros(13), np.zeros(13), np.arange(13))
    for i in ids.tolist():  # one read batch each: entry i last read at time i
        fw.write(0, np.array([i]))
        fw.read(0, np.array([i]), np.array([1.0]))
    resident = np.flatnonzero(fw.resident())
    assert resident.size == left
    assert resident.tolist() == list(range(13 - left, 13))
    assert fw.audit is not None and fw.audit.faults == 0
    assert fw.cache.stats.eviction_passes == n_passes


def test_the_device_carries_out_managed_tiers_moves() -> None:
    """A device with a host KV cache (open_kv) and managed tiers: every entry's page is in
    the tier the firmware session's map names, step-boundary sinks included."""
    from kvcxl.cxl.hdm import GRANULE
    from kvcxl.emu.device.device import Type3Device

    n, eb = 48, 4096
    cfg = PolicyConfig(tier_management="managed", evict_threshold=0.09, background_moves=4)
    dev = Type3Device(GRANULE, page_bytes=eb)
    dev.open_kv(n, eb, 12, 16, 0, config=cfg)
    dev.fw.describe(np.zeros(n), np.zeros(n), np.arange(n) % 2, np.arange(n) // 2)
    rng = np.random.default_rng(1)
    sank = 0
    for step in range(12):
        if step == 0:
            dev.create(0, np.arange(n))
        ids = rng.choice(n, 16, replace=False)
        dev.report(step, ids, rng.random(16) * 0.3)
        dev.end_step(step)
        lower = dev.fw.lower.where(np.arange(n))
        in_dram = np.frombuffer(dev.in_dram, np.uint8)[:n]
        resident = dev.fw.resident()
        nvme = lower == TIER_NVME
        sank = max(sank, int(np.count_nonzero(nvme)))
        assert np.array_equal(in_dram[~resident] == 0, nvme[~resident]), step
    assert sank > 0  # the step boundary sank some entries, and the pages followed
