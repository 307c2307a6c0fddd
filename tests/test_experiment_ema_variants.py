"""ema-variants (experiments/ema_variants.py): the EMA's own rules against its literal
form, at the tiny scale, and how the best variant is chosen."""

from __future__ import annotations

import pytest

from kvcxl.common.sizes import parse_size
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.experiments import _common, runner
from kvcxl.experiments.base import VERDICTS
from kvcxl.experiments.ema_variants import ARMS, EXPERIMENT, RUNS, best_variant
from kvcxl.firmware.config import PolicyConfig


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ema-variants")
    return runner.run(["ema-variants"], "tiny", 2, out, backend="serial")["ema-variants"]


def test_the_ci_and_mid_runs_let_beta_act_for_1000_steps() -> None:
    for scale in ("ci", "mid"):
        for case in EXPERIMENT.cases(scale):
            assert case["steps"] - case["warmup"] >= 1000 == RUNS[scale]["steps"] - 100
    assert len(EXPERIMENT.cases("mid")) == 3  # three of the programme's workloads


def test_each_arm_is_the_simulator_with_its_parameters(rows) -> None:
    """The literal arm is plain ``ema`` at the defaults; every arm is its policy and config,
    replayed here directly, not through the experiment's code."""
    r = rows[0]
    case = {k: v for k, v in r.items() if ":" not in k and k != "seed"}
    st = _common.stream(case, r["seed"])
    assert ARMS["ema"] == ("ema", {})
    for label, (policy, cfg) in ARMS.items():
        ref = simulate(
            st,
            SimOptions(policy=policy, budget_bytes=parse_size("10%", st.kv_bytes),
                       warmup_steps=case["warmup"], config=PolicyConfig.from_mapping(cfg)),
        )  # fmt: skip
        assert r[f"{label}:hit_rate"] == ref["hit_rate"], label


def test_the_report_has_the_gain_table_a_table_per_workload_and_a_verdict(rows) -> None:
    rep = EXPERIMENT.report(rows)
    assert rep["verdict"] in VERDICTS and rep["best"] in ARMS and rep["best"] != "ema"
    workloads = list(_common.by_workload(rows))
    gain, *per = rep["tables"]
    assert all(a in gain for a in ARMS if a != "ema") and "| ema |" not in gain
    assert [t.split("**")[1] for t in per] == workloads


def test_the_best_variant_wins_most_workloads_then_the_larger_median_gain() -> None:
    def g(mean: float, lo: float | None, hi: float | None) -> dict:
        return {"mean": mean, "lo": lo, "hi": hi}

    gains = {
        "w1": {"a": g(0.05, 0.01, 0.09), "b": g(0.02, 0.01, 0.03), "c": g(0.3, -0.1, 0.7)},
        "w2": {"a": g(-0.05, -0.09, -0.01), "b": g(0.01, 0.005, 0.015), "c": g(0.0, -1, 1)},
    }
    best, tally = best_variant(gains, ["a", "b", "c"])
    assert tally == {"a": (1, 1), "b": (2, 0), "c": (0, 0)} and best == "b"
    gains["w2"]["b"] = g(-0.02, -0.03, -0.01)  # b: one won, one lost; c's median is larger
    assert best_variant(gains, ["a", "b", "c"])[0] == "c"
