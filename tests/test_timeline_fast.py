"""The transfer timeline on the fast engine (docs/timeline.md): its transfer log record by
record, its compiled schedule stage by stage and its whole report equal to the numpy
engine's (whose log is scheduled by the readable :mod:`kvcxl.emu.timeline.engine`, held
to the SimPy twin in tests/test_timeline.py), across presets, policies and granularities;
and the compiled scheduler equal to the readable one on logs with prefetches (which the
fast engine does not replay)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

pytest.importorskip("numba")

from kvcxl.emu.shape import PRESETS as SHAPES
from kvcxl.emu.sim import fast
from kvcxl.emu.sim.fast import timeline as fast_log
from kvcxl.emu.sim.simulator import GRANULARITIES, SimOptions, _Replay, simulate
from kvcxl.emu.sim.sweep import SweepSpec, build_stream
from kvcxl.emu.timeline import compiled, engine
from kvcxl.emu.timeline.engine import ScheduleArrays
from kvcxl.emu.timeline.log import COLUMNS, EVICT_MOVES, LogArrays
from kvcxl.emu.timeline.resources import PRESETS, RESOURCE_NAMES, Resources, offload_preset
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.emu.workloads.stream import from_trace
from kvcxl.firmware.config import PolicyConfig

SHAPE = SHAPES["ci"].with_(context_tokens=256)
TIMINGS = {
    "seed": PRESETS["seed"].timing(),
    "asic": PRESETS["asic"].timing(),
    "fpga": PRESETS["fpga"].timing(),
    "offload": offload_preset(0.32).timing(),
    "seed-compute": dataclasses.replace(PRESETS["seed"].timing(), compute_model=True),
}
# A representative set of the fast engine's policy modules: a queue, a scored policy in
# both modes, a count, the offline optimum.
POLICIES = [("lru", "float"), ("ema", "float"), ("ema", "int"), ("lfu", "float"),
            ("belady", "float")]  # fmt: skip


def _streams() -> dict[str, Any]:
    wl = compile_workload(make_workload("multi-turn", SHAPE, seed=1), 8, read="topk:2")
    return {"workload": wl, "trace-v1": from_trace(wl.to_trace(writes=False))}


STREAMS = _streams()


def _same(a: Any, b: Any, what: str) -> None:
    """Every field of two array forms equal, to the bit (NaN where NaN)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.shape == y.shape, f"{what}.{f.name}: shape {x.shape} vs {y.shape}"
            ok = np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
        else:
            ok = x == y
        assert ok, f"{what}.{f.name} differs"


def _replays(stream: Any, **kw: Any) -> tuple[_Replay, dict, _Replay, dict]:
    out = []
    for eng in ("numpy", "fast"):
        rp = _Replay(stream, SimOptions(engine=eng, timeline=True, **kw))
        assert rp.engine == eng
        out += [rp, rp.run(None)]
    return out[0], out[1], out[2], out[3]


def _held_at_most_servers(s: ScheduleArrays, res: Resources) -> None:
    """No resource holds more stages at once than it has servers."""
    tables = compiled.stage_table(res)
    mask = tables[1][s.tr_move[s.st_transfer], s.st_stage]
    for q, (name, k) in enumerate(res.servers().items()):
        held = (mask >> q & 1).astype(bool)
        ev = sorted([(t, 1) for t in s.st_start[held]] + [(t, -1) for t in s.st_end[held]])
        level = np.cumsum([d for _t, d in ev]) if ev else np.zeros(0)
        assert (level <= k).all(), f"{name} held by {level.max()} stages, has {k} servers"


@pytest.mark.parametrize("policy,mode", POLICIES)
@pytest.mark.parametrize("gran", GRANULARITIES)
def test_fast_timeline_equals_numpys(policy: str, mode: str, gran: str) -> None:
    """Log, schedule (every transfer and stage) and the whole result, timeline included."""
    k = 0
    for source, stream in STREAMS.items():
        kv = stream.kv_bytes
        for name, timing in TIMINGS.items():
            k += 1
            cxl = (None, kv // 20)[k % 2]  # a small CXL DRAM: spills to NVMe
            place = ("policy", "fill")[(k // 2) % 2]
            budget = (0.1, 0.25)[(k // 4) % 2]
            kw = dict(policy=policy, mode=mode, granularity=gran, budget_bytes=int(kv * budget),
                      cxl_bytes=cxl, placement=place, timing=timing, warmup_steps=k % 3,
                      config=PolicyConfig(persistent_metadata=k % 2 == 0))  # fmt: skip
            desc = f"{source} {policy}/{mode} {gran} {name} cxl {cxl} {place} {budget}"
            rn, a, rf, b = _replays(stream, **kw)
            assert rn.tl is not None and rf.tl_arrays is not None
            _same(rn.tl.arrays(), rf.tl_arrays, f"{desc}: log")
            res = Resources.of(timing)
            s_ref = engine.run(rn.tl, res).arrays()
            s_fast = compiled.run(rf.tl_arrays, res)
            _same(s_ref, s_fast, f"{desc}: schedule")
            _held_at_most_servers(s_fast, res)
            tl = b["timeline"]
            assert all(0.0 <= u <= 1.0 for u in tl["utilisation"].values()), desc
            assert a.pop("engine") == "numpy" and b.pop("engine") == "fast"
            for key in a:
                assert a[key] == b[key], f"{desc}: {key}: numpy {a[key]!r}, fast {b[key]!r}"
            assert a.keys() == b.keys()


def test_the_cases_move_every_way() -> None:
    """The cases above exercise every move the fast engine makes, and queue for resources."""
    moves, waited = set(), False
    static = PolicyConfig(tier_management="static", cxl_order="fifo")  # victims to NVMe too
    runs = (("policy", PolicyConfig()), ("policy", static), ("fill", PolicyConfig()))
    for stream in STREAMS.values():
        for place, cfg in runs:
            _rn, _a, rf, b = _replays(stream, policy="ema", budget_bytes=stream.kv_bytes // 10,
                                      cxl_bytes=stream.kv_bytes // 20, placement=place,
                                      config=cfg)  # fmt: skip
            s = compiled.run(rf.tl_arrays, Resources.of(rf.opts.timing))
            moves |= set(s.tr_move.tolist())
            waited |= b["timeline"]["queueing"]["demand"]["total_ns"] > 0
    assert moves == {0, 1, 2, 3, 4} and waited


# --- the compiled scheduler against the readable one, with prefetches ----------------------
MULTI_TURN = SweepSpec(workload="multi-turn", steps=30)
PREFETCH_CASES = {
    "multi-turn-lru-pf": (MULTI_TURN, dict(policy="lru")),
    "multi-turn-ema-pf": (MULTI_TURN, dict(policy="ema")),
    "cyclic-ema-spill": (SweepSpec(workload="cyclic", steps=30), dict(policy="ema", cxl=64)),
    "retrieval-topk-lru-step": (
        SweepSpec(workload="retrieval", steps=24, read="topk:4"),
        dict(policy="lru", budget=0.2, granularity="step"),
    ),
}  # fmt: skip


def _numpy_log(spec: SweepSpec, **o: Any) -> tuple[LogArrays, Resources, Any]:
    st = build_stream(spec, 0)
    eb = st.shape.entry_bytes
    frac, cxl = o.pop("budget", 0.1), o.pop("cxl", None)
    opts = SimOptions(budget_bytes=int(frac * st.n_entries) * eb, engine="numpy", timeline=True,
                      prefetch=True, cxl_bytes=None if cxl is None else cxl * eb, **o)  # fmt: skip
    rp = _Replay(st, opts)
    rp.run(None)
    assert rp.tl is not None
    return rp.tl.arrays(), Resources.of(opts.timing), rp.tl


@pytest.fixture(scope="module", params=list(PREFETCH_CASES))
def pf_case(request: Any) -> tuple[str, LogArrays, Resources, Any]:
    spec, o = PREFETCH_CASES[request.param]
    return (request.param, *_numpy_log(spec, **dict(o)))


def test_compiled_scheduler_equals_the_readable_one(pf_case: Any) -> None:
    name, arrays, res, log = pf_case
    ref = engine.run(log, res).arrays()
    assert (ref.tr_cls == 1).any() and arrays.wait_n.sum() > 0, "no prefetch to schedule"
    _same(ref, compiled.run(arrays, res), f"{name}: schedule")


@pytest.mark.parametrize("name", ["seed", "fpga", "offload"])
def test_compiled_scheduler_equals_across_presets(pf_case: Any, name: str) -> None:
    _case, arrays, _res, log = pf_case
    res = dataclasses.replace(Resources.of(TIMINGS[name]), nvme_queue_depth=4)
    _same(engine.run(log, res).arrays(), compiled.run(arrays, res), f"{name}: schedule")


def test_planted_defects_in_the_compiled_scheduler_are_caught(pf_case, monkeypatch) -> None:
    """Half duplex, demand behind prefetch, a dropped write-back: each breaks the equality."""
    name, arrays, res, log = pf_case
    good = engine.run(log, res).arrays()
    real = compiled.stages

    def half_duplex(move, n, r):  # type: ignore[no-untyped-def]
        return [(lat, tuple("link_rd" if x == "link_wr" else x for x in held))
                for lat, held in real(move, n, r)]  # fmt: skip

    monkeypatch.setattr(compiled, "stages", half_duplex)
    assert not np.array_equal(compiled.run(arrays, res).st_start, good.st_start)
    monkeypatch.setattr(compiled, "stages", real)
    swapped = np.where(compiled._COL_CLS == 2, 2, 1 - compiled._COL_CLS)
    monkeypatch.setattr(compiled, "_COL_CLS", swapped)
    if name != "retrieval-topk-lru-step":  # (nothing demand-class queues beside its prefetch)
        assert not np.array_equal(compiled.run(arrays, res).st_start, good.st_start)
    monkeypatch.setattr(compiled, "_COL_CLS", np.where(swapped == 2, 2, 1 - swapped))
    dropped = dataclasses.replace(arrays, moves=arrays.moves.copy())
    dropped.moves[:, 2] = 0  # every HBM -> CXL write-back of a read's eviction
    s = compiled.run(dropped, res)
    assert s.tr_move.size < good.tr_move.size


def test_a_dropped_write_back_in_the_fast_log_is_caught() -> None:
    """The comparison above would see a fast log that loses a record's write-backs."""
    stream = STREAMS["workload"]
    rn, _a, rf, _b = _replays(stream, policy="lru", budget_bytes=stream.kv_bytes // 10)
    log = rf.tl_arrays
    assert log is not None and log.moves[:, 2].sum() > 0
    bad = dataclasses.replace(log, moves=log.moves.copy())
    row = int(np.flatnonzero(bad.moves[:, 2])[-1])
    bad.moves[row, 2] -= 1
    with pytest.raises(AssertionError, match=r"log\.moves"):
        _same(rn.tl.arrays(), bad, "log")  # type: ignore[union-attr]


# --- engine choice ----------------------------------------------------------------------
def test_the_fast_engine_runs_the_timeline_with_prefetch_too() -> None:
    """(tests/test_sim_fast_prefetch.py holds the two engines' prefetch timelines equal.)"""
    stream = STREAMS["workload"]
    o = SimOptions(policy="lru", budget_bytes=stream.kv_bytes // 10, timeline=True)
    assert fast.unsupported(o) is None
    assert simulate(stream, o)["engine"] == "fast"
    p = dataclasses.replace(o, prefetch=True)
    assert fast.unsupported(p) is None
    r = simulate(stream, p)
    assert r["engine"] == "fast" and r["timeline"]["prefetched_bytes"] > 0


def test_the_log_buffer_has_room_for_every_record() -> None:
    """Request granularity: a write and a read call per read at most (lazy creates)."""
    stream = STREAMS["trace-v1"]
    rn, _a, rf, _b = _replays(stream, policy="lru", budget_bytes=stream.kv_bytes // 10,
                              granularity="request")  # fmt: skip
    n = rf.tl_arrays.read.size  # type: ignore[union-attr]
    assert n == len(rn.tl.records) > stream.n_reads  # type: ignore[union-attr]
    plan = fast.flat_plan(stream, "request")
    assert fast_log.buffer(True, plan["read"].size, plan["ids"].size, True).rows.shape[0] >= n
    assert RESOURCE_NAMES == tuple(Resources.of(rf.opts.timing).servers())


# --- the tier rules (docs/policy.md, "Tiers below HBM") ---------------------------------
# Managed tiers move entries at a step boundary, between two calls: numpy settles those
# moves before the next call's record opens, so no record holds them.
TIER_MODES: dict[str, dict[str, Any]] = {
    "managed": {"tier_management": "managed", "evict_threshold": 0.05},
    "managed-sink": {"tier_management": "managed", "evict_threshold": 0.09,
                     "keep_threshold": 0.3, "background_moves": 1, "alpha": 0.3},
    "weighted-policy": {"tier_management": "managed", "placement_mode": "weighted",
                        "background_moves": 3, "cxl_order": "policy",
                        "placement_cuts": (0.5, 0.7)},
    "all": {"tier_management": "managed", "cxl_order": "policy", "eviction_passes": "batched",
            "eviction_batch": 5, "evict_threshold": 0.05, "keep_threshold": 0.2},
    "all-weighted": {"tier_management": "managed", "placement_mode": "weighted",
                     "cxl_order": "policy", "eviction_passes": "batched", "eviction_batch": 2,
                     "background_moves": 8, "placement_cuts": (0.5, 0.7)},
}  # fmt: skip
TIER_POLICIES = [("ema", "float"), ("ema", "int"), ("lru", "float"), ("arc", "float"),
                 ("sieve", "float")]  # fmt: skip


def _background_moved(rp: _Replay) -> int:
    """Entries the numpy replay moved outside every record (the step boundaries' moves)."""
    assert rp.tl is not None
    cols = [COLUMNS.index(("evict", k)) for k in EVICT_MOVES]
    logged = rp.tl.arrays().moves[:, cols].sum()
    m = rp.tiers.moved  # [from, to]: HBM 1, CXL DRAM 2, NVMe 3
    return int(m[1, 2] + m[1, 3] + m[2, 3] - logged)


@pytest.mark.parametrize("mode", list(TIER_MODES))
@pytest.mark.parametrize("gran", GRANULARITIES)
def test_fast_timeline_equals_numpys_under_the_tier_rules(mode: str, gran: str) -> None:
    """Log, schedule and result under managed tiers, the policy's CXL DRAM order and
    batched passes; some replays move entries at step boundaries (else this proves
    nothing about them)."""
    stream = STREAMS["workload"]
    kv = stream.kv_bytes
    cfg = PolicyConfig.from_mapping(TIER_MODES[mode])
    outside = 0
    for k, (policy, pmode) in enumerate(TIER_POLICIES):
        cxl = (kv // 20, kv // 8)[k % 2]
        kw = dict(policy=policy, mode=pmode, granularity=gran, budget_bytes=kv // 10,
                  cxl_bytes=cxl, config=cfg, warmup_steps=k % 2)  # fmt: skip
        desc = f"{mode} {policy}/{pmode} {gran} cxl {cxl}"
        if fast.unsupported(SimOptions(**kw)):  # (a queue policy's CXL DRAM order)
            continue
        rn, a, rf, b = _replays(stream, **kw)
        outside += _background_moved(rn)
        _same(rn.tl.arrays(), rf.tl_arrays, f"{desc}: log")  # type: ignore[union-attr]
        res = Resources.of(rf.opts.timing)
        _same(engine.run(rn.tl, res).arrays(), compiled.run(rf.tl_arrays, res),
              f"{desc}: schedule")  # fmt: skip
        assert a.pop("engine") == "numpy" and b.pop("engine") == "fast"
        for key in a:
            assert a[key] == b[key], f"{desc}: {key}: numpy {a[key]!r}, fast {b[key]!r}"
    assert outside > 0, f"{mode} {gran}: no step-boundary move"
