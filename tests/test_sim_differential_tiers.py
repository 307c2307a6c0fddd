"""Differential test of the tier rules: the simulator against tests/reference_engine.py's
``TieredReplay`` (written from docs/policy.md, "Tiers below HBM", and the eviction passes).

Short workload streams, step by step (victims, reads, hits, bytes moved per tier pair), for
``eviction_passes = "batched"``, ``cxl_order = "policy"`` with a small CXL DRAM, and managed
threshold placement (with and without a background-move limit), on the EMA (float and
Q0.16) and, for the rules that apply to every policy, on LRU, FIFO and LFU.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.firmware.config import PolicyConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_engine as ref
from test_sim_differential import WL_SHAPE, _stream, compare

STATIC = {"tier_management": "static", "cxl_order": "fifo"}  # the comparison baseline
RULES = {
    "static": STATIC,
    "batched": {**STATIC, "eviction_passes": "batched", "eviction_batch": 3},
    "cxl-policy": {"tier_management": "static", "cxl_order": "policy"},
    "managed": {"tier_management": "managed", "evict_threshold": 0.05},
    "managed-slow": {"tier_management": "managed", "evict_threshold": 0.05, "background_moves": 2},
    "weighted": {"tier_management": "managed", "placement_mode": "weighted",
                 "placement_cuts": (0.5, 0.7)},
    "weighted-slow": {"tier_management": "managed", "placement_mode": "weighted",
                      "background_moves": 3, "cxl_order": "policy"},
    "all": {"tier_management": "managed", "cxl_order": "policy", "eviction_passes": "batched",
            "eviction_batch": 5, "evict_threshold": 0.05, "keep_threshold": 0.2},
}  # fmt: skip
RUNS = [(p, m) for p in ("ema", "lru", "fifo", "lfu") for m in ("float",)] + [("ema", "int")]


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("workload", ["multi-turn", "zipf-sessions"])
def test_tier_rules_match_reference(workload: str, rule: str) -> None:
    stream = _stream(workload, "dense")
    eb = WL_SHAPE.entry_bytes
    n = stream.n_entries
    k = 0
    raised: list[int] = []
    for policy, mode in RUNS:
        for gran in ("layer", "step"):
            for persistent in (True, False):
                k += 1
                cfg = {**RULES[rule], "persistent_metadata": persistent}
                config = PolicyConfig.from_mapping(cfg)
                budget = max(int(n * (0.15, 0.3)[k % 2]), 1)
                cxl = max(n // 10, 1)
                sim = simulate(
                    stream,
                    SimOptions(
                        engine="numpy", policy=policy, budget_bytes=budget * eb, config=config,
                        cxl_bytes=cxl * eb, warmup_steps=2, granularity=gran, mode=mode,
                        record_victims=True, audit=True,
                    ),
                )  # fmt: skip
                want = ref.replay_stream_tiered(
                    stream, policy=policy, budget_bytes=budget * eb, config=config,
                    cxl_entries=cxl, warmup_steps=2, granularity=gran, mode=mode,
                )  # fmt: skip
                desc = (
                    f"workload={workload} rule={rule} policy={policy} mode={mode} "
                    f"granularity={gran} budget={budget} cxl={cxl} config={cfg}"
                )
                assert sim["audit_faults"] == 0, desc
                compare(sim, stream, want, desc)
                # NVMe -> CXL DRAM (an entry spilled while its score was high, raised when
                # room frees): every step's, warm-up included, as the reference counts it.
                got = sum(d.get("nvme->cxl", 0) for d in sim["per_step"]["bytes_moved"])
                assert got == want["raised_bytes"], (
                    f"{desc}\nraised {got} != {want['raised_bytes']}"
                )
                raised.append(got)
    if rule == "managed":
        assert any(raised), "no case raised an entry: the raise rule went unchecked"


def test_the_rules_change_the_replay() -> None:
    """Each rule decides something here (else the comparison above proves little)."""
    stream = _stream("multi-turn", "dense")
    eb = WL_SHAPE.entry_bytes
    n = stream.n_entries

    def run(cfg: dict[str, Any]) -> Any:
        return ref.replay_stream_tiered(
            stream, policy="ema", budget_bytes=int(n * 0.15) * eb,
            config=PolicyConfig.from_mapping(cfg), cxl_entries=max(n // 10, 1), warmup_steps=2,
        )  # fmt: skip

    base = run(STATIC)
    for rule, cfg in RULES.items():
        if cfg is STATIC:
            continue
        r = run(cfg)
        assert (r["victims"], r["per_step"]) != (base["victims"], base["per_step"]), rule


# --- prefetch: the prefetched sets, hits and victims step by step -------------------------
def _sim_prefetch(stream: Any, opts: SimOptions) -> tuple[dict[str, Any], dict[int, list[int]]]:
    """The simulator's result and, per step, the entries it prefetched in fetch order."""
    from kvcxl.emu.sim.simulator import _Replay

    rep = _Replay(stream, opts)
    log: dict[int, list[int]] = {}
    fetch = rep.fw.prefetch

    def logged(ids: Any) -> Any:
        step = rep.fw.step if rep.fw.step is not None else rep.fw.last_step
        log.setdefault(int(step), []).extend(int(i) for i in ids)
        return fetch(ids)

    rep.fw.prefetch = logged  # type: ignore[method-assign]
    return rep.run(None), log


PF_CONFIGS = [
    {},
    {"prefetch_window": 16, "prefetch_depth": 1},
    {"prefetch_blend": (0.0, 1.0), "prefetch_window": 64},
    {"prefetch_distance_scale": 10.0, "tier_management": "managed", "evict_threshold": 0.05},
    {"persistent_metadata": False, "eviction_passes": "batched", "eviction_batch": 4},
]


@pytest.mark.parametrize("workload", ["multi-turn", "zipf-sessions", "shared-prefix"])
def test_prefetch_matches_reference(workload: str) -> None:
    stream = _stream(workload, "dense")
    eb = WL_SHAPE.entry_bytes
    n = stream.n_entries
    k = fetched = useful = 0
    for policy, mode in [("ema", "float"), ("ema", "int"), ("lru", "float")]:
        for gran in ("layer", "step"):
            for cfg in PF_CONFIGS:
                k += 1
                limit = (4, 16, 64)[k % 3]
                budget = max(int(n * (0.15, 0.3)[k % 2]), 1)
                cxl = (None, max(n // 10, 1))[k % 2]
                config = PolicyConfig.from_mapping(cfg)
                opts = SimOptions(
                    engine="numpy", policy=policy, budget_bytes=budget * eb, config=config,
                    cxl_bytes=None if cxl is None else cxl * eb, warmup_steps=2,
                    granularity=gran, mode=mode, record_victims=True, audit=True,
                    prefetch=True, prefetch_limit=limit,
                )  # fmt: skip
                sim, got = _sim_prefetch(stream, opts)
                want = ref.replay_stream_prefetch(
                    stream, policy=policy, budget_bytes=budget * eb, config=config, limit=limit,
                    cxl_entries=cxl, warmup_steps=2, granularity=gran, mode=mode,
                )  # fmt: skip
                desc = (
                    f"workload={workload} policy={policy} mode={mode} granularity={gran} "
                    f"budget={budget} cxl={cxl} limit={limit} config={cfg}"
                )
                for s in sorted(set(got) | set(want["prefetched"])):
                    g, w = got.get(s, []), want["prefetched"].get(s, [])
                    assert g == w, (
                        f"{desc}\nstep {s}: prefetched\n  simulator: {g}\n  reference: {w}"
                    )
                compare(sim, stream, want, desc)
                assert sim["prefetched_entries"] == want["prefetched_entries"], desc
                assert sim["audit_faults"] == 0, desc
                got_useful = round((sim["prefetch_precision"] or 0) * sim["prefetched_entries"])
                assert got_useful == want["prefetch_useful"], f"{desc}\nprefetches read"
                fetched += want["prefetched_entries"]
                useful += want["prefetch_useful"]
    assert fetched > 0 and useful > 0  # prefetch happened and some of it was read
