"""Replay invariants on every workload: counts add up, bytes conserved, budgets kept,
Belady bounds every online policy (prefetch off), no wrong victim under audit."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import WORKLOADS, compile_workload, make_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES

SHAPE = PRESETS["ci"].with_(context_tokens=512)


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def stream(request):
    return compile_workload(make_workload(request.param, SHAPE, seed=3), steps=40)


def _check_conservation(r: dict, eb: int) -> None:
    moved = r["bytes_moved"]
    occ = r["occupancy_end"]
    for tier in ("hbm", "cxl", "nvme"):
        into = sum(v for k, v in moved.items() if k.endswith("->" + tier))
        out = sum(v for k, v in moved.items() if k.startswith(tier + "->"))
        assert into - out == occ[tier] * eb, (tier, moved, occ)
    assert occ["hbm"] + occ["cxl"] + occ["nvme"] == r["entries"]


def test_invariants_every_policy(stream):
    budget = stream.kv_bytes // 5
    rates = {}
    for name in sorted(POLICIES):
        r = simulate(stream, SimOptions(policy=name, budget_bytes=budget, audit=True, check=True))
        assert r["evidence"] == "Simulated"
        assert r["hits"] + r["misses"] == r["reads"] == stream.n_reads
        assert r["misses"] == r["misses_cxl"] + r["misses_nvme"]
        assert r["cache"]["hits"] == r["hits"]
        assert r["wrong_victims"] == 0
        assert r["occupancy_end"]["hbm"] <= r["budget_entries"]
        assert 0.0 <= r["hit_rate"] <= 1.0
        _check_conservation(r, stream.shape.entry_bytes)
        rates[name] = r["hit_rate"]
    for name, rate in rates.items():
        assert rates["belady"] >= rate - 1e-12, (name, rate, rates["belady"])


def test_tiny_cxl_spills_to_nvme_and_conserves(stream):
    r = simulate(
        stream,
        SimOptions(
            policy="lru",
            budget_bytes=stream.kv_bytes // 10,
            cxl_bytes=stream.kv_bytes // 10,
            check=True,
        ),
    )
    assert r["occupancy_end"]["cxl"] <= stream.kv_bytes // 10 // stream.shape.entry_bytes
    _check_conservation(r, stream.shape.entry_bytes)


def test_prefetch_and_int_mode_keep_invariants(stream):
    cfg = PolicyConfig(alpha=0.05)
    r = simulate(
        stream,
        SimOptions(
            policy="ema",
            budget_bytes=stream.kv_bytes // 4,
            config=cfg,
            prefetch=True,
            audit=True,
            check=True,
            mode="int",
        ),
    )
    assert r["wrong_victims"] == 0
    _check_conservation(r, stream.shape.entry_bytes)
    if r["prefetched_entries"]:
        assert 0.0 <= r["prefetch_precision"] <= 1.0
        assert 0.0 <= r["prefetch_coverage"] <= 1.0


def test_budget_zero_and_full():
    s = compile_workload(make_workload("cyclic", SHAPE, seed=1), steps=20)
    full = simulate(s, SimOptions(policy="lru", budget_bytes=s.kv_bytes, check=True))
    assert full["hit_rate"] == 1.0 and full["bytes_moved_total"] == s.kv_bytes  # only host writes
    zero = simulate(s, SimOptions(policy="lru", budget_bytes=0, check=True))
    assert zero["hit_rate"] == 0.0


def test_tiers_too_small_refused():
    s = compile_workload(make_workload("cyclic", SHAPE, seed=1), steps=5)
    with pytest.raises(ValueError, match="raise --budget, --cxl or --nvme"):
        simulate(s, SimOptions(policy="lru", budget_bytes=0, cxl_bytes=0, nvme_bytes=0))


def test_step_granularity_and_warmup():
    s = compile_workload(make_workload("zipf-sessions", SHAPE, seed=2), steps=30)
    r = simulate(
        s,
        SimOptions(
            policy="ema",
            budget_bytes=s.kv_bytes // 4,
            granularity="step",
            warmup_steps=10,
            audit=True,
            check=True,
        ),
    )
    assert r["steps"] == 20 and r["warmup_steps"] == 10
    assert r["reads"] == sum(r["per_step"]["reads"][10:])
    assert r["wrong_victims"] == 0


def test_persistent_metadata_matters_for_lfu():
    s = compile_workload(make_workload("zipf-sessions", SHAPE, seed=4), steps=80)
    runs = {}
    for persistent in (True, False):
        cfg = PolicyConfig(persistent_metadata=persistent)
        runs[persistent] = simulate(
            s, SimOptions(policy="lfu", budget_bytes=s.kv_bytes // 5, config=cfg)
        )
    assert runs[True]["reads"] == runs[False]["reads"]
    assert runs[True]["persistent_metadata"] and not runs[False]["persistent_metadata"]
    # Counts that survive eviction keep the returning sessions' entries (Appendix N;
    # docs/design.md).
    assert runs[True]["hits"] != runs[False]["hits"]


@pytest.mark.parametrize("read", ["topk:3", "threshold:0.05"])
def test_sparse_reads_keep_invariants(read):
    wl = make_workload("retrieval", SHAPE, seed=1)
    dense = compile_workload(wl, steps=20)
    sparse = compile_workload(make_workload("retrieval", SHAPE, seed=1), steps=20, read=read)
    assert sparse.n_entries == dense.n_entries  # the same KV exists; fewer entries are read
    assert 0 < sparse.n_reads < dense.n_reads
    if read.startswith("topk"):
        assert sparse.n_reads == 20 * SHAPE.layers * SHAPE.kv_heads * 3
    rates = {}
    for name in ("belady", "ema", "lru", "h2o"):
        r = simulate(sparse, SimOptions(policy=name, budget_bytes=sparse.kv_bytes // 10,
                                        audit=True, check=True))  # fmt: skip
        assert r["hits"] + r["misses"] == sparse.n_reads and r["wrong_victims"] == 0
        _check_conservation(r, sparse.shape.entry_bytes)
        rates[name] = r["hit_rate"]
    assert rates["belady"] >= max(rates.values())


def test_oversized_workload_refused(monkeypatch):
    from kvcxl.emu.workloads import stream as stream_mod

    monkeypatch.setattr(stream_mod, "MAX_ENTRIES", 100)
    with pytest.raises(ValueError, match=r"creates more than 100 entries.*fixed cap"):
        compile_workload(make_workload("cyclic", SHAPE, seed=0), steps=5)
    # the floor, not the memory, refuses when the memory would allow fewer
    monkeypatch.setattr(stream_mod, "MAX_ENTRIES", None)
    monkeypatch.setattr(stream_mod, "MIN_ENTRIES", 100)
    monkeypatch.setattr(stream_mod, "available_bytes", lambda: 0)
    with pytest.raises(ValueError, match=r"more than 100 entries.*floor of 100 entries") as e:
        compile_workload(make_workload("cyclic", SHAPE, seed=0), steps=5)
    assert "memory" not in str(e.value)


def test_the_entry_cap_follows_the_memory_available(monkeypatch):
    """Without a fixed cap a workload may create as many entries as half the memory
    available holds at the builder's bytes an entry: S1's 16 users (84 M entries) are
    not refused on a machine that holds them, and are where it does not."""
    from kvcxl.emu.workloads import stream as stream_mod

    monkeypatch.setattr(stream_mod, "MIN_ENTRIES", 10)
    wl = make_workload("cyclic", SHAPE, seed=0)
    n = compile_workload(wl, steps=5).n_entries
    per = stream_mod.BUILD_BYTES_PER_ENTRY
    monkeypatch.setattr(stream_mod, "available_bytes", lambda: 2 * per * (n - 1))
    with pytest.raises(ValueError, match=f"more than {n - 1:,} entries.*memory"):
        compile_workload(make_workload("cyclic", SHAPE, seed=0), steps=5)
    monkeypatch.setattr(stream_mod, "available_bytes", lambda: 2 * per * n)
    assert compile_workload(make_workload("cyclic", SHAPE, seed=0), steps=5).n_entries == n
    s1_users = 16 * PRESETS["s1"].entries_per_context
    monkeypatch.setattr(stream_mod, "available_bytes", lambda: 24 * 2**30)  # this machine
    assert stream_mod.entry_cap()[0] > s1_users > stream_mod.MIN_ENTRIES


def test_shared_blocks_read_once_per_batch():
    # A shared-prefix block read by several sequences of a batch is one read (max weight):
    # with duplicate reads, farthest-next-use would no longer bound LFU (seen before merging).
    s = compile_workload(make_workload("shared-prefix", PRESETS["ci"], seed=1), steps=60)
    for i in np.flatnonzero(s.read_mask):
        ids = s.ids[s.ev_off[i] : s.ev_off[i + 1]]
        assert np.unique(ids).size == ids.size
    budget = s.kv_bytes // 5
    opt = simulate(s, SimOptions(policy="belady", budget_bytes=budget))["hit_rate"]
    for name in ("lfu", "ema", "lru"):
        assert opt >= simulate(s, SimOptions(policy=name, budget_bytes=budget))["hit_rate"]


def test_unordered_victims_change_no_result(stream):
    """Without a victim dump the cache selects each pass's victims as a set: every count,
    byte and tier is the same as with ordered selection, and the audit still finds them
    exactly the top-k."""
    budget = stream.kv_bytes // 10
    for name in ("ema", "lru", "h2o"):
        base = SimOptions(policy=name, budget_bytes=budget, audit=True, cxl_bytes=budget)
        fast = simulate(stream, base)
        ordered = simulate(stream, SimOptions(**{**base.__dict__, "record_victims": True}))
        assert fast["misordered_victims"] is None and ordered["misordered_victims"] == 0
        assert fast["wrong_victims"] == ordered["wrong_victims"] == 0
        for key in ("hits", "misses", "misses_cxl", "misses_nvme", "bytes_moved", "cache"):
            assert fast[key] == ordered[key], (name, key)


def _bytes_moved_plain(m: list[list[int]], entry_bytes: int) -> dict[str, int]:
    """Bytes moved per pair, written from docs/simulator.md's `bytes_moved` row: pinned HBM
    is HBM on both sides, pairs host, HBM, CXL, NVMe (from) by HBM, CXL, NVMe (to), zero
    pairs left out."""
    from kvcxl.emu.sim.tiers import HOST, TIER_CXL, TIER_HBM, TIER_HBM_PINNED, TIER_NVME

    rows = {"host": (HOST,), "hbm": (TIER_HBM, TIER_HBM_PINNED), "cxl": (TIER_CXL,)}
    rows["nvme"] = (TIER_NVME,)
    out = {}
    for a in ("host", "hbm", "cxl", "nvme"):
        for b in ("hbm", "cxl", "nvme"):
            n = sum(m[x][y] for x in rows[a] for y in rows[b])
            if a != b and n:
                out[f"{a}->{b}"] = n * entry_bytes
    return out


def test_bytes_moved_per_row_against_a_plain_sum() -> None:
    """Tiers.bytes_moved_rows (the result's per-step bytes moved, merged in one pass) and
    bytes_moved are, row by row, a plain per-pair sum: pinned HBM counted as HBM on both
    sides, zero pairs left out, in the documented key order."""
    from kvcxl.emu.sim.tiers import Tiers

    rng = np.random.default_rng(3)
    tiers = Tiers(4096, 10, 10)
    moved = rng.integers(0, 3, (40, 5, 4)) * (rng.random((40, 5, 4)) < 0.4)
    want = [_bytes_moved_plain(x.tolist(), 4096) for x in moved]
    got = tiers.bytes_moved_rows(moved)
    assert got == want
    assert [list(d) for d in got] == [list(d) for d in want]  # the same key order
    assert [tiers.bytes_moved(x) for x in moved] == want
    assert tiers.bytes_moved_rows(moved[:0]) == []
