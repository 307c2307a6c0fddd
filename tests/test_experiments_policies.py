"""The two policies the ablation ladder adds: lru-anchor and ema-position (position-level
tracking).  The history audit (firmware/history.py) recomputes their priorities from each
entry's own history; planted defects must be caught by it."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import make_workload
from kvcxl.emu.workloads.stream import compile_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies.base import Tick
from kvcxl.firmware.policies.ema_position import EmaPositionPolicy
from kvcxl.firmware.policies.lru_anchor import LruAnchorPolicy
from kvcxl.firmware.table import EntryTable


@pytest.fixture(scope="module")
def stream():
    shape = PRESETS["ci"].with_(context_tokens=512)
    return compile_workload(make_workload("zipf-sessions", shape, seed=3), 40, read="topk:4")


def audited(stream, policy, **cfg):
    return simulate(
        stream,
        SimOptions(policy=policy, budget_bytes=stream.kv_bytes // 5, audit=True,
                   config=PolicyConfig.from_mapping(cfg), engine="numpy"),
    )  # fmt: skip


def faults(r):
    keys = ("wrong_victims", "priority_mismatches", "outranked_by_history", "pin_violations")
    return sum(r[k] for k in keys)


def test_position_level_shares_one_score_per_block_position():
    t = EntryTable(block_tokens=16)
    # two layers × two heads of blocks 0 and 1 of context 5
    ids = t.append(5, [[[0]], [[1]]], [[0], [1]], [0, 1]).ravel()
    p = EmaPositionPolicy(PolicyConfig.from_mapping({"alpha": 0.5}), t)
    tick = Tick(0, 0)
    w = np.where(t.block[ids] == 1, 0.0, 0.1)
    w[0] = 0.8  # one head of one layer attends block 0 strongly
    p.on_access(ids, w, tick)
    p.end_step(tick)
    s = p.score(ids)
    # every entry of block 0 carries the position's largest weight: 0.5·0.8
    assert np.allclose(s[t.block[ids] == 0], 0.4) and np.allclose(s[t.block[ids] == 1], 0.0)
    assert len(set(p.priority(ids, tick)[t.block[ids] == 0])) == 1


@pytest.mark.parametrize("persistent", [True, False])
def test_audit_finds_no_fault_on_the_correct_policies(stream, persistent):
    for policy in ("ema-position", "lru-anchor"):
        r = audited(stream, policy, persistent_metadata=persistent)
        assert faults(r) == 0, policy
        assert r["history_checked"] > r["audited_victims"] > 0, policy


def test_planted_summed_position_weights_are_caught(stream, monkeypatch):
    def summed(self, ids, weights, tick):  # sums the heads' weights instead of their max
        self._sync()
        p = self.positions(ids)
        w = np.asarray(weights, dtype=np.float64)
        np.add.at(self.p_w, p, w)
        hit = p[w >= self.config.touch_threshold]
        self.p_touched[hit] = True
        self.p_idle[hit] = 0

    monkeypatch.setattr(EmaPositionPolicy, "on_access", summed)
    r = audited(stream, "ema-position")
    assert r["wrong_victims"] == 0  # invisible to the top-k check
    assert r["priority_mismatches"] > 0


def test_planted_ignored_anchor_is_caught(stream, monkeypatch):
    monkeypatch.setattr(LruAnchorPolicy, "wants_pin", lambda self, ids: np.zeros(len(ids), bool))
    assert audited(stream, "lru-anchor")["pin_violations"] > 0


def test_lru_anchor_on_the_fast_engine_equals_numpy(stream):
    kw = dict(policy="lru-anchor", budget_bytes=stream.kv_bytes // 5, warmup_steps=2)
    a = simulate(stream, SimOptions(engine="numpy", **kw))
    b = simulate(stream, SimOptions(engine="fast", **kw))
    for k in ("hit_rate", "effective_latency_ns", "hits", "misses"):
        assert a[k] == b[k], k


def test_anchor_pinning_changes_lru(stream):
    kw = dict(budget_bytes=stream.kv_bytes // 5)
    a = simulate(stream, SimOptions(policy="lru", **kw))
    b = simulate(stream, SimOptions(policy="lru-anchor", **kw))
    assert a["hits"] != b["hits"]
