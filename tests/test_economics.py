"""The design's tier economics (docs/design.md, "Tier economics"; Analytical model) equal
the design's own figures, computed from the S1 block and the bracket's bandwidths."""

from __future__ import annotations

import pytest

from kvcxl.emu.economics import forward_ms, tier_economics
from kvcxl.emu.shape import PRESETS

# The design's table, as it prints it: fetch µs per bandwidth, forward ms per MFU.
DESIGN_FETCH_US = {121.0: 43, 64.0: 82, 32.0: 164}
DESIGN_FORWARD_MS = {0.50: 9, 0.40: 11, 0.25: 18}


def test_fetch_and_compute_equal_the_designs_table():
    r = tier_economics(PRESETS["s1"])
    assert r["block_bytes"] == 5 * 2**20  # 16 tokens × 320 KiB
    assert {g: round(us) for g, us in r["fetch_us"].items()} == DESIGN_FETCH_US
    assert {m: round(ms) for m, ms in r["forward_ms"].items()} == DESIGN_FORWARD_MS
    assert r["forward_ms"][0.25] == 17.9


def test_218x_is_one_point_of_a_range():
    r = tier_economics(PRESETS["s1"])
    assert int(r["design_point"]) == 218  # 17.9 ms / 82 µs
    assert r["design_point_unrounded"] == pytest.approx(17.9e3 / 81.92)
    lo, hi = r["regenerate_over_move_min"], r["regenerate_over_move_max"]
    assert lo == pytest.approx(8.95e3 / 163.84)  # 50 % MFU against the 32 GB/s fetch
    assert hi == pytest.approx(17.9e3 / (5 * 2**20 / 121 / 1e3))
    assert lo < r["design_point"] < hi


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="mfu"):
        forward_ms(0.0)
    with pytest.raises(ValueError, match="bandwidths"):
        tier_economics(PRESETS["s1"], (64.0, 0.0))


def test_sizing_command_prints_them(capsys):
    from kvcxl.cli.main import main

    assert main(["sizing", "--preset", "s1"]) == 0
    out = capsys.readouterr().out
    assert "43 / 82 / 164 µs at 121 / 64 / 32 GB/s" in out
    assert "218x is one point" in out
