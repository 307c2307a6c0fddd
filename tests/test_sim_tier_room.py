"""Room below HBM (docs/policy.md): a workload that fits in HBM + CXL DRAM + NVMe runs in
every placement mode, identically on both engines, and one that does not is refused up
front with each tier's size.

Shape: 2 layers, 2 KV heads, 16-token blocks, one entry = 4,096 bytes.  Records are
``(step, context, layer, head, block, weight)``; the anchor zone is off so that every
entry can leave HBM.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any

import numpy as np
import pytest

from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.emu.workloads.stream import from_trace
from kvcxl.firmware.config import PolicyConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sim_fast import SHAPE as CI_SHAPE
from test_sim_fast import assert_same
from test_sim_regressions import ENTRY, SHAPE

# Every placement mode (and the pass rule that over-evicts), each with the anchor zone off.
MODES: dict[str, dict[str, Any]] = {
    "managed-thresholds": {},
    "managed-weighted": {"placement_mode": "weighted"},
    "static-thresholds": {"tier_management": "static"},
    "static-fifo": {"tier_management": "static", "cxl_order": "fifo"},
    "static-weighted": {"tier_management": "static", "placement_mode": "weighted"},
    "batched-1": {"eviction_passes": "batched", "eviction_batch": 1},
}


def _stream(records: list[tuple[int, int, int, int, int, float]]) -> Any:
    cols = list(zip(*records, strict=True))
    return from_trace(
        Trace(
            step=np.array(cols[0]), context=np.array(cols[1]), layer=np.array(cols[2]),
            head=np.array(cols[3]), block=np.array(cols[4]), weight=np.array(cols[5]),
            shape=SHAPE, source="hand-written",
        )
    )  # fmt: skip


# Four entries written one a step, every score below evict_threshold, then the first read
# again (from wherever it went).
COLD = [(s, 0, 0, 0, s, 0.001) for s in range(4)] + [(4, 0, 0, 0, 0, 0.001)]


def _run(stream: Any, engine: str, hbm: int, cxl: int, nvme: int, cfg: dict, **kw: Any) -> dict:
    config = PolicyConfig.from_mapping({"anchor_zone_size": 0, **cfg})
    opts = SimOptions(
        policy=kw.pop("policy", "ema"), budget_bytes=hbm * ENTRY, cxl_bytes=cxl * ENTRY,
        nvme_bytes=nvme * ENTRY, config=config, engine=engine, record_victims=True, **kw,
    )  # fmt: skip
    r = simulate(stream, opts)
    assert r.pop("engine") == engine
    return r


def _splits(total: int) -> list[tuple[int, int, int]]:
    """Every (HBM, CXL DRAM, NVMe) with HBM ≥ 1 that holds exactly ``total`` entries."""
    return [(h, c, total - h - c) for h in range(1, total + 1) for c in range(total - h + 1)]


@pytest.mark.parametrize("mode", list(MODES))
def test_an_exact_fit_runs_identically_on_both_engines(mode: str) -> None:
    stream = _stream(COLD)
    for hbm, cxl, nvme in _splits(4):
        if MODES[mode].get("eviction_passes") == "batched" and hbm < 1:
            continue
        desc = f"{mode} HBM {hbm} CXL {cxl} NVMe {nvme}"
        # check=True: the tier invariants (no tier over capacity) after every event
        a = _run(stream, "numpy", hbm, cxl, nvme, MODES[mode], check=True)
        b = _run(stream, "fast", hbm, cxl, nvme, MODES[mode])
        assert a["reads"] == 5, desc
        assert_same(a, b, desc)


@pytest.mark.parametrize("mode", list(MODES))
def test_exact_fits_of_a_workload_run_identically(mode: str) -> None:
    """A generated workload at an exact fit (HBM 20 %, CXL DRAM and NVMe splitting the rest),
    every granularity: equal results, victims in order, on both engines."""
    stream = compile_workload(make_workload("multi-turn", CI_SHAPE, seed=2), 8, read="topk:2")
    n, eb = stream.n_entries, stream.shape.entry_bytes
    hbm = n // 5
    for cxl in (0, (n - hbm) // 3, n - hbm):
        for gran in ("layer", "step"):
            cfg = PolicyConfig.from_mapping({"anchor_zone_size": 0, **MODES[mode]})
            out = []
            for engine in ("numpy", "fast"):
                opts = SimOptions(
                    policy="ema", budget_bytes=hbm * eb, cxl_bytes=cxl * eb,
                    nvme_bytes=(n - hbm - cxl) * eb, config=cfg, engine=engine,
                    granularity=gran, record_victims=True, check=engine == "numpy",
                )  # fmt: skip
                r = simulate(stream, opts)
                assert r.pop("engine") == engine
                out.append(r)
            desc = f"{mode} {gran} cxl {cxl} of {n - hbm}"
            assert (
                out[0]["bytes_moved"].get("cxl->nvme", 0)
                + out[0]["bytes_moved"].get("hbm->nvme", 0)
                > 0
                or cxl == n - hbm
            ), f"{desc}: nothing reached NVMe (no edge exercised)"
            assert_same(out[0], out[1], desc)


def test_static_thresholds_give_nvme_room_to_the_lowest_scores() -> None:
    """HBM 2, CXL DRAM 2, NVMe 1: step 1's write evicts entries 0 (score 0.01) and 1
    (0.002), both below evict_threshold; NVMe has room for one, the lower score (entry 1):
    step 2's read of entry 1 misses in NVMe (of entry 0: in CXL DRAM)."""
    head = [(0, 0, 0, 0, 0, 0.05), (0, 0, 0, 0, 1, 0.01), (1, 0, 0, 0, 2, 0.5),
            (1, 0, 0, 0, 3, 0.5)]  # fmt: skip
    cfg = {"tier_management": "static"}
    for engine in ("numpy", "fast"):
        for read, nvme, cxl in ((1, 1, 0), (0, 0, 1)):
            r = _run(_stream([*head, (2, 0, 0, 0, read, 0.5)]), engine, 2, 2, 1, cfg,
                     granularity="step")  # fmt: skip
            assert r["bytes_moved"]["hbm->nvme"] == ENTRY, engine
            assert (r["misses_nvme"], r["misses_cxl"]) == (nvme, cxl), (engine, read)
            assert sorted(r["_victims"][0][0].tolist()) == [0, 1], engine
    # with room for both, both go to NVMe
    r = _run(_stream([*head, (2, 0, 0, 0, 0, 0.5)]), "numpy", 2, 2, 2, cfg, granularity="step")
    assert r["bytes_moved"]["hbm->nvme"] == 2 * ENTRY


def test_managed_sinks_wait_for_nvme_room() -> None:
    """HBM 1, CXL DRAM 2, NVMe 2, four cold entries: the boundary sinks only into NVMe's
    free room; the rest wait in CXL DRAM."""
    stream = _stream(COLD)
    for engine in ("numpy", "fast"):
        r = _run(stream, engine, 1, 2, 2, {})
        assert r["bytes_moved"]["cxl->nvme"] <= 3 * ENTRY, engine
        assert r["occupancy_end"]["nvme"] <= 2, engine


def test_weighted_boundary_demotions_wait_for_room_below() -> None:
    """HBM 2, CXL DRAM 1, NVMe 1 (an exact fit): the weighted boundary, which demotes every
    HBM entry whose P is below the low cut, moves only as many as CXL DRAM and NVMe have
    room for; the rest stay in HBM."""
    stream = _stream(COLD)
    for engine in ("numpy", "fast"):
        r = _run(stream, engine, 2, 1, 1, {"placement_mode": "weighted"})
        occ = r["occupancy_end"]
        assert occ["cxl"] <= 1 and occ["nvme"] <= 1 and occ["hbm"] >= 2, (engine, occ)


@pytest.mark.parametrize(("hbm", "cxl", "nvme"), [(1, 1, 1), (0, 2, 1), (2, 0, 1), (1, 2, 0)])
@pytest.mark.parametrize("engine", ["numpy", "fast"])
def test_a_workload_that_does_not_fit_is_refused_with_each_tier(hbm, cxl, nvme, engine) -> None:
    with pytest.raises(ValueError) as e:
        _run(_stream(COLD), engine, hbm, cxl, nvme, {})
    msg = str(e.value)
    assert "does not fit" in msg
    assert f"creates 4 entries ({4 * ENTRY} B)" in msg
    assert f"HBM holds {hbm} entries ({hbm * ENTRY} B)" in msg
    assert f"CXL DRAM {cxl} entries ({cxl * ENTRY} B)" in msg
    assert f"NVMe {nvme} entries ({nvme * ENTRY} B)" in msg


def test_batched_passes_need_room_for_their_over_eviction() -> None:
    """A batched pass may evict eviction_batch − 1 entries past the overflow: an exact fit
    is refused with eviction_batch 3, and runs with two entries to spare."""
    stream = _stream(COLD)
    cfg = {"eviction_passes": "batched", "eviction_batch": 3}
    with pytest.raises(ValueError, match="batched pass may evict past the overflow"):
        _run(stream, "numpy", 2, 1, 1, cfg)
    a = _run(stream, "numpy", 2, 1, 3, cfg, check=True)
    b = _run(stream, "fast", 2, 1, 3, cfg)
    assert_same(a, b, "batched with room")


def test_every_split_of_a_tight_fit_keeps_every_tier_within_capacity() -> None:
    """Five entries over HBM, CXL DRAM and NVMe in every way that fits exactly, several
    scores: every mode runs, the numpy engine checks the invariants after every event."""
    recs = [(s, 0, s % 2, 0, s, w) for s, w in enumerate((0.3, 0.001, 0.05, 0.001, 0.2))]
    recs += [(5, 0, 0, 0, 0, 0.4), (6, 0, 1, 0, 1, 0.001)]
    stream = _stream(recs)
    for mode, (hbm, cxl, nvme) in itertools.product(MODES, _splits(5)):
        a = _run(stream, "numpy", hbm, cxl, nvme, MODES[mode], check=True)
        b = _run(stream, "fast", hbm, cxl, nvme, MODES[mode])
        assert_same(a, b, f"{mode} {hbm}/{cxl}/{nvme}")


# --- the edges docs/simulator.md states ("Edges of the tier rules"), on both engines ------
@pytest.mark.parametrize("engine", ["numpy", "fast"])
def test_a_writes_own_entries_go_after_a_held_back_entry(engine: str) -> None:
    """HBM 2: entry 0 read at weight 1.0 scores 0.2 ≥ keep_threshold (held back); step 1
    writes entries 1 and 2 (first read): the others — entry 0 alone — cover the overflow,
    so entry 0 leaves, held back or not."""
    recs = [(0, 0, 0, 0, 0, 1.0), (1, 0, 0, 0, 1, 0.5), (1, 0, 0, 0, 2, 0.5)]
    r = _run(_stream(recs), engine, 2, 4, 4, {}, granularity="step")
    assert [v[0].tolist() for v in r["_victims"]] == [[0]]


@pytest.mark.parametrize("engine", ["numpy", "fast"])
@pytest.mark.parametrize("warmup", [0, 2])
def test_the_last_boundary_runs_and_a_boundary_counts_with_the_next_step(engine, warmup) -> None:
    """HBM 1: step 1 pushes entry 0 out, the boundary closing step 1 sinks it (booked to
    step 2, measured after a 2-step warm-up), step 2 pushes entry 1 out and the boundary
    after the last event sinks it."""
    recs = [(s, 0, 0, 0, s, 0.001) for s in range(3)]
    r = _run(_stream(recs), engine, 1, 4, 4, {}, warmup_steps=warmup)
    assert r["bytes_moved"].get("cxl->nvme", 0) == 2 * ENTRY
    assert r["occupancy_end"]["nvme"] == 2


@pytest.mark.parametrize("engine", ["numpy", "fast"])
@pytest.mark.parametrize(("persistent", "order", "to_nvme"), [
    (False, "policy", 0), (True, "policy", 1), (False, "fifo", 1),
])  # fmt: skip
def test_restarted_lru_entries_leave_cxl_dram_by_id(engine, persistent, order, to_nvme) -> None:
    """LRU, HBM 2, CXL DRAM 1: entry 1 leaves HBM before entry 0; CXL DRAM then overflows.
    Without persistent metadata both lost their last use (−1) and the lower id goes down;
    with it, or in arrival order, entry 1 does."""
    recs = [(0, 0, 0, 0, 0, 0.5), (0, 0, 0, 0, 1, 0.5), (1, 0, 0, 0, 0, 0.5),
            (2, 0, 0, 0, 2, 0.5), (3, 0, 0, 0, 3, 0.5)]  # fmt: skip
    cfg = {"persistent_metadata": persistent, "cxl_order": order}
    r = _run(_stream(recs), engine, 2, 1, 4, cfg, policy="lru", granularity="step")
    assert r["bytes_moved"]["cxl->nvme"] == ENTRY
    recs2 = [*recs, (4, 0, 0, 0, to_nvme, 0.5)]  # read the one that went down: from NVMe
    r2 = _run(_stream(recs2), engine, 2, 1, 4, cfg, policy="lru", granularity="step")
    assert r2["misses_nvme"] == 1


@pytest.mark.parametrize("engine", ["numpy", "fast"])
def test_the_weighted_boundary_is_in_the_victim_dump(engine: str) -> None:
    """Weighted placement: the boundary's demotions out of HBM are listed with the step of
    the event that closes the step (here every step's first read)."""
    r = _run(_stream(COLD), engine, 2, 1, 1, {"placement_mode": "weighted"})
    steps = [v[2] for v in r["_victims"]]
    assert r["cache"]["evictions"] == sum(v[0].size for v in r["_victims"])
    assert steps == sorted(steps) and len(steps) >= 2


def test_cxl_rounds_down_to_whole_entries() -> None:
    with pytest.raises(ValueError, match=r"CXL DRAM 1 entries \(4096 B\)"):
        config = PolicyConfig.from_mapping({"anchor_zone_size": 0})
        simulate(_stream(COLD), SimOptions(policy="ema", budget_bytes=ENTRY,
                                           cxl_bytes=2 * ENTRY - 1, nvme_bytes=ENTRY,
                                           config=config))  # fmt: skip


def test_integer_mode_compares_the_q16_score_as_a_float() -> None:
    """Q0.16 score 6554 is 0.1000061: below keep_threshold 0.10001 (not kept back), though
    q16(0.10001) = 6554 would keep it; at or above 0.1 it is kept back."""
    from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM
    from kvcxl.firmware.session import FirmwareSession

    for keep, want in ((0.10001, TIER_CXL), (0.1, TIER_HBM)):
        fw = FirmwareSession("ema", 4, PolicyConfig(keep_threshold=keep), mode="int")
        fw.describe([0], [0], [0], [0])
        fw.ensure(1)
        fw.policy.score_[0] = 6554
        assert int(fw.wants(np.array([0]))[0]) == want, keep


def test_the_anchor_term_counts_unpinned_anchor_zone_entries() -> None:
    """Weighted P of an anchor-zone entry that holds no pin (pinned_fraction 0) has N = 1."""
    from kvcxl.firmware.session import FirmwareSession

    cfg = PolicyConfig(placement_mode="weighted", pinned_fraction=0.0, anchor_zone_size=100)
    fw = FirmwareSession("ema", 4, cfg)
    ids = fw.describe([0, 0], [0, 0], [0, 0], [0, 20])  # first tokens 0 and 320
    fw.write(0, ids)
    assert not fw.cache.pinned[ids].any()
    p = fw.placement_value(ids)
    assert p[0] - p[1] == pytest.approx(cfg.placement_weights[2])
