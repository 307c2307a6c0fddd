"""The fast engine under the tier rules of docs/policy.md, against the numpy engine.

``eviction_passes = "batched"`` (passes of ``eviction_batch``, the last may over-evict),
``cxl_order = "policy"`` (CXL DRAM's overflow goes down by the policy's own order) and
``tier_management = "managed"`` (threshold and weighted placement: eviction layers and the
step boundary's background moves), alone and together, with their parameters varied:
every policy and mode the fast engine covers, several HBM budgets and CXL DRAM sizes,
every granularity, with and without persistent metadata.  The whole result dict must be
equal, and so must the victims, in order, with their priorities and steps
(tests/test_sim_fast.py's ``assert_same``).  The numpy engine is held to the docs by
tests/test_sim_differential_tiers.py (the reference engine) and tests/test_policy_params_live.py.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from kvcxl.emu.sim import fast
from kvcxl.emu.sim.simulator import GRANULARITIES, SimOptions, simulate
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.policies.queued import QueuePolicy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sim_fast import SHAPE, _both, assert_same

COVERED = sorted(fast.POLICY_CODES)
STATIC = {"tier_management": "static", "cxl_order": "fifo"}  # the comparison baseline
MODES: dict[str, dict[str, Any]] = {
    "static": STATIC,
    "cxl-policy": {"tier_management": "static", "cxl_order": "policy"},
    "cxl-policy-volatile": {"tier_management": "static", "cxl_order": "policy",
                            "persistent_metadata": False},
    "managed": {"tier_management": "managed", "evict_threshold": 0.05},
    "managed-keep": {"tier_management": "managed", "keep_threshold": 0.3,
                     "evict_threshold": 0.01, "background_moves": 2},
    # scores spread below evict_threshold, one move a boundary: the sink order decides
    "managed-sink-order": {"tier_management": "managed", "evict_threshold": 0.09,
                           "keep_threshold": 0.3, "background_moves": 1, "alpha": 0.3},
    "managed-still": {"tier_management": "managed", "background_moves": 0,
                      "persistent_metadata": False},
    "weighted": {"tier_management": "managed", "placement_mode": "weighted",
                 "placement_cuts": (0.5, 0.7)},
    "weighted-slow": {"tier_management": "managed", "placement_mode": "weighted",
                      "background_moves": 3, "cxl_order": "policy",
                      "placement_weights": (0.5, 0.3, 0.2), "beta": 0.1},
    "weighted-anchor": {"tier_management": "managed", "placement_mode": "weighted",
                        "placement_weights": (0.1, 0.3, 0.6), "placement_cuts": (0.2, 0.5),
                        "anchor_zone_size": 64, "pinned_fraction": 0.0},
    "batched": {"eviction_passes": "batched", "eviction_batch": 3},
    "batched-1": {"eviction_passes": "batched", "eviction_batch": 1,
                  "persistent_metadata": False},
    "batched-wide": {"eviction_passes": "batched", "eviction_batch": 64},
    "all": {"tier_management": "managed", "cxl_order": "policy", "eviction_passes": "batched",
            "eviction_batch": 5, "evict_threshold": 0.05, "keep_threshold": 0.2},
    "all-weighted": {"tier_management": "managed", "placement_mode": "weighted",
                     "cxl_order": "policy", "eviction_passes": "batched", "eviction_batch": 2,
                     "background_moves": 8},
}  # fmt: skip
WORKLOADS = ("multi-turn", "zipf-sessions")


def _stream(workload: str) -> Any:
    return compile_workload(make_workload(workload, SHAPE, seed=3), 10, read="dense")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("workload", WORKLOADS)
def test_tier_rules_replay_identically(workload: str, mode: str) -> None:
    stream = _stream(workload)
    kv = stream.kv_bytes
    cfg = PolicyConfig.from_mapping(MODES[mode])
    k = 0
    for policy, pmode in COVERED:
        for gran in GRANULARITIES:
            k += 1
            budget = (0.1, 0.25, 0.4)[k % 3]
            cxl = (kv // 20, None, kv // 8)[(k // 3) % 3]
            a, b = _both(
                stream, policy=policy, mode=pmode, granularity=gran, warmup_steps=k % 2,
                budget_bytes=int(kv * budget), cxl_bytes=cxl, config=cfg,
            )  # fmt: skip
            assert_same(a, b, f"{workload} {mode} {policy}/{pmode} {gran} {budget} {cxl}")


def test_the_rules_are_replayed_not_ignored() -> None:
    """Each mode changes some replay of the test above (else its equality proves nothing):
    the numpy engine's results under the mode differ from the static baseline's."""
    stream = _stream("multi-turn")
    kv = stream.kv_bytes
    unchanged = []
    for mode, params in MODES.items():
        if params is STATIC:
            continue
        changed = False
        for policy in ("ema", "lru"):
            for gran in ("layer", "step"):
                kw = dict(policy=policy, granularity=gran, budget_bytes=kv // 10,
                          cxl_bytes=kv // 20, engine="numpy")  # fmt: skip
                base = simulate(stream, SimOptions(**kw, config=PolicyConfig.from_mapping(STATIC)))
                cfg = {**STATIC, **params, "persistent_metadata": True}
                if params.get("persistent_metadata") is False:
                    base = simulate(stream, SimOptions(**kw, config=PolicyConfig.from_mapping(
                        {**STATIC, "persistent_metadata": False})))  # fmt: skip
                    cfg = {**STATIC, **params}
                got = simulate(stream, SimOptions(**kw, config=PolicyConfig.from_mapping(cfg)))
                keys = ("cache", "bytes_moved", "hits", "occupancy_end")
                changed |= any(got[key] != base[key] for key in keys)
        if not changed:
            unchanged.append(mode)
    assert not unchanged, f"modes that change nothing here: {unchanged}"


@pytest.mark.parametrize("mode", ["cxl-policy", "managed", "weighted", "batched"])
def test_the_modes_run_on_the_fast_engine(mode: str) -> None:
    """No refusal left for the tier rules: the default engine choice is the fast one."""
    opts = SimOptions(policy="ema", config=PolicyConfig.from_mapping(MODES[mode]))
    assert fast.unsupported(opts) is None


def test_queue_policies_run_every_tier_rule_and_keep_cxl_dram_in_arrival_order() -> None:
    """The queue policies replay every tier rule on the fast engine (the replays above);
    their order is a walk over HBM's queues, so under cxl_order = "policy" CXL DRAM keeps
    its arrival order (docs/policy.md): the numpy engine's results equal fifo's, while
    the EMA's differ (so the comparison can tell the two orders apart)."""
    queued = [p for p, _m in COVERED if issubclass(POLICIES[p], QueuePolicy)]
    assert sorted(queued) == ["arc", "clock", "s3fifo", "sieve", "slru", "wtinylfu"]
    stream = _stream("multi-turn")
    kv = stream.kv_bytes

    def run(policy: str, order: str) -> dict:
        cfg = PolicyConfig.from_mapping({"cxl_order": order})
        opts = SimOptions(policy=policy, budget_bytes=kv // 10, cxl_bytes=kv // 20,
                          config=cfg, engine="numpy", record_victims=True)  # fmt: skip
        assert fast.unsupported(opts) is None, policy
        return simulate(stream, opts)

    for policy in queued:
        assert_same(run(policy, "policy"), run(policy, "fifo"), f"{policy}: policy vs fifo")
    ema_policy, ema_fifo = run("ema", "policy"), run("ema", "fifo")
    assert ema_policy["misses_cxl"] != ema_fifo["misses_cxl"] or (
        ema_policy["misses_nvme"] != ema_fifo["misses_nvme"]
    )


@pytest.mark.parametrize("k", [0, 1, 3, 17, 400])
def test_keep_holds_the_k_smallest_pairs_whatever_the_offer_order(k: int) -> None:
    """tiers.keep (the step boundary's bounded selection) against a sort of every offer:
    the same set of (key, id) pairs, with many equal keys so that the id decides."""
    import numpy as np

    from kvcxl.emu.sim.fast import tiers as T

    rng = np.random.default_rng(k)
    for _ in range(3):
        n = 300
        key = rng.integers(-5, 5, n).astype(np.int64)  # (ties everywhere)
        ids = rng.permutation(n).astype(np.int64)
        hk, hi = np.zeros(n, np.int64), np.zeros(n, np.int64)
        m = 0
        for j in range(n):
            m = T.keep(hk, hi, m, k, key[j], ids[j])
        want = sorted(zip(key.tolist(), ids.tolist(), strict=True))[:k]
        assert sorted(zip(hk[:m].tolist(), hi[:m].tolist(), strict=True)) == want
