"""`kvcxl demo`, the README's first command: the table on the fast engine, the audit on the
sample it names, and the two engines' hits compared on that sample."""

from __future__ import annotations

import json

from kvcxl.cli.main import main
from kvcxl.cli.sim import DEMO_AUDIT_BUDGET, _engines_disagree
from kvcxl.firmware.policies import POLICIES, ranked


def test_the_demo_audits_the_sample_it_names_and_the_engines_agree(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--steps", "24", "--seeds", "2", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "fast engine" in printed and f"every policy at {DEMO_AUDIT_BUDGET} on seed 0" in printed
    doc = json.loads((out / "results.json").read_text())
    # the table: every ranked policy (from the registry) at every budget, unaudited
    assert {r["policy"] for r in doc["results"]} == set(ranked())
    assert all(r["audited_victims"] is None for r in doc["results"])
    sample = doc["audit_sample"]
    assert sample["engines_disagree"] == []
    rows = {r["policy"]: r for r in sample["results"]}
    assert set(rows) == set(ranked())
    for name, r in rows.items():
        assert r["budget"] == DEMO_AUDIT_BUDGET and r["audited_victims"] > 0, name
        assert r["audit_faults"] == 0, name
        # the history part ran exactly for the policies that have a history rule
        assert (r["history_checked"] is not None) == (POLICIES[name].history is not None), name
        # the sample's seed-0 hit rate is in the table's per-seed figures at that budget
        t = next(x for x in doc["results"] if x["policy"] == name and x["budget"] == r["budget"])
        assert t["hit_rate_per_seed"][0] == r["hit_rate"], name
    report = (out / "report.md").read_text()
    assert "## The audited sample" in report and "not audited" in report


def test_a_disagreement_between_the_engines_is_named() -> None:
    fast = [{"policy": "lru", "budget": "10%", "seed": 0, "hits": 10}]
    audited = [{"policy": "lru", "budget": "10%", "seed": 0, "hits": 11}]
    assert _engines_disagree(fast, fast) == []
    assert _engines_disagree(fast, audited) == ["lru 10% seed 0: 10 vs 11 hits"]
