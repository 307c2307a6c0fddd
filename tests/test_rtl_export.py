"""Verilog export, layouts shared with the testbench, CLI errors, FuseSoC file."""

from __future__ import annotations

import random
import subprocess

import pytest

pytestmark = pytest.mark.hdl


def test_pack_unpack_round_trip_on_every_layout():
    from kvcxl.rtl import layouts as L

    rng = random.Random(7)
    for lay in (
        L.update_layout(4),
        L.scored_group_layout(4, 2),
        L.record_write_layout(3, 5),
        L.victim_layout(10),
        L.table_write_layout(),
    ):
        for _ in range(50):
            bits = rng.getrandbits(lay.size)
            value = L.unpack(lay, bits)
            assert L.pack(lay, value) == bits
            assert L.unpacker(lay)(bits) == value


def test_pack_refuses_a_value_that_does_not_fit():
    from kvcxl.rtl import layouts as L

    with pytest.raises(ValueError, match="does not fit"):
        L.pack(L.table_write_layout(), {"addr": 256, "data": 0})


def test_widths_come_from_the_fixed_point_contract():
    from kvcxl.firmware import fixedpoint as fx
    from kvcxl.rtl import layouts as L

    rec = L.record_layout()
    assert rec["score"].width == fx.FRAC_BITS and rec["idle"].width == fx.IDLE_BITS
    assert L.table_write_layout()["addr"].width == fx.DECAY_TABLE_BITS


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [({"entries": 10, "lanes": 4}, "multiple of lanes"), ({"entries": 0, "lanes": 1}, "multiple")],
)
def test_bad_shapes_are_refused(kwargs, msg):
    from kvcxl.rtl.scoring import ScoringEngine

    with pytest.raises(ValueError, match=msg):
        ScoringEngine(**kwargs)


def test_unknown_defect_is_refused():
    from kvcxl.rtl.eviction import EvictionEngine

    with pytest.raises(ValueError, match="defect"):
        EvictionEngine(8, 1, 4, defect="nonsense")


def test_cli_verilog_writes_lint_clean_verilog_and_core_file(tmp_path):
    from kvcxl.cli.main import main
    from kvcxl.rtl import toolchain

    assert (
        main(
            [
                "rtl",
                "verilog",
                "-o",
                str(tmp_path),
                "--entries",
                "64",
                "--lanes",
                "4",
                "--batch",
                "8",
            ]
        )
        == 0
    )
    v = tmp_path / "policy_core.v"
    assert "module policy_core" in v.read_text()
    assert "kvcxl:policy:core" in (tmp_path / "kvcxl_rtl.core").read_text()
    if toolchain.which("verilator") is None:
        pytest.skip("verilator not installed")
    r = subprocess.run(
        [
            "verilator",
            "--lint-only",
            "-Wno-fatal",
            "-Wno-WIDTHEXPAND",
            "-Wno-WIDTHTRUNC",
            "--top-module",
            "policy_core",
            str(v),
        ],
        env=toolchain.tool_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_cli_refuses_entries_not_multiple_of_lanes(tmp_path, capsys):
    from kvcxl.cli.main import main

    assert main(["rtl", "verilog", "-o", str(tmp_path), "--entries", "10", "--lanes", "4"]) == 2
    assert "multiple" in capsys.readouterr().err


def test_cli_verilog_top(tmp_path):
    from kvcxl.cli.main import main

    argv = ["rtl", "verilog", "--design", "top", "-o", str(tmp_path), "--lanes", "2"]
    assert main(argv) == 0
    text = (tmp_path / "policy_engine.v").read_text()
    assert "module policy_engine" in text and "req__payload" in text and "drs__payload" in text
