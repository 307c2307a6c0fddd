"""``kvcxl experiment policies`` at the tiny scale: the policies come from the registry, every
workload (synthetic and Mooncake's arrivals) is ranked, and the ranking agrees with a plain
computation over the rows."""

from __future__ import annotations

import statistics

import pytest

from kvcxl.cli import main as cli
from kvcxl.emu.workloads import ARRIVALS
from kvcxl.experiments import policies as pol
from kvcxl.experiments import runner
from kvcxl.experiments.policies import EXPERIMENT, ranked_policies
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


def test_a_configured_arm_is_one_row(monkeypatch):
    """An arm of CONFIGURED joins every case with its parameters, and a bad row is refused."""
    arms = pol.arms_of(EXPERIMENT.cases("tiny")[0])
    assert arms["ema (calibrated)"][0] == "ema"
    assert arms["ema (calibrated)"][1]["anchor_zone_size"] == 32  # the file's, not the default
    row = {**pol.CONFIGURED, "ema (alpha 0.05)": ("ema", {"alpha": 0.05})}
    monkeypatch.setattr(pol, "CONFIGURED", row)
    assert all(pol.arms_of(c)["ema (alpha 0.05)"] == ("ema", {"alpha": 0.05})
               for c in EXPERIMENT.cases("tiny"))  # fmt: skip
    monkeypatch.setattr(pol, "CONFIGURED", {"ema (bad)": ("ema", {"alpha": 2.0})})
    with pytest.raises(ValueError, match="alpha"):
        EXPERIMENT.cases("tiny")
    monkeypatch.setattr(pol, "CONFIGURED", {"lru": ("ema", {})})
    with pytest.raises(ValueError, match="label taken"):
        EXPERIMENT.cases("tiny")


def test_the_configured_arm_replays_its_configuration(rows):
    """The calibrated arm's hit rate is the simulator's with the file's configuration."""
    from kvcxl.experiments._common import replay, stream

    r = next(r for r in rows if r["workload"] == "uniform" and r["seed"] == 1)
    policy, config = pol.arms_of(r)["ema (calibrated)"]
    got = replay(stream(r, 1), r, policy, r["budget"], **config)["hit_rate"]
    assert r["ema (calibrated):hit_rate"] == got
    plain = replay(stream(r, 1), r, policy, r["budget"])["hit_rate"]
    assert r["ema:hit_rate"] == plain


def test_every_scale_has_its_cases():
    """Each scale of the shared table (s1 too) gives every workload and both arrivals."""
    from kvcxl.experiments._common import SCALES

    for scale, fixed in SCALES.items():
        got = [c["workload"] for c in EXPERIMENT.cases(scale)]
        assert got == [*fixed["workloads"], *ARRIVALS], scale


def test_an_arrival_case_reads_no_larger_share_of_its_context_than_the_others():
    """Top-k is a share of a context: an arrival (Mooncake) case's k over its context's
    blocks is at most a synthetic case's k over its context's at the same scale.  At s1,
    top-256 would read every Mooncake context whole (1,024 blocks at 16 K tokens, the
    longest request 374): its arrivals read top-32, mid's share of mid's context."""
    from kvcxl.experiments._common import SCALES, shape_of

    def share(case):
        k = int(case["read"].split(":")[1])
        sh = shape_of(case)
        return k / -(-sh.context_tokens // sh.block_tokens)

    for scale in SCALES:
        cases = EXPERIMENT.cases(scale)
        synthetic = [c for c in cases if c["workload"] not in ARRIVALS]
        arrivals = [c for c in cases if c["workload"] in ARRIVALS]
        assert arrivals and synthetic
        for c in arrivals:
            assert share(c) <= share(synthetic[0]), (scale, c["read"])
    by_scale = {s: {c["read"] for c in EXPERIMENT.cases(s) if c["workload"] in ARRIVALS}
                for s in ("ci", "mid", "s1")}  # fmt: skip
    assert by_scale == {"ci": {"topk:8"}, "mid": {"topk:32"}, "s1": {"topk:32"}}


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
    assert len(rep["tables"]) == 4 + len(by)  # arms, ranking, family, matrix, each workload
    family = {"ema", "ema-floor", "ema (calibrated)", "ema (best variant)"}
    beaten = 0
    for rk in rep["ranking"]:
        rs = by[rk["workload"]]
        arms = [p for p in rs[0]["policies"] if p != "belady"] + list(pol.arms_of(rs[0]))
        means = {p: statistics.fmean(r[f"{p}:hit_rate"] for r in rs) for p in arms}
        best = max(means, key=means.get)
        assert means[rk["best"]] == means[best]
        assert rk["over_ema"]["mean"] == pytest.approx(means[best] - means["ema"])
        assert rk["ema_rank"] == 1 + sum(m > means["ema"] for m in means.values())
        assert set(rk["family"]) == family
        top = max(family, key=means.get)
        assert means[rk["best_of_family"]] == means[top]
        assert rk["over_family"]["mean"] == pytest.approx(means[best] - means[top])
        beaten += rk["over_family"]["lo"] > 0
        for a in family:
            assert rk["family"][a]["rank"] == 1 + sum(m > means[a] for m in means.values())
    assert rep["verdict"] in ("confirms", "contradicts", "cannot say")
    names = "ema, ema (best variant), ema (calibrated), ema-floor"
    assert f"the best arm of its family ({names}) on {beaten} of" in rep["why"]
    # The matrix: one column per arm, the family first; the bound last.
    matrix = next(t for t in rep["tables"] if t.startswith("**Hit rate % of every arm**"))
    head = [c.strip() for c in matrix.split("\n\n")[1].splitlines()[0].strip("|").split("|")]
    assert head[:5] == ["workload", "ema", "ema (best variant)", "ema (calibrated)", "ema-floor"]
    assert head[-1] == "belady" and len(head) == 1 + len(arms) + 1
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
    assert "| workload | best online arm |" in capsys.readouterr().out
    assert (tmp_path / "policies-tiny.png").stat().st_size > 0
    assert (tmp_path / "p.json").stat().st_size > 0
