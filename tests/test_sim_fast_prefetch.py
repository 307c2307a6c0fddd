"""The fast engine's prefetch against the numpy engine's (docs/policy.md, prefetch).

The compiled candidates, rank and order (:mod:`kvcxl.emu.sim.fast.prefetch`) are held to
the firmware's own (``FirmwareSession.prefetch_candidates``, ``firmware.prefetch.rank``)
directly, batch by batch, weights with ties included; then whole replays on both engines
must give the same result dict (prefetched entries, precision, coverage, every per-step
figure, tiers, bytes moved) and the same victims in order with their priorities
(tests/test_sim_fast.py's ``assert_same``), and the same wasted prefetches, over several
workloads (a shared prefix among them), every covered online policy, both EMA modes, the
three granularities, budgets, the prefetch parameters and the tier rules; with the
timeline, the same transfer log (prefetch columns and waits), schedule and result.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest
from numba import njit

from kvcxl.emu.sim import fast
from kvcxl.emu.sim.fast import prefetch as fpf
from kvcxl.emu.sim.simulator import GRANULARITIES, SimOptions, _Replay, simulate
from kvcxl.emu.timeline import compiled, engine
from kvcxl.emu.timeline.resources import Resources
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware import prefetch as fw_prefetch
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.session import FirmwareSession
from kvcxl.firmware.table import EntryTable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sim_fast import SHAPE, _streams, assert_same
from test_timeline_fast import _same

ONLINE = [(p, m) for p, m in sorted(fast.POLICY_CODES) if POLICIES[p].online]
PREFETCH = {  # (config, prefetch_limit)
    "default": ({}, 64),
    "limit-2": ({}, 2),
    "wide": ({"prefetch_window": 64, "prefetch_depth": 3}, 16),
    "score": ({"prefetch_blend": (0.1, 0.9), "prefetch_distance_scale": 10.0}, 8),
    "rope": ({"prefetch_blend": (1.0, 0.0), "prefetch_window": 48}, 5),
    "depth-0": ({"prefetch_depth": 0}, 64),
    "window-0": ({"prefetch_window": 0, "touch_threshold": 0.05}, 3),
    "volatile": ({"persistent_metadata": False, "pinned_fraction": 0.25}, 8),
}  # fmt: skip
_STREAMS: dict[str, Any] = {}


def _stream(workload: str) -> Any:
    if workload not in _STREAMS:
        wl = make_workload(workload, SHAPE, seed=5)
        _STREAMS[workload] = compile_workload(wl, 6, read="topk:3")
    return _STREAMS[workload]


def _pair(stream: Any, **kw: Any) -> tuple[_Replay, dict, _Replay, dict]:
    """Both engines' replays (kept: their prefetch counts) and results, victims recorded."""
    out: list[Any] = []
    for eng in ("numpy", "fast"):
        rp = _Replay(stream, SimOptions(engine=eng, record_victims=True, prefetch=True, **kw))
        assert rp.engine == eng
        r = rp.run(None)
        assert r.pop("engine") == eng
        out += [rp, r]
    return out[0], out[1], out[2], out[3]


def _check(stream: Any, desc: str, **kw: Any) -> dict:
    rn, a, rf, b = _pair(stream, **kw)
    assert_same(a, b, desc)
    counts = ("pf_total", "pf_useful", "pf_useful_warm", "pf_wasted")
    assert [getattr(rn, c) for c in counts] == [getattr(rf, c) for c in counts], desc
    return {"result": a, "wasted": rn.pf_wasted}


# --- the compiled rank and candidates against the firmware's ----------------------------
@njit
def _ranks_float(pf, d, s):  # type: ignore[no-untyped-def]
    out = np.empty(s.size)
    for i in range(s.size):
        out[i] = fpf.rank_float(pf, d[i], s[i])
    return out


@njit
def _ranks_q16(pf, d, s):  # type: ignore[no-untyped-def]
    out = np.empty(s.size, np.int64)
    for i in range(s.size):
        out[i] = fpf.rank_q16(pf, d[i], s[i])
    return out


RANK_CONFIGS = [
    {},
    {"prefetch_window": 160, "prefetch_distance_scale": 7.5},
    {"prefetch_blend": (0.35, 0.65), "prefetch_window": 16},
]


@pytest.mark.parametrize("cfg", RANK_CONFIGS)
def test_the_rank_is_the_firmwares(cfg: dict) -> None:
    """Every block distance against random float scores (float mode) and every Q0.16 score
    (int mode), bit for bit."""
    config = PolicyConfig.from_mapping(cfg)
    stream = _stream("multi-turn")
    bt = stream.shape.block_tokens
    pf = fpf.build(stream, config, on=True, int_mode=False, limit=4, max_batch=4)
    rng = np.random.default_rng(1)
    for d in range(pf.wb + 1):
        s = np.concatenate([[0.0, 1.0, 0.5], rng.random(2000)])
        dist = np.full(s.size, d, np.int64)
        want = fw_prefetch.rank(dist, s, bt, config, mode="float")
        got = _ranks_float(pf, dist, s)
        assert np.array_equal(got.view(np.int64), np.asarray(want).view(np.int64)), d
        q = np.arange(65536, dtype=np.int64)
        dist = np.full(q.size, d, np.int64)
        want = fw_prefetch.rank(dist, q, bt, config, mode="int")
        assert np.array_equal(_ranks_q16(pf, dist, q), want), d


@njit
def _fast_candidates(pf, ids, w, e_ctx, e_block, n_desc, resident, out):  # type: ignore[no-untyped-def]
    m = fpf.gather(pf, ids, w, 0, ids.size, e_ctx, e_block, n_desc, resident)
    for j in range(m):  # (an unscored policy: every score 0)
        pf.rank[j] = fpf.rank_float(pf, pf.dist[pf.cand[j]], 0.0)
    return fpf.order(pf, m, out)


@pytest.mark.parametrize("workload", ["shared-prefix", "zipf-sessions"])
@pytest.mark.parametrize("limit", [1, 3, 64])
def test_the_candidates_are_the_firmwares(workload: str, limit: int) -> None:
    """Random batches with tied weights (the ``limit`` strongest touches, ties to the
    lower entry id), part of the entries resident and part not yet described: the fetch
    order is FirmwareSession.prefetch_candidates', entry for entry."""
    stream = _stream(workload)
    n = stream.n_entries
    rng = np.random.default_rng(limit)
    for cfg in ({}, {"prefetch_window": 48, "prefetch_depth": 3}, {"prefetch_window": 0}):
        config = PolicyConfig.from_mapping(cfg)
        n_desc = n // 2 + int(rng.integers(n // 2))
        fw = FirmwareSession("lru", n, config, table=EntryTable(
            block_tokens=stream.shape.block_tokens, capacity=n))  # fmt: skip
        fw.ensure(n)
        fw.describe(stream.e_ctx[:n_desc], stream.e_layer[:n_desc], stream.e_head[:n_desc],
                    stream.e_block[:n_desc])  # fmt: skip
        for ctx, parent, blocks in stream.prefixes:
            fw.share_prefix(ctx, parent, blocks)
        fw.write(0, np.flatnonzero(rng.random(n_desc) < 0.3))
        resident = fw.resident()
        pf = fpf.build(stream, config, on=True, int_mode=False, limit=limit, max_batch=256)
        e_ctx, e_block = (np.asarray(a, np.int64) for a in (stream.e_ctx, stream.e_block))
        out = np.empty(n, np.int64)
        levels = np.array([0.0, 0.005, 0.2, 0.2, 0.7, 0.7, 1.0], np.float32)
        seen = 0
        for _ in range(60):
            ids = rng.integers(0, n_desc, int(rng.integers(1, 256)))
            w = levels[rng.integers(0, levels.size, ids.size)]
            want = fw.prefetch_candidates(ids, w, limit)
            k = _fast_candidates(pf, ids, w, e_ctx, e_block, n_desc, resident, out)
            assert np.array_equal(out[:k], want), (cfg, ids, w)
            seen += want.size
        assert seen > 0


# --- whole replays on both engines ------------------------------------------------------
@pytest.mark.parametrize("workload", ["multi-turn", "shared-prefix", "retrieval"])
def test_every_policy_prefetches_identically(workload: str) -> None:
    stream = _stream(workload)
    kv = stream.kv_bytes
    k = 0
    for policy, mode in ONLINE:
        for gran in GRANULARITIES:
            k += 1
            name = list(PREFETCH)[k % len(PREFETCH)]
            cfg, limit = PREFETCH[name]
            budget = (0.15, 0.3, 0.5)[k % 3]
            cxl = (None, kv // 20)[(k // 3) % 2]
            desc = f"{workload} {policy}/{mode} {gran} {name} budget {budget} cxl {cxl}"
            _check(stream, desc, policy=policy, mode=mode, granularity=gran,
                   warmup_steps=k % 3, budget_bytes=int(kv * budget), cxl_bytes=cxl,
                   config=PolicyConfig.from_mapping(cfg), prefetch_limit=limit)  # fmt: skip


@pytest.mark.parametrize("mode", ["float", "int"])
@pytest.mark.parametrize("name", list(PREFETCH))
def test_the_emas_prefetch_parameters_replay_identically(mode: str, name: str) -> None:
    """The EMA (its scores rank the candidates) under every prefetch setting, every
    granularity; the prefetches must matter (some read, some wasted) where they run."""
    stream = _stream("zipf-sessions")
    cfg, limit = PREFETCH[name]
    useful = wasted = 0
    for k, gran in enumerate(GRANULARITIES):
        budget = (0.15, 0.3, 0.2)[k]
        got = _check(stream, f"ema/{mode} {name} {gran}", policy="ema", mode=mode,
                     granularity=gran, budget_bytes=int(stream.kv_bytes * budget),
                     cxl_bytes=stream.kv_bytes // 10, warmup_steps=1,
                     config=PolicyConfig.from_mapping(cfg), prefetch_limit=limit)  # fmt: skip
        r = got["result"]
        if name == "depth-0":
            assert r["prefetched_entries"] == 0 and r["prefetch_precision"] is None
            continue
        assert r["prefetched_entries"] > 0, gran
        useful += r["prefetch_precision"] > 0
        wasted += got["wasted"]
    if name != "depth-0":
        assert useful and wasted


@pytest.mark.parametrize("source", ["trace-v1", "trace-v2"])
def test_traces_prefetch_identically(source: str) -> None:
    """Entries written on their first read (a trace's lazy creates): prefetch proposes only
    the entries described so far."""
    stream = _streams()[source]
    kv = stream.kv_bytes
    fetched = 0
    for k, (policy, mode) in enumerate([("ema", "float"), ("ema", "int"), ("lru", "float")]):
        for gran in GRANULARITIES:
            got = _check(stream, f"{source} {policy}/{mode} {gran}", policy=policy, mode=mode,
                         granularity=gran, budget_bytes=kv // 5, cxl_bytes=kv // 10,
                         prefetch_limit=(4, 64, 16)[k], warmup_steps=k % 2)  # fmt: skip
            fetched += got["result"]["prefetched_entries"]
    assert fetched > 0


TIER_RULES = {
    "cxl-policy": {"cxl_order": "policy"},
    "managed": {"tier_management": "managed", "cxl_order": "policy", "evict_threshold": 0.05,
                "keep_threshold": 0.3, "background_moves": 4},
    "weighted": {"tier_management": "managed", "placement_mode": "weighted",
                 "placement_cuts": (0.5, 0.7)},
    "batched": {"eviction_passes": "batched", "eviction_batch": 3},
    "all": {"tier_management": "managed", "cxl_order": "policy", "eviction_passes": "batched",
            "eviction_batch": 5, "evict_threshold": 0.05, "prefetch_window": 48},
}  # fmt: skip


@pytest.mark.parametrize("rule", list(TIER_RULES))
def test_prefetch_under_the_tier_rules_replays_identically(rule: str) -> None:
    stream = _stream("multi-turn")
    kv = stream.kv_bytes
    cfg = PolicyConfig.from_mapping(TIER_RULES[rule])
    for k, (policy, mode) in enumerate([("ema", "float"), ("ema", "int"), ("lru", "float"),
                                        ("sieve", "float")]):  # fmt: skip
        for gran in GRANULARITIES:
            budget = (0.1, 0.25)[k % 2]
            _check(stream, f"{rule} {policy}/{mode} {gran}", policy=policy, mode=mode,
                   granularity=gran, budget_bytes=int(kv * budget), cxl_bytes=kv // 20,
                   config=cfg, prefetch_limit=(8, 64)[k % 2])  # fmt: skip


# --- with the timeline --------------------------------------------------------------------
@pytest.mark.parametrize("gran", GRANULARITIES)
def test_the_prefetch_timeline_is_numpys(gran: str) -> None:
    """The transfer log (prefetch columns, waits), its schedule and the whole result,
    with prefetches that arrive late and prefetches wasted."""
    late = waits = 0
    for k, (policy, mode) in enumerate([("ema", "float"), ("ema", "int"), ("lru", "float")]):
        for workload in ("multi-turn", "shared-prefix"):
            stream = _stream(workload)
            kv = stream.kv_bytes
            cfg = PolicyConfig.from_mapping(
                TIER_RULES["managed"] if k == 1 else PREFETCH["wide"][0]
            )
            kw = dict(policy=policy, mode=mode, granularity=gran, budget_bytes=kv // 6,
                      cxl_bytes=kv // 20, warmup_steps=1, config=cfg, prefetch=True,
                      prefetch_limit=16, timeline=True)  # fmt: skip
            rn, rf = _Replay(stream, SimOptions(engine="numpy", **kw)), None
            rf = _Replay(stream, SimOptions(engine="fast", **kw))
            a, b = rn.run(None), rf.run(None)
            desc = f"{workload} {policy}/{mode} {gran}"
            assert rn.tl is not None and rf.tl_arrays is not None
            _same(rn.tl.arrays(), rf.tl_arrays, f"{desc}: log")
            res = Resources.of(rn.opts.timing)
            _same(engine.run(rn.tl, res).arrays(), compiled.run(rf.tl_arrays, res),
                  f"{desc}: schedule")  # fmt: skip
            assert a.pop("engine") == "numpy" and b.pop("engine") == "fast"
            for key in a:
                assert a[key] == b[key], f"{desc}: {key}: numpy {a[key]!r}, fast {b[key]!r}"
            late += a["timeline"]["late_prefetch_bytes"] > 0
            waits += rf.tl_arrays.wait_rec.size
    # (one read a batch: the next batch's request comes late enough for every prefetch here)
    assert waits and (late or gran == "request")


# --- what runs where ----------------------------------------------------------------------
def test_prefetch_runs_on_the_fast_engine_and_the_optimum_refuses_it_alike() -> None:
    for timeline in (False, True):
        opts = SimOptions(policy="ema", prefetch=True, timeline=timeline)
        assert fast.unsupported(opts) is None
    stream = _stream("multi-turn")
    r = simulate(stream, SimOptions(policy="lru", budget_bytes=stream.kv_bytes // 4,
                                    prefetch=True))  # fmt: skip
    assert r["engine"] == "fast" and r["prefetched_entries"] > 0
    msgs = []
    for eng in ("numpy", "fast"):
        with pytest.raises(ValueError, match="prefetch off") as e:
            simulate(stream, SimOptions(policy="belady", engine=eng, prefetch=True,
                                        budget_bytes=stream.kv_bytes // 4))  # fmt: skip
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


def test_an_integer_module_must_say_its_q16_score() -> None:
    import types

    from kvcxl.emu.sim.fast import hooks
    from kvcxl.emu.sim.fast.policies import ema_int

    mod = types.ModuleType("kvcxl_test_int_module")
    for name in hooks.REQUIRED:
        setattr(mod, name, getattr(ema_int, name))
    with pytest.raises(TypeError, match="score_q16"):
        hooks.check(mod)
    mod.score_q16 = ema_int.score_q16
    hooks.check(mod)


def test_a_queue_module_keeps_its_keys_to_its_touches() -> None:
    """A QUEUE module's victims come from its touches alone: a step-end hook, a selection
    of its own or a score (managed tiers' layers) would move keys behind the queue."""
    import types

    from kvcxl.emu.sim.fast import hooks
    from kvcxl.emu.sim.fast.policies import ema, lru

    mod = types.ModuleType("kvcxl_test_queue_module")
    for name in (*hooks.REQUIRED, "QUEUE"):
        setattr(mod, name, getattr(lru, name))
    hooks.check(mod)
    mod.TOUCH = True
    hooks.check(mod)
    mod.QUEUE = False  # TOUCH only defers a queue's keys
    with pytest.raises(TypeError, match="TOUCH but not a QUEUE"):
        hooks.check(mod)
    mod.QUEUE = True
    mod.end_step = ema.end_step
    with pytest.raises(TypeError, match="QUEUE but has end_step"):
        hooks.check(mod)
