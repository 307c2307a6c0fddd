"""Scenario S1's analytic sizing (Analytical model, docs/design.md) and model-shape validation."""

from __future__ import annotations

import pytest

from kvcxl.emu.shape import GB, GIB, PRESETS, Deployment, ModelShape, ShapeError, preset, sizing


def test_s1_sizing_matches_seed():
    r = sizing(PRESETS["s1"], Deployment(users=8))
    assert r["evidence"] == "Analytical model"
    assert r["kv_bytes_per_token"] == 327_680 and r["kv_kib_per_token"] == 320
    assert r["block_mib"] == 5.0
    assert r["entry_bytes"] == 8 * 1024
    assert r["context_bytes"] == 40 * GIB
    assert r["entries_per_context"] == 80 * 8 * 8192 == 5_242_880
    assert r["kv_head_queues"] == 640
    assert round(r["hbm_needed_gb"]) == 489
    assert r["hbm_needed_gb_seed_rounding"] == 489
    assert r["hbm_kv_budget_bytes"] == 47 * GB and r["hbm_evictable_bytes"] == 37 * GB


def test_overrides_and_errors():
    s = preset("s1").with_(kv_heads=64, q_heads=64)
    assert s.kv_bytes_per_token == 8 * 327_680  # MHA: kv_heads is the decisive term
    with pytest.raises(ShapeError, match="q_heads = 6 must be a multiple of kv_heads = 4"):
        ModelShape(q_heads=6, kv_heads=4)
    with pytest.raises(ShapeError, match="d_head = 0 is out of range"):
        preset("ci").with_(d_head=0)
    with pytest.raises(ShapeError, match="unknown preset 'gpt5'"):
        preset("gpt5")
    with pytest.raises(ShapeError, match="users = 0"):
        sizing(PRESETS["ci"], Deployment(users=0))
