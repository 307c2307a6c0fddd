"""The EMA's own rules as parameters (firmware/policies/ema.py): ``ema_tie_break`` and
``ema_touch_resets_idle``.

Their defaults are the seed's policy as kvcxl ran it (the contract's id tie-break, a touch
zeroes idle); each other value is audited from history (the audit's tie-aware top-k and
its recomputation of the tie key), refused in the Q0.16 mode, and replayed equal by the
fast engine (:mod:`kvcxl.emu.sim.fast.policies.ema_rules`), victim for victim, below."""

from __future__ import annotations

import numpy as np
import pytest
from test_sim_fast import _both, assert_same

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import make_policy
from kvcxl.firmware.policies.base import Tick
from kvcxl.firmware.select import reference_order, select_victims
from kvcxl.firmware.table import EntryTable

VARIANTS = [
    {"ema_tie_break": "last-touch"},
    {"ema_tie_break": "score"},
    {"ema_tie_break": "age"},
    {"ema_touch_resets_idle": False},
    {"ema_touch_resets_idle": False, "ema_tie_break": "last-touch", "persistent_metadata": False},
]


def _run(engine: str = "numpy", **cfg: object) -> dict:
    stream = compile_workload(make_workload("zipf-sessions", PRESETS["ci"], seed=2), 24)
    opts = SimOptions(policy="ema", budget_bytes=stream.kv_bytes // 10, engine=engine,
                      record_victims=True, audit=engine == "numpy",
                      config=PolicyConfig.from_mapping(cfg))  # fmt: skip
    return simulate(stream, opts)


def _victims(r: dict) -> np.ndarray:
    return np.concatenate([v[0] for v in r["_victims"]])


def test_the_defaults_are_the_seeds_ema() -> None:
    seed = _run()
    named = _run(ema_tie_break="id", ema_touch_resets_idle=True)
    assert np.array_equal(_victims(seed), _victims(named)) and seed["hits"] == named["hits"]


@pytest.mark.parametrize("cfg", VARIANTS, ids=[str(sorted(c.items())) for c in VARIANTS])
def test_each_variant_moves_victims_and_passes_the_audit(cfg: dict) -> None:
    seed, r = _run(), _run(**cfg)
    assert not np.array_equal(_victims(seed), _victims(r))
    assert r["audited_victims"] > 0 and r["history_checked"] > 0
    assert r["audit_faults"] == 0, r


def test_selection_ranks_equal_priorities_by_the_tie_key_then_id() -> None:
    ids = np.arange(8)
    prio = np.array([0.5, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0])
    tie = np.array([0, 5, 3, 3, 0, 1, 9, 2])
    want = [4, 0, 5, 7, 2, 3, 1, 6]
    assert reference_order(ids, prio, tie).tolist() == want
    for k in range(1, 9):
        got = select_victims(ids, prio, k, tie=tie)
        assert got.tolist() == want[:k]
        assert sorted(select_victims(ids, prio, k, ordered=False, tie=tie)) == sorted(want[:k])
    assert reference_order(ids, prio).tolist() == [4, 0, 1, 2, 3, 5, 6, 7]


def test_the_policys_tie_keys_are_the_documented_quantities() -> None:
    table = EntryTable(block_tokens=16, capacity=16)
    table.append(np.zeros(4), np.zeros(4), np.zeros(4), np.arange(4) + 10)
    for tie, want in (("last-touch", [-1, 3, 1, -1]), ("age", [0, 0, 2, 2]),
                      ("score", None)):  # fmt: skip
        p = make_policy("ema", PolicyConfig.from_mapping({"ema_tie_break": tie}), table)
        p.ensure(4)
        p.on_insert(np.array([0, 1]), Tick(0, 0))
        p.on_insert(np.array([2, 3]), Tick(0, 2))
        p.on_access(np.array([2, 1]), np.array([0.5, 0.02]), Tick(0, 1))
        p.on_access(np.array([1, 3]), np.array([0.3, 0.001]), Tick(0, 3))  # 3: not a touch
        p.end_step(Tick(0, 3))
        if want is None:  # the lowest score first: the EMA after the step
            want = p.score_[:4].tolist()
        assert p.tie(np.arange(4), Tick(1, 4)).tolist() == want, tie


def test_no_touch_zeroes_idle_when_switched_off_an_admission_does() -> None:
    table = EntryTable(block_tokens=16, capacity=16)
    table.append(np.zeros(2), np.zeros(2), np.zeros(2), np.arange(2) + 10)
    cfg = PolicyConfig.from_mapping({"ema_touch_resets_idle": False})
    p = make_policy("ema", cfg, table)
    p.ensure(2)
    p.on_insert(np.array([0, 1]), Tick(0, 0))
    for k in range(5):
        p.on_access(np.array([0]), np.array([0.9]), Tick(k, k))
        p.end_step(Tick(k, k))
    assert p.idle_steps(np.arange(2)).tolist() == [4, 4]  # steps since the admission
    p.on_insert(np.array([1]), Tick(5, 5))
    p.end_step(Tick(5, 5))
    assert p.idle_steps(np.arange(2)).tolist() == [5, 0]


@pytest.mark.parametrize(
    ("cfg", "named"),
    [({"ema_tie_break": "age"}, "ema_tie_break = 'age'"),
     ({"ema_touch_resets_idle": False}, "ema_touch_resets_idle = False")],
)  # fmt: skip
def test_the_q16_mode_refuses_a_rule_outside_the_contract(cfg: dict, named: str) -> None:
    table = EntryTable(block_tokens=16, capacity=16)
    with pytest.raises(ValueError, match=named + " is not in the Q0.16 contract"):
        make_policy("ema", PolicyConfig.from_mapping(cfg), table, mode="int")
    make_policy("ema", PolicyConfig(), table, mode="int")  # the defaults are the contract


def test_a_family_member_without_the_parameters_keeps_the_seeds_rules() -> None:
    """ema-floor does not declare them: a configured tie-break does not reach it."""
    cfg = PolicyConfig.from_mapping({"ema_tie_break": "score"})
    table = EntryTable(block_tokens=16, capacity=16)
    p = make_policy("ema-floor", cfg, table)
    assert p.tie(np.arange(2), Tick(0, 0)) is None


# Each value off its default, with the replay's other paths: per-request batches, managed
# tiers' layers with a CXL DRAM that fills, no persistence, batched passes.
ENGINE_CASES = [
    *({"ema_tie_break": t} for t in ("last-touch", "score", "age")),
    {"ema_touch_resets_idle": False},
    {"ema_touch_resets_idle": False, "ema_tie_break": "score", "persistent_metadata": False},
    {"ema_tie_break": "age", "eviction_passes": "batched", "tier_management": "static"},
]


@pytest.mark.parametrize("cfg", ENGINE_CASES, ids=[str(sorted(c.items())) for c in ENGINE_CASES])
@pytest.mark.parametrize("granularity", ["layer", "request"])
def test_both_engines_choose_the_same_victims(cfg: dict, granularity: str) -> None:
    stream = compile_workload(make_workload("multi-turn", PRESETS["ci"], seed=3), 16)
    kv = stream.kv_bytes
    a, b = _both(
        stream, policy="ema", granularity=granularity, budget_bytes=kv // 8, cxl_bytes=kv // 20,
        config=PolicyConfig.from_mapping(cfg),
    )  # fmt: skip
    assert a["cache"]["evictions"] > 0
    assert_same(a, b, f"ema {cfg} {granularity}")
