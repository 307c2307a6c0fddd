"""docs/policy.md stays what the code is: its parameter table is generated from PARAMS."""

from __future__ import annotations

from pathlib import Path

from kvcxl.emu.cli import main
from kvcxl.firmware.commands import params_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "policy.md"


def test_parameter_table_matches_the_code():
    assert params_markdown() in DOC.read_text()


def test_policy_cli(tmp_path, capsys):
    f = tmp_path / "p.toml"
    assert main(["policy", "write-default", str(f)]) == 0
    assert main(["policy", "check", str(f)]) == 0
    f.write_text("[policy]\nalpha = 2.0\n")
    assert main(["policy", "check", str(f)]) == 2
    assert "alpha = 2.0 is out of range: must be (0, 1]" in capsys.readouterr().err
    out = tmp_path / "c.json"
    assert (
        main(["policy", "compare", "--requests", "2000", "--objects", "300", "--json", str(out)])
        == 0
    )
    import json

    data = json.loads(out.read_text())
    assert data["evidence"] == "Simulated"
    assert all(r["wrong_victims"] == 0 for r in data["results"])
    by = {(r["policy"], r["capacity"]): r["hit_rate"] for r in data["results"]}
    for (pol, cap), h in by.items():
        assert by[("belady", cap)] >= h, pol
