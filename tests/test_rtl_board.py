"""The board top and its UART host link.

End to end: the host driver (kvcxl.rtl.host, the code `kvcxl rtl host --port DEV` runs)
opens the pseudo-terminal of the Verilated board top, whose harness turns bytes into UART
frames; the victims it reads back must equal the firmware's integer mode
(kvcxl.firmware.fixedpoint + select) for the same records, pass after pass.  Bitstreams for
both boards are built and read back by the YoWASP unpackers.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("amaranth")
pytest.importorskip("serial")

ROOT = Path(__file__).resolve().parents[1]


def test_the_protocol_table_is_one_table() -> None:
    from kvcxl.rtl import board

    ops = [c.opcode for c in board.COMMANDS]
    assert len(set(ops)) == len(ops)
    assert len(set(board.STATUS.values())) == len(board.STATUS)
    shape = board.EngineShape(64, 4, 8)
    lay = shape.layouts()
    for c in board.COMMANDS:
        for name in (c.request, c.reply):
            assert name is None or name in lay
    # docs/rtl.md shows the table as generated.
    assert board.markdown_table() in (ROOT / "docs" / "rtl.md").read_text()
    # The command line offers exactly the boards of BOARDS (it lists them without amaranth).
    from kvcxl.cli.main import build_parser

    rtl = build_parser()._subparsers._group_actions[0].choices["rtl"]
    bit = rtl.get_default("rtl_actions").choices["bitstream"]
    (board_opt,) = [a for a in bit._actions if a.dest == "board"]
    assert set(board_opt.choices) == set(board.BOARDS)


def test_a_port_that_is_not_a_board_fails_cleanly(capsys) -> None:
    """loop:// echoes the info opcode back: not a protocol status; one line, exit 1."""
    from kvcxl.cli.main import main

    code = main(["rtl", "host", "--port", "loop://", "--timeout", "0.2"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1 and len(err) == 1, err
    assert "info" in err[0] and "0x49" in err[0] and "Traceback" not in err[0]


def test_a_missing_device_fails_cleanly(capsys) -> None:
    from kvcxl.cli.main import main

    code = main(["rtl", "host", "--port", "/dev/kvcxl-no-such-tty"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1 and len(err) == 1 and "/dev/kvcxl-no-such-tty" in err[0], err


@pytest.mark.slow
@pytest.mark.hdl
@pytest.mark.parametrize(("entries", "lanes", "batch"), [(48, 1, 8), (64, 4, 5)])
def test_the_host_driver_reads_the_firmwares_victims(entries, lanes, batch, tmp_path) -> None:
    """The real driver over a pty against the Verilated board top, checked pass by pass."""
    from kvcxl.rtl import board, board_sim, host

    shape = board.EngineShape(entries, lanes, batch)
    with board_sim.serve(shape, root=tmp_path) as pty:
        link = host.Link(host.open_port(pty, timeout=5.0))
        res = host.run_script(link, steps=6, seed=3, check=True)
        # A second session on the same board: the parameters set last time are replaced.
        again = host.run_script(host.Link(host.open_port(pty)), steps=2, seed=4, check=True)
    assert res["mismatches"] == 0, res["first_mismatches"]
    assert again["mismatches"] == 0, again["first_mismatches"]
    assert res["shape"] == {"entries": entries, "lanes": lanes, "batch": batch}
    assert res["victims_per_pass"] == [batch] * 6  # enough eligible entries: k victims a pass
    # Every command was answered: records, table, params, sweep beats, victim polls.
    assert res["commands"] >= 1 + 1 + 256 + shape.groups * 7 + res["victims"]


@pytest.mark.slow
@pytest.mark.hdl
def test_a_wrong_engine_is_caught_by_the_check(tmp_path, monkeypatch) -> None:
    """The tie-break defect built into the board's eviction engine: --check must see it."""
    from kvcxl.rtl import board, board_sim, host
    from kvcxl.rtl.core import PolicyCore

    class Defective(PolicyCore):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw, defect="tie_off_by_one")

    monkeypatch.setattr(board, "PolicyCore", Defective)
    shape = board.EngineShape(32, 1, 8)
    with board_sim.serve(shape, root=tmp_path) as pty:
        res = host.run_script(host.Link(host.open_port(pty)), steps=6, seed=3, check=True)
    assert res["mismatches"] > 0


@pytest.mark.slow
@pytest.mark.hdl
@pytest.mark.parametrize("name", ["icebreaker", "ulx3s-85f"])
def test_the_bitstream_builds_and_reads_back(name, tmp_path) -> None:
    from kvcxl.cli.main import main
    from kvcxl.rtl.board import BOARDS

    out = tmp_path / "json"
    assert main(["rtl", "bitstream", "--board", name, "-o", str(tmp_path), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["evidence"] == "Measured"
    bit = Path(r["bitstream"])
    assert bit.exists() and bit.stat().st_size == r["bitstream_bytes"] > 10_000
    # build() read it back with the family's unpacker and compared it with nextpnr's output.
    unpacked = Path(r["unpacked"]).read_text()
    assert unpacked.startswith(".device") if name == "ulx3s-85f" else ".logic_tile" in unpacked
    assert (
        ("equal to nextpnr" in r["readback"])
        if name == "icebreaker"
        else "LFE5U-85F" in (r["readback"])
    )
    assert r["shape"] == asdict(BOARDS[name].shape)
    for k in ("luts", "ffs", "brams", "dsps"):
        assert r[k] >= 1, k
        assert r[f"{k}_available"] is None or r[k] <= r[f"{k}_available"]
    assert r["brams"] >= 2  # the record memory and the decay table
    assert 1 < r["fmax_mhz"] < 500
    assert r["timing_met"] == (r["fmax_mhz"] >= r["clock_mhz"])
    assert r["uart_divisor"] == round(r["clock_mhz"] * 1e6 / BOARDS[name].baud)
