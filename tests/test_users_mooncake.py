"""The users-mooncake experiment at the tiny scale: its reported concurrency against a plain
count of overlapping [admit, finish) intervals read straight from the trace file, the
timeline's utilisation ≤ 1, the movement bracket, and the verdict's bracket walk."""

from __future__ import annotations

import json
import lzma
import math

import pytest

from kvcxl.emu.timing import TierTiming
from kvcxl.emu.workloads.mooncake import DATA_DIR, TRACES
from kvcxl.experiments import users_mooncake as um
from kvcxl.experiments.base import VERDICTS

SEEDS = (0, 1)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    e = um.EXPERIMENT
    return [{**c, "seed": s, **e.run(c, s)} for c in e.cases("tiny") for s in SEEDS]


def plain_intervals(rate: float) -> list[tuple[int, int]]:
    """[admit, finish) step of every request of the conversation trace, from the docs alone:
    a step is 100 ms per token × 32 tokens (16-token KV blocks per 512-token hash block)
    of the trace's clock divided by ``rate``; a request decodes ceil(output / 32) steps."""
    step_ms = 100.0 * 512 / 16
    with lzma.open(DATA_DIR / TRACES["conversation"], "rt") as f:
        lines = [json.loads(t) for t in f if t.strip()]
    out = []
    for r in lines:
        a = math.floor(r["timestamp"] / rate / step_ms)
        out.append((a, a + max(1, math.ceil(r["output_length"] / 32))))
    return out


def test_concurrency_is_a_plain_count_of_the_trace(rows):
    assert {r["rate"] for r in rows} == set(um.SCALES["tiny"]["rates"])
    for r in rows:
        iv = plain_intervals(r["rate"])
        counts = [sum(a <= s < f for a, f in iv) for s in range(r["steps"])]
        # the measured steps: those in which a request decodes, after the warm-up's
        busy = [n for n in counts if n > 0]
        if r["rate"] == 1 / 32:
            assert len(busy) < len(counts)  # the tiny scale has idle steps to skip
        counts = busy[r["warmup"] :]
        assert r["concurrency_mean"] == pytest.approx(sum(counts) / len(counts), rel=1e-12)
        assert r["concurrency_peak"] == max(counts)
        assert r["requests"] == sum(a < r["steps"] for a, _f in iv)
        assert r["truncated"] == 0  # S1's 128 K context holds every conversation request
    # eight times the rate, more than four times the concurrency (the windows are short)
    by_rate = {r["rate"]: r["concurrency_mean"] for r in rows}
    assert by_rate[1 / 4] > 4 * by_rate[1 / 32]


def test_every_resource_is_busy_at_most_the_whole_run(rows):
    for r in rows:
        for k in um.RESOURCES:
            assert 0.0 <= r[f"{k}_utilisation"] <= 1.0, (r["rate"], k)
        assert 0.0 <= r["hit_rate"] <= 1.0
        assert r["tokens_per_s_per_user"] > 0 and r["itl_ms_p50"] <= r["itl_ms_p99"]
    with pytest.raises(ValueError, match=r"nvme utilisation 1\.01"):
        um.check_utilisation({"link_rd": 0.1, "link_wr": 0.2, "dram": 0.3, "nvme": 1.01}, "x")


def test_the_seed_changes_attention_not_arrivals(rows):
    for rate in um.SCALES["tiny"]["rates"]:
        a, b = (r for r in rows if r["rate"] == rate)
        assert a["concurrency_mean"] == b["concurrency_mean"]
        assert a["hit_rate"] != b["hit_rate"] or a["itl_ms_p50"] != b["itl_ms_p50"]


def test_the_report_and_its_verdict(rows):
    rep = um.EXPERIMENT.report(rows)
    assert rep["verdict"] in VERDICTS and "mooncake, seed:" in rep["why"]
    table = rep["tables"][0].splitlines()
    assert len(table) == 2 + len(um.EXPERIMENT.cases("tiny"))
    assert "| mooncake | seed | 1/32 |" in table[2] and "| 2 |" in table[2]
    bad = [{**rows[0], "seed": 1, "concurrency_mean": -1.0}, rows[0]]
    with pytest.raises(ValueError, match="differs across seeds"):
        um.EXPERIMENT.report(bad)


def test_per_step_movement_costs_at_least_the_amortised():
    """The same stream with the whole step's movement charged to every token: no faster."""
    e = um.EXPERIMENT
    c = e.cases("tiny")[-1]
    am = e.run(c, 0)
    ps = e.run({**c, "movement": "per-step", "series": "seed/per-step"}, 0)
    assert am["concurrency_mean"] == ps["concurrency_mean"]
    assert ps["tokens_per_s_per_user"] < am["tokens_per_s_per_user"]
    with pytest.raises(ValueError, match="movement 'x'"):
        e.run({**c, "movement": "x"}, 0)


def test_amortised_divides_every_device_cost():
    t = TierTiming()
    a = um.amortised(t, 32.0)
    assert a.cxl_gbps == 32 * t.cxl_gbps and a.nvme_gbps == 32 * t.nvme_gbps
    assert a.cxl_latency_ns == t.cxl_latency_ns / 32 and a.nvme_latency_ns == t.nvme_latency_ns / 32
    assert (a.hbm_gbps, a.hbm_latency_ns) == (t.hbm_gbps, t.hbm_latency_ns)


def test_the_token_mapping_is_s1s_context():
    # one 512-token hash block per 16-token block: S1's 128 K tokens are 4,096 simulated
    assert um.TOKEN_SCALE == 1 / 32 and um.CONTEXT_TOKENS == 4096
    assert um.ITL_MS == 100.0  # the target's 10 tokens/s


@pytest.mark.parametrize(
    ("meets", "want"),
    [
        ([True, True, False], (2.0, 3.0)),
        ([False, False, False], (None, 1.0)),
        ([True, None, False], (1.0, None)),
        ([True, True, True], (3.0, None)),
    ],
)
def test_the_bracket_walk(meets, want):
    rows = [
        {"rate": rate, "concurrency_mean": float(i + 1), "meets": m}
        for i, (rate, m) in enumerate(zip([0.5, 1.0, 2.0], meets, strict=True))
    ]
    assert um.bracket(rows[::-1]) == want  # sorted by rate, whatever the order given


# The verdict follows from the bounds: per-step meets → a server meets; amortised fails →
# a server fails; so a server's bound lies in [per-step lo, amortised hi).
CI_PER_STEP, CI_AMORTISED = (6.8, 12.4), (54.0, 83.4)  # docs/validation.md, ci, 3 seeds


@pytest.mark.parametrize(
    ("per_step", "amortised", "want"),
    [
        (CI_PER_STEP, CI_AMORTISED, "open"),  # 6.8 … 83.4 brackets 16: cannot place it
        ((23.8, 41.2), (54.0, 83.4), "above"),  # per-step meets at 23.8 > 16
        ((None, 3.3), (6.8, 12.4), "below"),  # amortised fails at 12.4 ≤ 16
        ((None, 3.3), (12.4, 16.0), "below"),  # failing at exactly 16 is below it
        ((12.4, 23.8), (16.0, 23.8), "at"),  # both brackets hold 16
        ((None, 23.8), (12.4, 23.8), "at"),  # lowest rate fails per step, still below 16
        ((12.4, 23.8), (23.8, 41.2), "open"),  # amortised meets at 23.8: not pinned at 16
        ((12.4, None), (12.4, 23.8), "open"),  # per-step undecided above 12.4
        (None, (12.4, 23.8), "open"),  # no per-step series: no lower bound
        (None, (41.2, 54.0), "open"),  # amortised alone never says "above"
        ((23.8, 41.2), None, "above"),
        (None, (3.3, 6.8), "below"),
        ((23.8, 41.2), (3.3, 6.8), "open"),  # the two disagree
    ],
)
def test_the_position_follows_from_the_bounds(per_step, amortised, want):
    assert um.position(per_step, amortised) == want


@pytest.mark.parametrize(
    ("places", "want"),
    [
        (["open", "open", "open", "open"], "cannot say"),
        (["above", "below", "above"], "contradicts"),
        (["at", "at"], "confirms"),
        (["at", "above"], "cannot say"),
        (["above", "open"], "cannot say"),
        ([], "cannot say"),
    ],
)
def test_the_verdict_follows_from_the_positions(places, want):
    assert um.verdict_of(places) == want
    with pytest.raises(ValueError, match="position 'inside'"):
        um.verdict_of([*places, "inside"])


def _series(points: dict[str, list[tuple[float, bool | None]]]) -> dict:
    """Report-shaped series from (mean concurrency, meets) per rate, lowest rate first."""
    return {
        ("mooncake", name): [
            {"rate": (i + 1) / 8, "concurrency_mean": c, "meets": m} for i, (c, m) in enumerate(pts)
        ]
        for name, pts in points.items()
    }


def test_bounds_that_bracket_16_cannot_say():
    """The ci run's shape: per-step 6.8–12.4, amortised 54.0–83.4 for the same timing,
    and an amortised-only series bounded above 16: no series places 16, so cannot say
    (the rule once said "contradicts": each bracket alone excludes 16)."""
    c = [3.3, 6.8, 12.4, 23.8, 41.2, 54.0, 83.4]
    series = _series({
        "seed": [(x, x <= 54.0) for x in c],
        "seed/per-step": [(x, x <= 6.8) for x in c],
        "asic": [(x, x <= 54.0) for x in c],
    })  # fmt: skip
    mv = um.movements(series)
    assert mv == {
        ("mooncake", "seed"): {"amortised": CI_AMORTISED, "per-step": CI_PER_STEP},
        ("mooncake", "asic"): {"amortised": CI_AMORTISED},
    }
    places = [um.position(m.get("per-step"), m.get("amortised")) for m in mv.values()]
    assert places == ["open", "open"] and um.verdict_of(places) == "cannot say"
    # a per-step series meeting beyond 16 puts a server above it: contradicts
    per_step = series[("mooncake", "seed/per-step")]
    series[("mooncake", "seed/per-step")] = [
        {**r, "meets": r["concurrency_mean"] <= 23.8} for r in per_step
    ]
    del series[("mooncake", "asic")]
    mv = um.movements(series)
    assert um.verdict_of([um.position(m.get("per-step"), m.get("amortised"))
                          for m in mv.values()]) == "contradicts"  # fmt: skip


def test_every_table_says_its_attention(rows):
    from kvcxl.cli.experiment import render

    rep = um.EXPERIMENT.report(rows)
    md = render(um.EXPERIMENT, rep, "tiny", len(SEEDS))
    before = md.split(rep["tables"][0])[0].rstrip().splitlines()[-1]
    assert before.startswith("Simulated") and "attention: synthetic, the seed's defaults" in before
    with pytest.raises(ValueError, match="a table without a caption"):
        render(um.EXPERIMENT, {**rep, "caption": None}, "tiny", len(SEEDS))
