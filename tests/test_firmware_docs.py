"""docs/policy.md stays what the code is: its parameter table is generated from PARAMS."""

from __future__ import annotations

from pathlib import Path

from kvcxl.cli.main import main
from kvcxl.cli.policy import params_markdown
from kvcxl.firmware.policies import POLICIES

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
    # every registered policy at every capacity is either run or reported as not run
    # with its reason (S3-FIFO's small queue is 6 × 0.1 < 1 entry at the smallest)
    not_run = {(r["policy"], r["capacity"]): r["reason"] for r in data["not_run"]}
    caps = sorted({c for _, c in by} | {c for _, c in not_run})
    assert caps == [6, 15, 30, 60]
    assert set(by) | set(not_run) == {(p, c) for p in POLICIES for c in caps}
    assert list(not_run) == [("s3fifo", 6)]
    assert "6 × s3fifo_small_ratio=0.1 = 0.6 entries" in not_run[("s3fifo", 6)]
    assert "not run: s3fifo at capacity 6" in capsys.readouterr().out
    for (pol, cap), h in by.items():
        assert by[("belady", cap)] >= h, pol
