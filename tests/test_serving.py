"""The serving metrics (emu/serving.py) and the user-count experiment (experiments/users.py).

The metrics are checked against a second, plain implementation written from docs/serving.md
(loops over a hand-made run), the TTFT queue and turn detection against worked examples,
the footprint against the RTL's record layout and S1's arithmetic, and the experiment on
its tiny scale (1 user at a budget that holds everything hits every read).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvcxl.emu import serving
from kvcxl.emu.serving import INPUTS, ServingModel, serving_metrics, turn_starts
from kvcxl.emu.shape import PRESETS, Deployment
from kvcxl.experiments import users

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _run(**over):
    """A hand-made simulator result: 4 read steps, the first one warm-up."""
    r = {
        "warmup_steps": 1,
        "reads": 30,
        "entry_bytes": 1000,
        "entries": 50,
        "budget_entries": 20,
        "timing": {"cxl_gbps": 2.0, "nvme_gbps": 1.0},
        "bytes_moved": {
            "host->hbm": 4000,
            "hbm->cxl": 3000,
            "cxl->hbm": 2000,
            "cxl->nvme": 5000,
            "nvme->hbm": 1000,
        },
        "per_step": {
            "step_ns": [50.0, 100.0, 300.0, 200.0],
            "tokens": [2, 2, 3, 0],
            # per step, summing to bytes_moved (the measured steps 1..3)
            "bytes_moved": [
                {"host->hbm": 9000},
                {"host->hbm": 4000, "hbm->cxl": 1000, "cxl->nvme": 5000},
                {"hbm->cxl": 2000, "cxl->hbm": 2000},
                {"nvme->hbm": 1000},
            ],
        },
    }
    r.update(over)
    return r


def _plain(r, weights_bytes=0, hbm_gbps=8000.0, scale=1.0):
    """docs/serving.md's formulas, written out with loops."""
    w = r["warmup_steps"]
    steps = [ns + weights_bytes / hbm_gbps for ns in r["per_step"]["step_ns"]][w:]
    toks = r["per_step"]["tokens"][w:]
    itl = []
    for ns, t in zip(steps, toks, strict=True):
        itl += [ns] * t
    total = sum(steps)
    link = 0
    for pair, n in r["bytes_moved"].items():
        a, b = pair.split("->")
        near_a, near_b = a in ("host", "hbm"), b in ("host", "hbm")
        if near_a != near_b:
            link += n
    nvme_w = INPUTS["nvme_active_w"].value
    pj = {
        "host": 0.0,
        "hbm": INPUTS["hbm_pj_per_bit"].value,
        "cxl": INPUTS["dram_pj_per_bit"].value,
        "nvme": nvme_w / (r["timing"]["nvme_gbps"] * scale * 8e9) * 1e12,
    }
    off_gpu = 0.0
    for pair, n in r["bytes_moved"].items():
        a, b = pair.split("->")
        for t in (a, b):
            if t in ("cxl", "nvme"):
                off_gpu += n * scale * 8 * pj[t]
        if (a in ("host", "hbm")) != (b in ("host", "hbm")):
            off_gpu += n * scale * 8 * INPUTS["link_pj_per_bit"].value
    slow = []  # every step waits for its link bytes too
    for ns, moved, t in zip(steps, r["per_step"]["bytes_moved"][w:], toks, strict=True):
        crossed = 0
        for pair, n in moved.items():
            a, b = pair.split("->")
            if (a in ("host", "hbm")) != (b in ("host", "hbm")):
                crossed += n
        slow += [max(ns, crossed / r["timing"]["cxl_gbps"])] * t
    tokens = sum(toks)
    energy_j = INPUTS["gpu_power_w"].value * total * 1e-9 + off_gpu * 1e-12
    return {
        "itl_ms_mean": sum(itl) / len(itl) / 1e6,
        "tokens_per_s": tokens / (total * 1e-9),
        "tokens_per_s_per_user": 1e9 / (sum(itl) / len(itl)),
        "link_demand": link / (r["timing"]["cxl_gbps"] * total),
        "energy_mj_per_token": energy_j / tokens * 1e3,
        "link_bound_tokens_per_s_per_user": 1e9 / (sum(slow) / len(slow)),
    }


@pytest.mark.parametrize("weights", [0, 800_000])
def test_metrics_match_a_plain_implementation(weights):
    r = _run()
    model = ServingModel(weights_bytes=weights)
    got = serving_metrics(r, model)
    want = _plain(r, weights_bytes=weights)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12), k
    # The ITL sample holds one value per (user, step): 2 × 100 ns and 3 × 300 ns (+ weights).
    w = weights / model.hbm_gbps
    assert got["itl_ms_p50"] == pytest.approx((300 + w) / 1e6)
    assert got["users_mean"] == pytest.approx(2.5)


def test_scaled_energy_and_link_match_the_plain_implementation():
    r = _run()
    model = ServingModel(byte_scale=7.0)
    got = serving_metrics(r, model)
    want = _plain(r, scale=7.0)
    assert got["energy_mj_per_token"] == pytest.approx(want["energy_mj_per_token"], rel=1e-12)
    # Link demand is a ratio of simulated bytes to simulated capacity: scale-free.
    assert got["link_demand"] == pytest.approx(want["link_demand"], rel=1e-12)
    # Without the timeline nothing is a utilisation: the analytic figure is the demand alone.
    assert "link_utilisation" not in got and "link_utilisation_analytic" not in got


def test_ttft_queues_the_prefills_of_one_step():
    """Two turns start in step 0 and one in step 2: the second waits for the first's prefill."""
    r = _run(warmup_steps=0)
    model = ServingModel(params=1e9)
    turns = [(0, 5, 100), (0, 3, 50), (2, 5, 0)]
    got = serving_metrics(r, model, turns)
    p = model.prefill_ns
    want = sorted([(p(50) + 50) / 1e6, (p(50) + p(100) + 50) / 1e6, 300 / 1e6])
    assert got["ttft_turns"] == 3
    assert got["ttft_ms_mean"] == pytest.approx(sum(want) / 3)
    assert got["ttft_ms_median"] == pytest.approx(want[1])
    # 2 FLOP per parameter per token at the stated throughput and MFU.
    rate = INPUTS["gpu_bf16_tflops"].value * 1e12 * INPUTS["prefill_mfu"].value
    assert p(100) == pytest.approx(2 * 1e9 * 100 / rate * 1e9)


def test_turn_starts():
    decode = [[1, 2], [1, 2], [2, 3], [3], [3, 1]]
    prefill = [{1: 10, 2: 20}, {}, {3: 30}, {}, {3: 5}]
    assert turn_starts(decode, prefill) == [
        (0, 1, 10), (0, 2, 20), (2, 3, 30), (4, 1, 0), (4, 3, 5),
    ]  # fmt: skip


def test_metadata_footprint_is_the_rtl_record_at_s1():
    from kvcxl.rtl.layouts import record_layout

    assert serving.record_bits() == record_layout().size == 34
    s1 = PRESETS["s1"]
    m = serving.metadata_at(s1, Deployment(users=16))
    tracked = 16 * 80 * 8 * (131072 // 16)
    assert m["entries_tracked"] == tracked
    assert m["metadata_dram_bytes"] == math.ceil(tracked * 34 / 8)
    in_hbm = (192 - 140 - 5) * 10**9 // 8192
    assert m["metadata_sram_bytes"] == math.ceil(in_hbm * 34 / 8)


def test_scaled_run_keeps_s1_ratios_and_transfer_times():
    shape = users.scaled_shape(4, 2, 2048)
    dep = Deployment()
    opts, model = users.scaled_run(shape, dep)
    s1 = PRESETS["s1"]
    kv_budget = dep.hbm_bytes - dep.weights_bytes - dep.activations_bytes
    assert shape.entry_bytes == s1.entry_bytes and shape.group_size == s1.group_size
    assert opts.budget_bytes / shape.context_bytes == pytest.approx(
        kv_budget / s1.context_bytes, rel=1e-6
    )
    # One context over the scaled link takes what one S1 context takes over S1's link.
    t = opts.timing
    assert shape.context_bytes / t.cxl_gbps == pytest.approx(s1.context_bytes / 64.0)
    assert shape.context_bytes / t.nvme_gbps == pytest.approx(s1.context_bytes / 14.0)
    assert model.byte_scale * shape.context_bytes == s1.context_bytes
    assert model.token_scale * shape.context_tokens == s1.context_tokens
    assert model.weights_ns() == pytest.approx(140e9 / 8000.0)
    # The scaled prompt's prefill is S1's full prompt's: 2 FLOP × 70 B parameters × 128 K.
    rate = INPUTS["gpu_bf16_tflops"].value * 1e12 * INPUTS["prefill_mfu"].value
    assert model.prefill_ns(shape.context_tokens) == pytest.approx(2 * 70e9 * 131072 / rate * 1e9)


def test_one_user_at_a_budget_that_holds_everything_hits_every_read():
    e = users.EXPERIMENT
    case = next(c for c in e.cases("tiny") if c["users"] == 1)
    r = e.run(case, seed=0)
    assert r["hit_rate"] == 1.0
    assert r["link_bytes"] == 0 and r["link_demand"] == 0.0
    # Nothing pages in: every step is the weights plus the hits' HBM reads.
    assert r["itl_ms_p99"] == pytest.approx(r["itl_ms_p50"], rel=0.05)
    assert r["tokens_per_s"] == pytest.approx(r["tokens_per_s_per_user"])


def test_tiny_sweep_report():
    e = users.EXPERIMENT
    rows = [{**c, "seed": s, **e.run(c, s)} for c in e.cases("tiny") for s in (0, 1)]
    assert all(json.dumps(r) for r in rows)  # flat and JSON-able
    rep = e.report(rows)
    assert rep["verdict"] in ("confirms", "contradicts", "cannot say")
    assert "hot set" in rep["why"] and rep["tables"][0].count("\n") == 2 + 3 - 1
    by_users = {r["users"]: r for r in rows if r["seed"] == 0}
    # More users sharing the same HBM: no faster per user, more in aggregate.
    assert by_users[4]["tokens_per_s_per_user"] <= by_users[1]["tokens_per_s_per_user"]
    assert by_users[4]["tokens_per_s"] > by_users[1]["tokens_per_s"]


def _row(u, mean, half, placement="policy", hot=0.0625):
    row = {"users": u, "placement": placement, "hot_fraction": hot,
           "tokens_per_s_per_user": mean, "tokens_per_s_per_user_ci95": half}  # fmt: skip
    row["link_bound_tokens_per_s_per_user"] = mean
    row["link_bound_tokens_per_s_per_user_ci95"] = half
    row["meets"] = row["meets_link_bound"] = users._meets(row)
    return row


@pytest.mark.parametrize(
    ("fail_from", "verdict"), [(17, "confirms"), (12, "contradicts"), (20, "contradicts")]
)
def test_verdict_follows_the_bound(fail_from, verdict):
    rows = [_row(u, 20.0 if u < fail_from else 5.0, 1.0) for u in range(1, 25)]
    assert users.bound_of(rows) == (fail_from - 1, True)
    assert users._verdict(rows)[0] == verdict


def test_a_sweep_that_starts_above_one_puts_a_failing_first_count_above_the_bound():
    rows = [_row(u, 5.0, 1.0) for u in range(14, 19)]  # --where users=14-18, all fail
    verdict, why = users._verdict(rows)
    assert verdict == "contradicts"
    assert "the bound is below 14 users" in why and "the bound is 0" not in why
    whole = [_row(u, 5.0, 1.0) for u in range(1, 25)]  # from 1: no user count meets it
    assert "the bound is 0 users" in users._verdict(whole)[1]
    # open: the first count swept undecided, or the next count swept (not b + 1)
    first = [_row(14, 10.2, 1.0), _row(16, 5.0, 1.0)]
    assert "14 users, the sweep's smallest count, is undecided" in users._verdict(first)[1]
    gap = [_row(14, 20.0, 1.0), _row(16, 10.2, 1.0)]
    verdict, why = users._verdict(gap)
    assert verdict == "cannot say" and "14 users meet it, 16 is undecided" in why, why
    assert "every count up to 16 meets" in users._verdict([_row(14, 20.0, 1.0),
                                                           _row(16, 20.0, 1.0)])[1]  # fmt: skip
    # a gap between the last count that meets it and the first that fails: a range, and
    # the claim undecided when the range holds 16
    apart = [_row(4, 20.0, 1.0), _row(8, 5.0, 1.0)]
    verdict, why = users._verdict(apart)
    assert verdict == "contradicts" and "the bound is 4–7 users (4 meets" in why, why
    around = [_row(14, 20.0, 1.0), _row(18, 5.0, 1.0)]
    verdict, why = users._verdict(around)
    assert verdict == "cannot say" and "the bound is 14–17 users" in why, why
    assert users._verdict([_row(16, 20.0, 1.0), _row(18, 5.0, 1.0)])[0] == "cannot say"
    assert users._verdict([_row(16, 20.0, 1.0), _row(17, 5.0, 1.0)])[0] == "confirms"


def test_verdict_cannot_say_when_the_ci_straddles_the_target():
    rows = [_row(u, 20.0 if u < 17 else 5.0, 1.0) for u in range(1, 25)]
    rows[16] = _row(17, 10.5, 2.0)  # 8.5 .. 12.5 tok/s: undecided
    assert users.bound_of(rows) == (16, False)
    assert users._verdict(rows)[0] == "cannot say"


def test_docs_quote_the_inputs_table():
    text = (DOCS / "serving.md").read_text()
    assert serving.inputs_markdown() in text


def test_simulate_serving_cli(tmp_path, capsys):
    from kvcxl.cli.main import main

    out = tmp_path / "s.json"
    argv = ["simulate", "--workload", "multi-turn", "--steps", "30", "--warmup", "5",
            "--policy", "lru", "--backend", "serial", "--no-progress", "--serving",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "serving metrics" in printed
    # Untimed, the link figure is demand over capacity (it may exceed 1), named so; with
    # the timeline it is the busier direction's utilisation.
    assert "link demand" in printed and "link use" not in printed
    assert main([*argv, "--timeline"]) == 0
    printed = capsys.readouterr().out
    assert (
        "link use"
        in printed.splitlines()[
            next(i for i, line in enumerate(printed.splitlines()) if "serving metrics" in line) + 1
        ]
    )
    doc = json.loads(out.read_text())
    (row,) = doc["results"]
    (srv,) = doc["serving"]
    # With no weights term the serving model's aggregate rate is the simulator's own.
    assert srv["tokens_per_s"] == pytest.approx(row["tokens_per_s"], rel=1e-9)
    assert srv["ttft_ms_p50"] is not None
    # Timed, the link figure is the busier direction's busy share of the run: a fraction in
    # (0, 1], above 0 on a run whose misses crossed the link.
    assert row["misses"] > 0
    rd, wr = srv["link_rd_utilisation"], srv["link_wr_utilisation"]
    assert srv["link_utilisation"] == max(rd, wr)
    assert 0 < srv["link_utilisation"] <= 1


def test_per_step_times_are_hits_plus_stalls():
    """The simulator's per-step output the serving metrics read: step time = HBM reads of the
    hits + stall (docs/simulator.md), tokens summing to the run's."""
    from kvcxl.emu.sim.simulator import SimOptions, simulate
    from kvcxl.emu.workloads import compile_workload, make_workload

    shape = PRESETS["ci"]
    stream = compile_workload(make_workload("multi-turn", shape, seed=2), 40)
    r = simulate(stream, SimOptions(policy="lru", budget_bytes=stream.kv_bytes // 5,
                                    warmup_steps=8))  # fmt: skip
    ps, t = r["per_step"], r["timing"]
    assert r["misses"] > 0
    for hits, stall, ns in zip(ps["hits"], ps["stall_ns"], ps["step_ns"], strict=True):
        assert ns == pytest.approx(hits * shape.entry_bytes / t["hbm_gbps"] + stall)
    assert sum(ps["tokens"][8:]) == r["tokens"]
    cxl, nvme = ps["misses_by_tier"]["cxl"], ps["misses_by_tier"]["nvme"]
    assert sum(cxl[8:]) == r["misses_cxl"] and sum(nvme[8:]) == r["misses_nvme"]


def test_report_reads_each_bound_from_its_own_rate():
    """Simulated rate meets the target up to 16 users, the link-bound one up to 13."""
    keys = [*serving.SERVING_MEANS, "record_bits", "metadata_sram_bytes", "metadata_dram_bytes"]
    keys += [f"{lat}_{q}" for lat in ("itl_ms", "ttft_ms", "link_bound_itl_ms")
             for q in ("median", "p50", "p95", "p99")]  # fmt: skip
    rows = []
    for u in range(1, 25):
        for seed, jitter in enumerate((-0.5, 0.0, 0.5)):
            row = dict.fromkeys(keys, 1.0)
            row.update(users=u, placement="policy", hot_fraction=0.0625, seed=seed, hit_rate=0.9)
            row["tokens_per_s_per_user"] = (20.0 if u <= 16 else 5.0) + jitter
            row["link_bound_tokens_per_s_per_user"] = (20.0 if u <= 13 else 5.0) + jitter
            rows.append(row)
    rep = users.EXPERIMENT.report(rows)
    assert "simulated timing: the bound is 16 users" in rep["why"]
    assert "link-bound: the bound is 13 users" in rep["why"]
    assert rep["verdict"] == "cannot say"


def test_untimed_demand_above_one_is_named_with_its_link_bound(tmp_path, capsys):
    """Without the timeline a thrashing LRU run's link demand exceeds 1: the table says the
    link cannot carry it and gives the throughput the link bounds it to (each step waits
    for the bytes it moved), which is below the untimed figure."""
    from kvcxl.cli.main import main

    out = tmp_path / "d.json"
    argv = ["simulate", "--workload", "multi-turn", "--steps", "30", "--warmup", "5",
            "--policy", "lru", "--budget", "10%", "--backend", "serial", "--no-progress",
            "--serving", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    (srv,) = json.loads(out.read_text())["serving"]
    assert srv["link_demand"] > 1
    bound = srv["link_bound_tokens_per_s_per_user"]
    assert bound < srv["tokens_per_s_per_user"]
    assert f"link demand above 1 (lru 10%: {srv['link_demand']:.3f})" in printed
    assert f"tok/s/user ≤ {bound:,.1f}" in printed
