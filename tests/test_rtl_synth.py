"""FPGA synthesis through YoWASP: resources and Fmax are parsed from nextpnr's report."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.hdl]


def test_synth_ecp5_reports_resources_and_fmax(tmp_path):
    from kvcxl.cli.main import main

    out = tmp_path / "ecp5.json"
    argv = [
        "rtl",
        "synth",
        "--target",
        "ecp5",
        "--entries",
        "256",
        "--lanes",
        "1",
        "--batch",
        "16",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["evidence"] == "Measured"
    assert 0 < r["luts"] <= r["luts_available"] and 0 < r["ffs"] <= r["ffs_available"]
    assert r["brams"] >= 1  # the record memory and the decay table live in block RAM
    assert r["dsps"] >= 1  # the EMA and priority products
    assert 1 < r["fmax_mhz"] < 500
    assert r["timing_met"] == (r["fmax_mhz"] >= r["target_mhz"])
    # Analytical model: one entry per lane per cycle at the measured Fmax.
    assert abs(r["entry_updates_per_s"] - r["fmax_mhz"] * 1e6) < 1e4
    # The reported critical path is the one that sets Fmax.
    cp = r["critical_path"]
    assert cp["from"] and cp["to"] and 0 < cp["logic_ns"] <= cp["delay_ns"]
    assert 1000 / cp["delay_ns"] == pytest.approx(r["fmax_mhz"], rel=0.05)


def test_synth_ice40_fits_a_small_core():
    from kvcxl.rtl.synth import SynthConfig, run

    r = run(SynthConfig(target="ice40", entries=64, lanes=1, batch=8))
    assert 0 < r["luts"] <= r["luts_available"]
    assert r["wrapper_ffs"] > 0 and r["fmax_mhz"] > 1


def test_bad_target_is_refused():
    from kvcxl.rtl.synth import SynthConfig, run

    with pytest.raises(ValueError, match="target"):
        run(SynthConfig(target="virtex"))


def test_bench_synthesises_each_lane_count_on_the_85f():
    """The quick `kvcxl bench` run: 1 and 2 lanes on the ECP5-85F (the full run adds 4, 8
    and 16; docs/rtl.md has its figures)."""
    from kvcxl.rtl.bench import LANES_QUICK, benches

    r = benches()["rtl_synth_per_lanes"](True)
    assert r["evidence"] == "Measured" and list(r["lanes"]) == [str(n) for n in LANES_QUICK]
    for n in LANES_QUICK:
        f = r["lanes"][str(n)]
        # Three products per lane (α·w, (1−α)·score, priority), each in one 18×18 DSP.
        assert f["dsps"] == 3 * n, f
        assert f["dsps_available"] == 156  # the 85F's MULT18X18D count: the right device
        assert 1 < f["fmax_mhz"] < 500
        assert abs(f["entry_updates_per_s"] - n * f["fmax_mhz"] * 1e6) < 1e4 * n
    # (no FF order between 1 and 2 lanes: one lane's top-k is systolic, a register per
    # slot, where more lanes broadcast each candidate to every slot; docs/rtl.md)
