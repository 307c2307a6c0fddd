"""`kvcxl bench --only sim_s1_users`: S1's shape with users, its figures and the user
count it refuses for memory (the quick sizes: S1 at 16 K tokens, 1 and 2 users)."""

from __future__ import annotations

import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim import bench


@pytest.mark.slow
def test_s1_users_reports_rates_and_bytes_and_refuses_what_does_not_fit(monkeypatch) -> None:
    # 2 users are refused when 80 % of what is available is less than the estimate.
    monkeypatch.setattr(bench, "_available", lambda: 10_000_000)
    out = bench.benches()["sim_s1_users"](True)
    entries = PRESETS["s1"].with_(context_tokens=16384).entries_per_context
    assert out["users1_entries"] == entries and out["users2_entries"] == 2 * entries
    for read in ("dense", "topk"):
        for policy in ("lru", "ema"):
            for pct in (10, 25):
                key = f"users1_{read}_{policy}_budget{pct}"
                assert out[f"{key}_entry_reads_per_s"] > 0, key
                # (0 is a true reading: a replay may reuse pages an earlier one freed)
                assert 0 <= out[f"{key}_bytes_per_entry"] < 10_000, key
                assert 0 <= out[f"{key}_hit_rate_simulated"] <= 1, key
                # generate_s and the ratio are rounded to 0.01 (and replay_s to 1e-4)
                gen, dt = out[f"users1_{read}_generate_s"], out[f"{key}_replay_s"]
                ratio = out[f"{key}_generate_over_replay"]
                assert dt > 0 and abs(ratio * dt - gen) <= 0.006 + 0.006 * dt, key
                # the whole replay: its prompt's writes and its decode steps
                whole = out[f"{key}_replay_whole_s"]
                assert abs(whole - dt - out[f"{key}_prompt_s"]) <= 0.006, key
                ratio = out[f"{key}_generate_over_whole_replay"]
                assert abs(ratio * whole - gen) <= 0.006 + 0.006 * whole, key
    assert "users2_dense_lru_budget10_entry_reads_per_s" not in out
    assert (
        out["users2_not_run"].startswith("needs about ")
        and "0.0 GB available" in out["users2_not_run"]
    )
    assert out["users1_peak_rss_bytes"] > 0 and out["users1_dense_stream_bytes_per_entry"] > 0
