"""``kvcxl experiment policies`` at the tiny scale: the policies come from the registry, every
workload (synthetic and Mooncake's arrivals) is ranked, and the ranking agrees with a plain
computation over the rows."""

from __future__ import annotations

import statistics

import pytest

from kvcxl.emu import cli
from kvcxl.emu.experiments import runner
from kvcxl.emu.experiments.policies import EXPERIMENT, ranked_policies
from kvcxl.emu.workloads import ARRIVALS
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.policies.lru import LruPolicy

SEEDS = 2


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("policies")
    return runner.run(["policies"], "tiny", SEEDS, out, backend="serial")["policies"]


def test_policies_come_from_the_registry(monkeypatch):
    want = sorted(n for n, c in POLICIES.items() if c.online and not c.ablation)
    assert ranked_policies() == [*want, "belady"]
    assert "lru-anchor" not in ranked_policies() and "belady-nobypass" not in ranked_policies()

    class Later(LruPolicy):
        name = "later"

    monkeypatch.setitem(POLICIES, "later", Later)
    assert all("later" in c["policies"] for c in EXPERIMENT.cases("tiny"))


def test_every_workload_is_there(rows):
    got = {r["workload"] for r in rows}
    assert {"multi-turn", "uniform", *ARRIVALS} <= got


def test_belady_bounds_every_online_policy(rows):
    for r in rows:
        for p in r["policies"]:
            assert r["belady:hit_rate"] >= r[f"{p}:hit_rate"] - 1e-12, (r["workload"], p)


def test_ranking_agrees_with_a_plain_computation(rows):
    rep = EXPERIMENT.report(rows)
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["workload"], []).append(r)
    assert len(rep["tables"]) == 1 + len(by)  # the ranking, then each workload apart
    for rk in rep["ranking"]:
        rs = by[rk["workload"]]
        means = {p: statistics.fmean(r[f"{p}:hit_rate"] for r in rs)
                 for p in rs[0]["policies"] if p != "belady"}  # fmt: skip
        best = max(means, key=means.get)
        assert means[rk["best"]] == means[best]
        assert rk["over_ema"]["mean"] == pytest.approx(means[best] - means["ema"])
        assert rk["ema_rank"] == 1 + sum(m > means["ema"] for m in means.values())
    assert rep["verdict"] in ("confirms", "contradicts", "cannot say")
    # No capture joined this run, and the report says so; with one it does not.
    assert "No SmolLM2 capture joined: KVCXL_CAPTURES" in rep["why"]
    captured = [{**r, "workload": "capture:chat"} if r["workload"] == "multi-turn" else r
                for r in rows]  # fmt: skip
    assert "No SmolLM2 capture" not in EXPERIMENT.report(captured)["why"]


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    argv = ["experiment", "policies", "--scale", "tiny", "--seeds", "2", "--backend", "serial",
            "--out", str(tmp_path), "--json", str(tmp_path / "p.json"), "--plot", str(tmp_path),
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    assert "| workload | best online policy |" in capsys.readouterr().out
    assert (tmp_path / "policies-tiny.png").stat().st_size > 0
    assert (tmp_path / "p.json").stat().st_size > 0
