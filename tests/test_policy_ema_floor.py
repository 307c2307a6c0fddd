"""ema-floor: the seed's EMA with a floor under recency (firmware/policies/ema_floor.py).

Its own file per engine and this test are all it took (the registry, the audit, the fast
engine's composer and every list of ranked policies find it); tests/test_sim_fast.py
replays it on both engines with every other covered policy."""

from __future__ import annotations

import math

import numpy as np

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES, ranked
from kvcxl.firmware.policies.ema_floor import floored_priority


def _run(policy: str, engine: str, **cfg: object) -> dict:
    stream = compile_workload(make_workload("zipf-sessions", PRESETS["ci"], seed=2), 24)
    opts = SimOptions(policy=policy, budget_bytes=stream.kv_bytes // 10, engine=engine,
                      record_victims=True, audit=engine == "numpy",
                      config=PolicyConfig.from_mapping(cfg))  # fmt: skip
    return simulate(stream, opts)


def _victims(r: dict) -> np.ndarray:
    return np.concatenate([v[0] for v in r["_victims"]])


def test_the_floored_priority_is_the_documented_formula() -> None:
    """(1 − s)·max(1 − e^(−β·idle), floor), written here from the docstring."""
    for s, idle, beta, floor in [(0.3, 0, 0.001, 0.05), (0.3, 200, 0.001, 0.05),
                                 (0.9, 3, 0.5, 0.0), (0.0, 0, 0.1, 1.0)]:  # fmt: skip
        want = (1 - s) * max(1 - math.exp(-beta * idle), floor)
        got = float(floored_priority(np.array([s]), np.array([idle]), beta, floor)[0])
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15)


def test_floor_zero_is_the_seeds_ema_and_a_floor_reorders_touched_entries() -> None:
    seed = _run("ema", "numpy")
    zero = _run("ema-floor", "numpy", ema_floor=0.0)
    assert np.array_equal(_victims(seed), _victims(zero))
    floored = _run("ema-floor", "numpy", ema_floor=0.05)
    assert not np.array_equal(_victims(seed), _victims(floored))
    for r in (zero, floored):  # the audit recomputes it from history: no fault
        assert r["audited_victims"] > 0 and r["history_checked"] > 0
        assert r["audit_faults"] == 0


def test_the_fast_engine_replays_it_equal_to_the_numpy_engine() -> None:
    a, b = _run("ema-floor", "numpy", ema_floor=0.05), _run("ema-floor", "fast", ema_floor=0.05)
    assert b["engine"] == "fast"
    assert np.array_equal(_victims(a), _victims(b)) and a["hits"] == b["hits"]


def test_it_joins_the_rankings_by_its_file() -> None:
    assert "ema-floor" in ranked() and POLICIES["ema-floor"].history is not None
