"""The transfer timeline (docs/timeline.md): against its SimPy twin stage by stage, on
hand-worked logs, and its invariants (no resource busier than its servers)."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from kvcxl.emu.sim.simulator import SimOptions, _Replay, simulate
from kvcxl.emu.sim.sweep import SweepSpec, build_stream
from kvcxl.emu.timeline import Record, Resources, TransferLog, engine, run
from kvcxl.emu.timeline import resources as tres
from kvcxl.emu.timing import TierTiming
from kvcxl.firmware.config import PolicyConfig

pytest.importorskip("simpy")
sys.path.insert(0, str(Path(__file__).parent))
import timeline_reference as ref

RES = Resources(link_gbps=64.0, dram_gbps=64.0, dram_latency_ns=200.0, nvme_gbps=14.0,
                nvme_latency_ns=25_000.0)  # fmt: skip
EB = 4096
STATIC = PolicyConfig(tier_management="static", cxl_order="fifo")


def _log(spec: SweepSpec, seed: int = 0, **opts) -> tuple[TransferLog, Resources]:
    st = build_stream(spec, seed)
    eb = st.shape.entry_bytes
    frac = opts.pop("budget", 0.1)
    o = SimOptions(budget_bytes=int(frac * st.n_entries) * eb, engine="numpy", timeline=True,
                   **opts)  # fmt: skip
    rp = _Replay(st, o)
    rp.run(None)
    assert rp.tl is not None
    return rp.tl, Resources.of(o.timing)


# Small traces covering every move: demand and prefetch from CXL and NVMe, write-backs to
# both, CXL -> NVMe spills (a small --cxl), writes' evictions.
MULTI_TURN = SweepSpec(workload="multi-turn", steps=30)
CASES = {
    "multi-turn-lru-pf": (MULTI_TURN, dict(policy="lru", prefetch=True)),
    # static tiers: the EMA's cold victims go straight to NVMe (hbm->nvme write-backs)
    "multi-turn-ema-pf": (MULTI_TURN, dict(policy="ema", prefetch=True, config=STATIC)),
    "cyclic-ema-spill": (
        SweepSpec(workload="cyclic", steps=30),
        dict(policy="ema", prefetch=True, cxl_bytes=64 * 4096),
    ),
    # managed tiers with a small CXL DRAM: step boundaries sink and raise (boundary records)
    "multi-turn-ema-managed": (
        MULTI_TURN, dict(policy="ema", prefetch=True, cxl_bytes=64 * 4096, config=PolicyConfig(
            evict_threshold=0.05)),
    ),
    # weighted placement: step boundaries demote HBM entries to CXL DRAM (background)
    "multi-turn-ema-weighted": (
        MULTI_TURN, dict(policy="ema", prefetch=True, cxl_bytes=64 * 4096, config=PolicyConfig(
            placement_mode="weighted")),
    ),
    "retrieval-topk-lru": (
        SweepSpec(workload="retrieval", steps=24, read="topk:4"),
        dict(policy="lru", prefetch=True, budget=0.2, granularity="step"),
    ),
}  # fmt: skip


def _mine(s):
    return [(x["transfer"], x["stage"], x["ready"], x["start"], x["end"]) for x in s.stages]


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    spec, opts = CASES[request.param]
    return (request.param, *_log(spec, **dict(opts)))


def test_every_move_is_exercised():
    moves, classes = set(), set()
    for spec, opts in CASES.values():
        log, res = _log(spec, **dict(opts))
        s = run(log, res)
        moves |= {x["move"] for x in s.transfers}
        classes |= {x["cls"] for x in s.transfers}
        assert any(r.waits for r in log.records) or not opts.get("prefetch")
    assert moves == {"cxl->hbm", "nvme->hbm", "hbm->cxl", "hbm->nvme", "cxl->nvme", "nvme->cxl"}
    assert classes == {0, 1, 2}
    bg = set()
    for spec, opts in CASES.values():
        log, _res = _log(spec, **dict(opts))
        bg |= {k for r in log.records for k in r.background}
    assert bg == {"hbm->cxl", "cxl->nvme", "nvme->cxl"}  # every boundary move, as a record


def test_equals_simpy_twin_stage_by_stage(case):
    _name, log, res = case
    s = run(log, res)
    stages, transfers, a, r, c = ref.simulate(log.records, log.entry_bytes, res)
    assert len(s.stages) > 50
    assert _mine(s) == stages  # every stage's ready, start and end, exactly
    assert [(x["record"], x["move"], x["entries"], x["cls"]) for x in s.transfers] == transfers
    reads = [i for i, rec in enumerate(log.records) if rec.read]
    assert [s.a[i] for i in reads] == [a[i] for i in reads]
    assert [s.r[i] for i in reads] == [r[i] for i in reads]
    assert [s.c[i] for i in reads] == [c[i] for i in reads]


def test_twin_catches_planted_defects(case):
    """Each planted defect, in the twin or in the engine, breaks the equality."""
    name, log, res = case
    mine = _mine(run(log, res))
    assert ref.simulate(log.records, log.entry_bytes, res, half_duplex=True)[0] != mine
    swapped = ref.simulate(log.records, log.entry_bytes, res, demand_class=1, prefetch_class=0)
    # (the step-granularity case issues its prefetch after the step's one batch: nothing
    # demand-class is queued beside it, so the order of the classes does not show)
    assert (swapped[0] != mine) == (name != "retrieval-topk-lru")


def test_engine_defects_are_caught(monkeypatch):
    spec, opts = CASES["multi-turn-lru-pf"]
    log, res = _log(spec, **dict(opts))
    good = ref.simulate(log.records, log.entry_bytes, res)[0]
    assert _mine(run(log, res)) == good
    real = tres.stages

    def half_duplex(move, n, r):
        return [(lat, tuple("link_rd" if x == "link_wr" else x for x in held))
                for lat, held in real(move, n, r)]  # fmt: skip

    monkeypatch.setattr(engine, "stages", half_duplex)
    assert _mine(run(log, res)) != good
    monkeypatch.setattr(engine, "stages", real)
    monkeypatch.setattr(engine, "ROLE_CLASS", {"demand": 1, "prefetch": 0})
    assert _mine(run(log, res)) != good


def _held_at_most_servers(s, res):
    servers = res.servers()
    for name, k in servers.items():
        ev = []
        for st in s.stages:
            if name in st["resources"]:
                ev += [(st["start"], 1), (st["end"], -1)]
        ev.sort(key=lambda e: (e[0], e[1]))  # a release before a start at the same instant
        level = 0
        for _t, d in ev:
            level += d
            assert level <= k, f"{name} held by {level} stages, has {k} servers"


def test_utilisation_at_most_one_and_servers_never_oversubscribed(case):
    _name, log, res = case
    s = run(log, res)
    _held_at_most_servers(s, res)
    for name, k in res.servers().items():
        u = s.busy_ns[name] / (k * s.horizon_ns)
        assert 0.0 <= u <= 1.0 + 1e-12, (name, u)
    for st in s.stages:
        assert st["ready"] <= st["start"] < st["end"]


# --- hand-worked logs ---------------------------------------------------------------------
def _read(**kw) -> Record:
    return Record(True, **kw)


def test_single_fetches_cost_latency_plus_bytes_over_bandwidth():
    log = TransferLog(EB, [_read(demand={"cxl->hbm": 10}, compute_ns=1000.0),
                           _read(pos=1, demand={"nvme->hbm": 200}, compute_ns=0.0)])  # fmt: skip
    s = run(log, RES)
    b1, b2 = 10 * EB, 200 * EB
    assert s.c[0] == pytest.approx(200 + b1 / 64 + 1000)
    # NVMe: two rounds of 128 commands' latency, its data at 14 GB/s, then the link
    assert s.r[1] == pytest.approx(s.c[0] + 2 * 25_000 + b2 / 14 + b2 / 64)
    assert math.ceil(200 / RES.nvme_queue_depth) == 2


def test_full_duplex_write_backs_do_not_delay_fetches():
    log = TransferLog(EB, [_read(demand={"cxl->hbm": 100}, evict={"hbm->cxl": 100})])
    s = run(log, RES)
    fetch, wb = s.transfers
    assert fetch["end"] == pytest.approx(wb["end"])  # in parallel: two DRAM servers
    assert s.r[0] == pytest.approx(200 + 100 * EB / 64)


def test_demand_goes_before_prefetch_queued_earlier():
    """Behind a long prefetch on the link, a demand fetch ready later still starts before a
    second prefetch ready earlier (class before ready time)."""
    big, small = 1000, 10
    log = TransferLog(EB, [
        _read(prefetch={"cxl->hbm": big}, compute_ns=0.0),
        _read(pos=1, prefetch={"cxl->hbm": small}, compute_ns=50.0),
        _read(pos=2, demand={"cxl->hbm": small}, compute_ns=0.0),
    ])  # fmt: skip
    s = run(log, RES)
    st = {x["transfer"]: x for x in s.stages}
    pf1, pf2, dem = 0, 1, 2
    assert st[pf2]["ready"] < st[dem]["ready"]
    assert st[dem]["start"] == st[pf1]["end"]  # the demand takes the link first
    assert st[pf2]["start"] == pytest.approx(st[dem]["end"])


def test_read_of_a_prefetch_in_flight_waits_for_its_remainder_and_counts_late():
    from kvcxl.emu.timeline import report

    log = TransferLog(EB, [
        _read(prefetch={"cxl->hbm": 1000}, compute_ns=100.0),
        _read(pos=1, hits=5, reads=5, waits=[(0, 5)], compute_ns=0.0),
        _read(pos=2, hits=5, reads=5, waits=[], compute_ns=0.0),
    ])  # fmt: skip
    s = run(log, RES)
    arrive = 200 + 1000 * EB / 64
    assert s.a[1] == pytest.approx(100.0) and s.a[1] < arrive
    assert s.r[1] == pytest.approx(arrive)
    rep = report(log, s, RES, 3, 0, wasted_entries=0)
    assert rep["late_prefetch_bytes"] == 5 * EB
    # planted: a read that does not wait would start at a
    log.records[1].waits = []
    assert run(log, RES).r[1] == pytest.approx(100.0)


def test_write_backs_of_a_write_gate_the_next_read():
    log = TransferLog(EB, [Record(False, evict={"hbm->nvme": 10}), _read(compute_ns=0.0)])
    s = run(log, RES)
    assert s.r[1] == pytest.approx(10 * EB / 64 + 25_000 + 10 * EB / 14)


def test_stage_table_refuses_bad_input():
    with pytest.raises(ValueError, match="entries"):
        tres.stages("cxl->hbm", 0, RES)
    with pytest.raises(ValueError, match="move"):
        tres.stages("hbm->hbm", 1, RES)
    with pytest.raises(ValueError, match="link_gbps"):
        Resources(0.0, 1.0, 0.0, 1.0, 0.0)


# --- through simulate() -------------------------------------------------------------------
def test_simulate_reports_the_timeline_on_either_engine():
    st = build_stream(SweepSpec(workload="multi-turn", steps=30), 0)
    eb = st.shape.entry_bytes
    o = SimOptions(policy="lru", budget_bytes=int(0.1 * st.n_entries) * eb, timeline=True,
                   warmup_steps=3)  # fmt: skip
    r = simulate(st, o)
    tl = r["timeline"]
    assert r["engine"] == "fast"  # (the fast engine runs the timeline: test_timeline_fast.py)
    assert all(0 <= u <= 1 for u in tl["utilisation"].values())
    assert tl["tokens_per_s"] == r["tokens_per_s"]
    assert r["tokens_per_s_analytic"] > 0
    step = np.asarray(r["per_step"]["step_ns"])
    assert step.size == r["steps"] + r["warmup_steps"] and (step >= 0).all()
    assert r["tokens"] / (step[3:].sum() * 1e-9) == pytest.approx(tl["tokens_per_s"])
    for engine_name in ("numpy", "fast"):
        r0 = simulate(st, SimOptions(policy="lru", budget_bytes=o.budget_bytes, timeline=True,
                                     engine=engine_name))  # fmt: skip
        moved = r0["bytes_moved"]  # (over the measured steps: all of them without a warm-up)
        wb = moved.get("hbm->cxl", 0) + moved.get("hbm->nvme", 0)
        assert r0["timeline"]["write_back_bytes"] == wb > 0
    r1 = simulate(st, dataclasses.replace(o, engine="numpy"))
    assert r1["engine"] == "numpy" and r1["timeline"] == tl


def test_timing_presets_carry_their_sources():
    p = tres.PRESETS
    assert p["seed"].timing().cxl_latency_ns == 200.0 and p["seed"].cxl_gbps == 64.0
    assert p["asic"].cxl_latency_ns == pytest.approx(2.18 * 115)
    assert p["asic"].cxl_gbps == pytest.approx(0.825 * 64)
    assert p["fpga"].cxl_latency_ns == pytest.approx(2.88 * 115)
    assert 0.45 * 64 <= p["fpga"].cxl_gbps <= 0.69 * 64
    for q in p.values():
        assert q.evidence and q.source
    assert "2411.02282" in p["asic"].source
    assert TierTiming().cxl_gbps == p["seed"].cxl_gbps  # the default is the seed's


def test_offload_preset_reads_pcie_contention():
    from kvcxl.firmware.config import PolicyConfig

    p = tres.offload_preset(PolicyConfig().pcie_contention)
    assert p.cxl_gbps == pytest.approx(16.4, abs=0.1)  # the design's "16.4 of 51 GB/s"
    assert p.cxl_latency_ns == 13_000.0
    assert tres.offload_preset(tres.MEASURED_FRACTION).cxl_gbps == pytest.approx(0.87 * 51)
    with pytest.raises(ValueError, match="pcie_contention"):
        tres.offload_preset(0.0)


def test_cli_timeline_presets_and_versus_offload(tmp_path, capsys):
    import json

    from kvcxl.cli.main import main

    out = tmp_path / "r.json"
    args = ["simulate", "--workload", "multi-turn", "--steps", "20", "--policy", "lru",
            "--budget", "10%", "--timeline", "--serving", "--jobs", "1",
            "--no-progress"]  # fmt: skip
    assert main([*args, "--timing", "asic", "--versus-offload", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "offload 0.32" in text and "offload 0.87" in text and "link rd" in text
    doc = json.loads(out.read_text())
    assert doc["config"]["timing"]["cxl_gbps"] == pytest.approx(52.8)
    assert doc["config"]["timeline"] is True
    setups = {r["setup"] for r in doc["versus_offload"]}
    assert len(setups) == 3
    for r in doc["serving"] + doc["versus_offload"]:
        assert 0 <= r["link_utilisation"] <= 1
    assert main(["simulate", "--workload", "multi-turn", "--versus-offload"]) != 0
    assert "add --serving" in capsys.readouterr().err
    # an explicit override wins over the preset
    assert main([*args, "--timing", "fpga", "--cxl-gbps", "40", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["timing"]["cxl_gbps"] == 40.0


def test_energy_per_token_prices_the_bytes_each_resource_carried():
    from kvcxl.emu.serving import INPUTS, nvme_pj_per_bit
    from kvcxl.emu.timeline import report

    log = TransferLog(EB, [_read(tokens=4, demand={"cxl->hbm": 10, "nvme->hbm": 3},
                                 evict={"hbm->cxl": 2}, compute_ns=500.0)])  # fmt: skip
    s = run(log, RES)
    rep = report(log, s, RES, 1, 0, wasted_entries=0)
    link, dram = INPUTS["link_pj_per_bit"].value, INPUTS["dram_pj_per_bit"].value
    pj = 8 * EB * (10 * (dram + link) + 3 * (nvme_pj_per_bit(14.0) + link) + 2 * (link + dram))
    j = INPUTS["gpu_power_w"].value * s.c[0] * 1e-9 + pj * 1e-12
    assert rep["energy_mj_per_token"] == pytest.approx(j / 4 * 1e3)
    assert rep["bytes"] == {"link_rd": 13 * EB, "link_wr": 2 * EB, "dram": 12 * EB,
                            "nvme": 3 * EB}  # fmt: skip
    assert rep["write_back_bytes"] == 2 * EB


def test_energy_counts_the_steps_not_the_transfers_after_them():
    """The GPU's time is the sum of step times: a boundary's moves that run on after the
    last compute add their bytes' energy, not GPU time (docs/timeline.md, docs/serving.md)."""
    from kvcxl.emu.serving import INPUTS, nvme_pj_per_bit
    from kvcxl.emu.timeline import report

    log = TransferLog(EB, [_read(tokens=2, hits=1, reads=1, compute_ns=300.0),
                           Record(False, background={"cxl->nvme": 100})])  # fmt: skip
    s = run(log, RES)
    assert s.horizon_ns > s.c[0] + 25_000  # the sink runs on past the compute
    rep = report(log, s, RES, 1, 0, wasted_entries=0)
    pj = 8 * EB * 100 * (INPUTS["dram_pj_per_bit"].value + nvme_pj_per_bit(14.0))
    j = INPUTS["gpu_power_w"].value * 300.0 * 1e-9 + pj * 1e-12
    assert rep["energy_mj_per_token"] == pytest.approx(j / 2 * 1e3)


def test_boundary_moves_are_background_beside_the_next_compute():
    """A boundary record's moves start at the closing step's compute end, gate nothing (the
    next read computes at once) and take the NVMe for their bytes over its bandwidth."""
    log = TransferLog(EB, [
        _read(compute_ns=1000.0),
        Record(False, background={"cxl->nvme": 50, "nvme->cxl": 20, "hbm->cxl": 5}),
        _read(pos=1, compute_ns=10.0),
    ])  # fmt: skip
    s = run(log, RES)
    assert [x["cls"] for x in s.transfers] == [2, 2, 2]
    assert [x["move"] for x in s.transfers] == ["hbm->cxl", "cxl->nvme", "nvme->cxl"]
    assert all(x["issue"] == 1000.0 for x in s.transfers)
    assert s.a[2] == s.r[2] == 1000.0  # not gated by them
    assert s.busy_ns["nvme"] == pytest.approx(70 * EB / 14)
    stages, transfers, *_ = ref.simulate(log.records, EB, RES)
    assert _mine(s) == stages
    assert [(x["record"], x["move"], x["entries"], x["cls"]) for x in s.transfers] == transfers
    # planted: a boundary move that gates the next read (demand class) is caught by the twin
    log.records[1] = Record(False, evict={"hbm->cxl": 5})
    assert run(log, RES).r[2] > 1000.0


def test_users_timeline_experiment_at_tiny_scale():
    from kvcxl.experiments import users, users_timeline
    from kvcxl.experiments.base import VERDICTS

    e = users_timeline.EXPERIMENT
    cases = e.cases("tiny")
    rows = [{**c, "seed": s, **e.run(c, s)} for c in cases for s in (0, 1)]
    for r in rows:
        assert 0 <= r["link_utilisation"] <= 1 and 0 <= r["nvme_utilisation"] <= 1
    rep = e.report(rows)
    assert rep["verdict"] in VERDICTS and "seed:" in rep["why"]
    assert rep["tables"][0].count("\n") == len(cases) + 1
    # the "seed" preset without the timeline is the users experiment's own run, exactly
    c = {**cases[0], "timeline": False}
    plain = {k: v for k, v in c.items() if k not in ("timing", "timeline", "series")}
    assert users.EXPERIMENT.run(plain, 0) == e.run(c, 0)
    # a bracket point sets the full-size CXL bandwidth the scaled run divides
    shape = users.scaled_shape(*users_timeline.SCALES["tiny"]["dims"])
    from kvcxl.emu.shape import Deployment
    from kvcxl.emu.timing import TierTiming

    o64, _ = users.scaled_run(shape, Deployment(users=1))
    o32, _ = users.scaled_run(shape, Deployment(users=1), TierTiming(cxl_gbps=32.0))
    assert o64.timing.cxl_gbps == pytest.approx(2 * o32.timing.cxl_gbps)
