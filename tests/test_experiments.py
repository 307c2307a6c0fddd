"""The validation programme's experiments (experiments/) at the tiny scale: structure,
statistics, invariants across experiments, and resumable output."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from kvcxl.cli import main as cli
from kvcxl.common.sizes import parse_size
from kvcxl.emu.metrics import t975
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.experiments import EXPERIMENTS, _common, runner
from kvcxl.experiments.base import VERDICTS, Experiment
from kvcxl.experiments.ladder import Ladder
from kvcxl.experiments.stats import paired_gain, summary

SEEDS = 2
NAMES = ["aggregation", "hot-set", "ladder", "workloads"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp")
    return runner.run(NAMES, "tiny", SEEDS, out, backend="serial")


def test_every_module_defines_one_experiment():
    assert set(NAMES) <= set(EXPERIMENTS)
    for name, exp in EXPERIMENTS.items():
        assert isinstance(exp, Experiment) and exp.name == name
        assert exp.question and exp.claim
        for scale in ("tiny", "ci", "mid"):
            for case in exp.cases(scale):
                assert "workload" in case
                json.dumps(case)  # JSON-able
                assert not any(isinstance(v, dict) for v in case.values())  # flat


def test_rows_have_every_case_and_seed(rows):
    for name, rs in rows.items():
        cases = EXPERIMENTS[name].cases("tiny")
        assert len(rs) == len(cases) * SEEDS
        assert [r["seed"] for r in rs] == list(range(SEEDS)) * len(cases)
        for r in rs:
            for k, v in r.items():
                if ":" in k:
                    assert isinstance(v, float) and math.isfinite(v), (name, k)
                    if k.endswith(":hit_rate"):
                        assert 0.0 <= v <= 1.0


def test_reports_have_a_table_per_workload_and_a_verdict(rows):
    for name, rs in rows.items():
        rep = EXPERIMENTS[name].report(rs)
        assert rep["verdict"] in VERDICTS and rep["why"]
        workloads = {c["workload"] for c in EXPERIMENTS[name].cases("tiny")}
        assert len(rep["tables"]) == len(workloads)  # each workload apart, never averaged
        for t, wl in zip(rep["tables"], _common.by_workload(rs), strict=True):
            assert t.startswith(f"**{wl}**") and "| " in t
        for draw in rep["plots"].values():
            assert callable(draw)


def test_the_ladders_first_rung_is_plain_lru(rows):
    # compared against the simulator called directly, not through the experiment code
    for r in rows["ladder"]:
        case = {k: v for k, v in r.items() if ":" not in k and k != "seed"}
        st = _common.stream(case, r["seed"])
        ref = simulate(
            st,
            SimOptions(
                policy="lru", budget_bytes=parse_size("10%", st.kv_bytes),
                warmup_steps=case["warmup"],
            ),
        )  # fmt: skip
        assert r["lru:hit_rate"] == ref["hit_rate"]
        assert r["lru:effective_latency_ns"] == ref["effective_latency_ns"]


def test_shared_arms_agree_across_experiments(rows):
    """The same policy, α, budget and seed in two experiments is the same replay."""
    by = {n: {(r["workload"], r["seed"]): r for r in rs} for n, rs in rows.items()}
    for k, lad in by["ladder"].items():
        assert by["workloads"][k]["lru:hit_rate"] == lad["lru:hit_rate"]
        assert by["workloads"][k]["ema-0.2:hit_rate"] == lad["ema-0.2:hit_rate"]
        assert by["hot-set"][k]["ema@10%:hit_rate"] == lad["ema-0.2:hit_rate"]
        assert by["hot-set"][k]["lru@10%:hit_rate"] == lad["lru:hit_rate"]
        assert by["aggregation"][k]["max:hit_rate"] == lad["ema-0.2:hit_rate"]
        assert by["workloads"][k]["belady:hit_rate"] >= lad["lru:hit_rate"]


def test_ladder_gains_are_paired_differences(rows):
    rs = [r for r in rows["ladder"] if r["workload"] == "multi-turn"]
    g = Ladder.gains(rs)["anchor"]
    d = [r["lru-anchor:hit_rate"] - r["lru:hit_rate"] for r in rs]
    assert g["mean"] == pytest.approx(statistics.fmean(d))
    assert g["ci95"] == pytest.approx(t975(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d)))


def test_statistics_against_a_plain_computation():
    x = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0]
    y = [2.0, 1.5, 3.0, 0.0, 5.5, 7.0, 2.0, 4.0, 5.0, 1.0, 4.0]
    s = summary(x)
    n = len(x)
    half = t975(n - 1) * statistics.stdev(x) / math.sqrt(n)
    assert s["mean"] == pytest.approx(statistics.fmean(x))
    assert s["ci95"] == pytest.approx(half)
    assert s["median"] == statistics.median(x) == s["p50"]
    srt = sorted(x)  # numpy's default percentile: linear between closest ranks
    pos = 0.95 * (n - 1)
    lo = math.floor(pos)
    assert s["p95"] == pytest.approx(srt[lo] + (pos - lo) * (srt[lo + 1] - srt[lo]))
    g = paired_gain(x, y)
    d = [a - b for a, b in zip(x, y, strict=True)]
    assert g["mean"] == pytest.approx(statistics.fmean(d))
    assert g["ci95"] == pytest.approx(t975(n - 1) * statistics.stdev(d) / math.sqrt(n))
    with pytest.raises(ValueError, match="differ in length"):
        paired_gain(x, y[:-1])


class _Boom(Exception):
    pass


def test_a_killed_run_resumes_where_it_stopped(tmp_path, monkeypatch):
    whole = runner.run(["ladder"], "tiny", 3, tmp_path / "a", backend="serial")["ladder"]
    calls = []
    real = Ladder.run

    def dies_on_the_fourth(self, case, seed):
        calls.append((case["workload"], seed))
        if len(calls) == 4:
            raise _Boom
        return real(self, case, seed)

    monkeypatch.setattr(Ladder, "run", dies_on_the_fourth)
    with pytest.raises(_Boom):
        runner.run(["ladder"], "tiny", 3, tmp_path / "b", backend="serial")
    f = runner.out_file(tmp_path / "b", "ladder", "tiny")
    assert len(f.read_text().splitlines()) == 3
    with f.open("a") as fh:  # a line the kill cut short
        fh.write('{"key": "[\\"ladder\\", {\\"workl')
    calls.clear()
    resumed = runner.run(["ladder"], "tiny", 3, tmp_path / "b", backend="serial")["ladder"]
    assert len(calls) == len(whole) - 3  # only what was missing ran
    assert resumed == whole
    calls.clear()
    runner.run(["ladder"], "tiny", 3, tmp_path / "b", backend="serial")
    assert calls == []  # nothing left to run


def test_a_changed_fingerprint_runs_again(tmp_path, monkeypatch):
    runner.run(["ladder"], "tiny", 1, tmp_path, backend="serial")
    calls = []
    real = Ladder.run
    monkeypatch.setattr(Ladder, "run", lambda s, c, seed: calls.append(1) or real(s, c, seed))
    monkeypatch.setattr(runner, "fingerprint", lambda name=None: "000000000000")
    runner.run(["ladder"], "tiny", 1, tmp_path, backend="serial")
    assert len(calls) == len(Ladder().cases("tiny"))


def test_the_fingerprint_follows_the_run_method_not_the_report():
    fp = runner.fingerprint("ladder")
    assert fp == runner.fingerprint("ladder") and fp != runner.fingerprint("hot-set")


def test_cli_lists_runs_and_refuses(tmp_path, capsys):
    assert cli.main(["experiment", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in EXPERIMENTS:
        assert name in listed
    out, js, img = tmp_path / "o", tmp_path / "r.json", tmp_path / "img"
    argv = ["experiment", "ladder", "--scale", "tiny", "--seeds", "2", "--no-progress",
            "--out", str(out), "--json", str(js), "--plot", str(img),
            "--backend", "serial"]  # fmt: skip
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "### ladder" in text and "Verdict:" in text
    doc = json.loads(js.read_text())
    assert doc["evidence"] == "Simulated" and len(doc["experiments"]["ladder"]["rows"]) == 4
    assert (out / "ladder-tiny.md").read_text().startswith("### ladder")
    assert (img / "ladder-tiny.png").stat().st_size > 0
    for argv, names in (
        (["experiment", "nope"], ["nope", "choose from", "ladder"]),
        (["experiment"], ["name an experiment", "ladder"]),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(n in err[0] for n in names), err


@pytest.mark.slow
def test_a_dask_cluster_gives_the_same_rows(tmp_path):
    pytest.importorskip("dask.distributed")
    local = runner.run(["workloads"], "tiny", 2, tmp_path / "a", backend="serial")
    dask = runner.run(["workloads"], "tiny", 2, tmp_path / "b", backend="dask")
    assert dask == local


def test_every_table_says_its_class_and_attention(rows):
    """Each rendered table sits under a caption naming its class and attention source."""
    from kvcxl.cli.experiment import render

    for name, rs in rows.items():
        rep = EXPERIMENTS[name].report(rs)
        md = render(EXPERIMENTS[name], rep, "tiny", SEEDS)
        for t in rep["tables"]:
            body = t[t.index("\n|") + 1 :] if not t.startswith("|") else t
            caption = md.split(body)[0].rstrip().splitlines()[-1]
            assert "Simulated" in caption, (name, caption)
            # tiny runs the ci preset, whose attention is the SmolLM2 fit
            assert "attention: synthetic, fitted to SmolLM2-135M" in caption, (name, caption)


def test_the_attention_source_follows_the_preset():
    mid = _common.base_cases("mid")[0]
    assert _common.attention_of(mid) == "synthetic, the seed's defaults"  # s1's heads
    assert _common.attention_of(_common.base_cases("ci")[0]).endswith("fitted to SmolLM2-135M")
    assert _common.attention_of({**mid, "trace": "x.npz"}).startswith("captured from SmolLM2")
    rows = [_common.base_cases("ci")[0], {**mid, "trace": "x.npz"}]
    assert _common.attention_summary(rows + rows) == (
        "synthetic, fitted to SmolLM2-135M; captured from SmolLM2-135M (real)"
    )
