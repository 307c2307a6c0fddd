"""Long experiment runs: the s1 scale, --where, the progress bar (runs, ETA, memory per
worker), resuming after a killed process, and a Dask cluster that loses a worker."""

from __future__ import annotations

import io
import json
import mmap
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from kvcxl.cli.experiment import Bar
from kvcxl.common import meminfo
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.workloads import ARRIVALS
from kvcxl.experiments import EXPERIMENTS, _common, runner
from kvcxl.experiments.users import scaled_shape

S1 = PRESETS["s1"]
USERS = ("users", "users-timeline")


def _s1_cases(name):
    try:
        return runner.cases_of(name, "s1")
    except ValueError as exc:  # an experiment whose own table lacks the scale says so
        assert name in str(exc) and "'s1'" in str(exc)
        return []


def test_s1_is_s1_exactly_with_steps_for_beta_and_warmup_excluded():
    beta = 0.001  # the seed's default recency rate (docs/policy.md)
    seen = 0
    for name in EXPERIMENTS:
        for case in _s1_cases(name):
            seen += 1
            if "preset" in case:  # the shared replay's cases
                shape = _common.shape_of(case)
            else:  # the users experiments' S1, scaled by k = 1
                shape = scaled_shape(case["layers"], case["kv_heads"], case["context_tokens"])
            assert (shape.layers, shape.kv_heads, shape.group_size, shape.d_head) == (
                S1.layers, S1.kv_heads, S1.group_size, S1.d_head,
            ), name  # fmt: skip
            assert (shape.block_tokens, shape.dtype_bytes) == (S1.block_tokens, S1.dtype_bytes)
            if case["workload"] not in ARRIVALS:  # (Mooncake's: the trace's, at its scale)
                assert shape.context_tokens == S1.context_tokens, name
            assert beta * case["steps"] >= 1.0, name  # β·idle reaches 1 within the run
            assert 0 < case["warmup"] < case["steps"] // 2, name
            assert case["read"].startswith("topk:"), name  # sparse reads
    assert seen > 0
    for name in USERS:
        users = sorted({c["users"] for c in runner.cases_of(name, "s1")})
        assert users == list(range(1, 25)), name  # the 1-24 sweep around 16


def test_where_keeps_the_named_cases_and_refuses_the_rest():
    where = runner.parse_where(["users=14-16,20", "placement=fill"])
    cases = runner.cases_of("users", "s1", where)
    assert {c["users"] for c in cases} == {14, 15, 16, 20}
    assert {c["placement"] for c in cases} == {"fill"}
    assert len(cases) == 4 * 2  # two hot sets
    with pytest.raises(ValueError, match="no case of 'users' at 's1' has a field 'nope'"):
        runner.cases_of("users", "s1", runner.parse_where(["nope=1"]))
    with pytest.raises(ValueError, match="keeps no case"):
        runner.cases_of("users", "s1", runner.parse_where(["users=99"]))
    with pytest.raises(ValueError, match="KEY=VALUE"):
        runner.parse_where(["users"])


def test_steps_runs_every_case_shorter_with_its_share_of_warm_up():
    full = runner.cases_of("users-timeline", "s1", runner.parse_where(["users=16"]))
    short = runner.cases_of("users-timeline", "s1", runner.parse_where(["users=16"]), 100)
    assert [c["steps"] for c in full] == [1000] * len(full)
    assert [(c["steps"], c["warmup"]) for c in short] == [(100, 10)] * len(full)
    assert [{**c, "steps": 1000, "warmup": 100} for c in short] == full  # nothing else
    assert runner.with_steps({"steps": 24, "warmup": 4}, 5) == {"steps": 5, "warmup": 1}
    assert runner.with_steps({"steps": 20, "warmup": 9}, 8)["warmup"] == 3  # under half
    with pytest.raises(ValueError, match="at least 4"):
        runner.with_steps({"steps": 24, "warmup": 4}, 3)


def test_warmup_names_the_warm_up_and_refuses_one_as_long_as_the_measured_steps():
    where = runner.parse_where(["users=16"])
    cut = runner.cases_of("users-timeline", "s1", where, 30, warmup=10)
    assert {(c["steps"], c["warmup"]) for c in cut} == {(30, 10)}
    own = runner.cases_of("users-timeline", "s1", where, warmup=200)  # the scale's steps
    assert {(c["steps"], c["warmup"]) for c in own} == {(1000, 200)}
    with pytest.raises(ValueError, match=r"--warmup 15: must be 1 … 14 at 30 steps"):
        runner.cases_of("users-timeline", "s1", where, 30, warmup=15)
    assert runner.with_steps({"steps": 24}, 8, 2) == {"steps": 24}  # a case without steps


def test_arms_keeps_the_named_arms_with_the_required_ones_and_refuses_the_rest(tmp_path):
    whole = runner.cases_of("policies", "tiny")
    some = runner.cases_of("policies", "tiny", arms=["lru", "ema (best variant)"])
    # the baseline and the bound stay; nothing else of a case changes
    assert [c["policies"] for c in some] == [["ema", "lru", "belady"]] * len(whole)
    assert [[a[0] for a in c["arms"]] for c in some] == [["ema (best variant)"]] * len(whole)
    assert [{**c, "policies": w["policies"], "arms": w["arms"]} for c, w in zip(
        some, whole, strict=True)] == whole  # fmt: skip
    fp = runner.fingerprint("policies")
    assert runner.key("policies", some[0], 0, fp) != runner.key("policies", whole[0], 0, fp)
    with pytest.raises(ValueError, match=r"'lur': not an arm of 'policies'.*lru"):
        runner.cases_of("policies", "tiny", arms=["lur"])
    with pytest.raises(ValueError, match="'users-timeline' has no arms to choose"):
        runner.cases_of("users-timeline", "tiny", arms=["lru"])
    # a report over the arms kept says which ran, and ranks only them
    rows = runner.run(["policies"], "tiny", 2, tmp_path, backend="serial",
                      where=runner.parse_where(["workload=uniform"]), arms=["lru"])  # fmt: skip
    rep = EXPERIMENTS["policies"].report(rows["policies"])
    assert "2 of the registry's" in rep["tables"][0] and "(ema, lru;" in rep["tables"][0]
    assert {r["workload"] for r in rep["ranking"]} == {"uniform"}
    assert rep["ranking"][0]["policies"] == 2  # ema and lru (belady is the bound)


def test_a_users_stream_is_built_once_for_the_runs_that_share_it(monkeypatch):
    from kvcxl.experiments import users as users_mod

    # the cases put what only times and places the device innermost, so the runner's
    # consecutive runs (one seed's, in case order) share a stream
    for name in USERS:
        cases = runner.cases_of(name, "s1")
        keys = [tuple(c.get(k) for k in users_mod.STREAM_FIELDS) for c in cases]
        runs = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
        assert len(runs) == len(set(keys)), name
    # users-mooncake's stream: one (trace, rate) and its steps, reads and attention
    fields = ("workload", "rate", "steps", "read", "attention")
    keys = [tuple(c.get(k) for k in fields) for c in runner.cases_of("users-mooncake", "s1")]
    runs = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
    assert len(runs) == len(set(keys)) > 1
    built = []
    real = users_mod.compile_workload
    monkeypatch.setattr(users_mod, "compile_workload",
                        lambda *a, **k: built.append(1) or real(*a, **k))  # fmt: skip
    case = runner.cases_of("users", "tiny", runner.parse_where(["users=2"]))[0]
    fill = {**case, "placement": "fill"}
    users_mod.STREAMS.clear()
    rows = [users_mod.EXPERIMENT.run(c, 0) for c in (case, fill, case)]
    assert len(built) == 1
    fresh = []
    for c in (case, fill):  # each from a stream of its own: the replay left the shared one be
        users_mod.STREAMS.clear()
        fresh.append(users_mod.EXPERIMENT.run(c, 0))
    assert len(built) == 3
    same = [json.dumps(r, sort_keys=True) for r in rows]
    assert same[:2] == [json.dumps(r, sort_keys=True) for r in fresh] and same[2] == same[0]
    assert same[1] != same[0]  # the placement reached the run
    users_mod.EXPERIMENT.run(case, 1)  # another seed: another stream
    assert len(built) == 4


def test_a_users_run_says_whether_its_warm_up_sufficed():
    """measured_halves against the run's per-step reads and hits summed by hand over the
    steps after the warm-up, split in two; the caption says whether the halves agree within
    SETTLED_PTS (a run whose halves differ, planted, is called unsettled) and says nothing
    for rows stored without the halves."""
    from kvcxl.experiments import users as users_mod

    case = runner.cases_of("users", "tiny", runner.parse_where(["users=2"]))[0]
    steps, warm = case["steps"], case["warmup"]
    per_step = {"reads": [10 * (i + 1) for i in range(steps)],
                "hits": [i for i in range(steps)]}  # fmt: skip
    first, second = users_mod.measured_halves(per_step, warm)
    mid = warm + (steps - warm) // 2
    assert first == sum(range(warm, mid)) / sum(10 * (i + 1) for i in range(warm, mid))
    assert second == sum(range(mid, steps)) / sum(10 * (i + 1) for i in range(mid, steps))
    assert users_mod.measured_halves({"reads": [5] * warm, "hits": [5] * warm}, warm) == (
        None, None)  # fmt: skip
    row = {**users_mod.EXPERIMENT.run(case, 0), **case, "seed": 0}
    assert row["hit_rate_first_half"] is not None and row["hit_rate_second_half"] is not None
    moved = abs(row["hit_rate_second_half"] - row["hit_rate_first_half"]) * 100
    said = users_mod.caption([row])
    assert ("warm-up sufficed" in said) == (moved <= users_mod.SETTLED_PTS), (moved, said)
    late = {**row, "hit_rate_second_half": row["hit_rate_first_half"] + 0.05}
    assert "did not suffice" in users_mod.caption([row, late])
    old = {k: v for k, v in row.items() if not k.startswith("hit_rate_") or k == "hit_rate"}
    assert users_mod.caption([old]).endswith(".") and "warm-up suf" not in users_mod.caption([old])


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_the_bar_shows_runs_eta_weighted_by_work_and_memory(monkeypatch):
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    small, big = (runner.cases_of("users", "tiny", runner.parse_where([f"users={u}"]))[0]
                  for u in (1, 4))  # fmt: skip
    runs = [("users", small, 0), ("users", big, 0)]
    assert runner.work(runs[1]) == 4 * runner.work(runs[0])
    bar = Bar()
    bar.start(3, 5, runs)  # three runs were done before: resumed
    bar.memory({"worker 0": 2_500_000_000, "worker 1": 1_000_000_000})
    clock[0] += 10.0  # the small run took 10 s: the big one, 4× its work, should take 40
    bar.ran(runs[0])
    assert bar.eta() == pytest.approx(40.0)
    assert "ETA 0m40s" in bar.status()
    bar.bar.refresh()
    line = err.getvalue().split("\r")[-1]
    assert "4/5 runs" in line and "ETA 0m40s" in line, line
    assert "0:2.50 GB" in line and "1:1.00 GB" in line, line
    bar.memory({"worker 0": 3_000_000_000})
    assert bar.peak == {"worker 0": 3_000_000_000, "worker 1": 1_000_000_000}
    assert "(sampled) 3.00 GB" in bar.peaks()
    # a high-water mark above every look is the peak (a run held it between two looks)
    bar.memory({"worker 1": 500_000_000})
    bar.high_water({"worker 1": 4_000_000_000})
    assert bar.peak["worker 1"] == 4_000_000_000
    assert "(high-water mark) 4.00 GB" in bar.peaks()
    bar.memory({f"worker {i}": (i + 1) * 10**9 for i in range(8)})  # many: a summary
    assert "RSS max 8.00 GB, mean 4.50 GB over 8 workers" in bar.status()
    bar.close()


class _Seen(runner.Progress):
    def __init__(self):
        self.mem, self.peak, self.runs = [], [], 0

    def ran(self, run):
        self.runs += 1

    def memory(self, mem):
        self.mem.append(mem)

    def high_water(self, peak):
        self.peak.append(peak)


def test_a_runs_peak_is_told_though_it_was_freed_before_the_look(tmp_path, monkeypatch):
    """In this process (one job) memory is looked at between runs only: a run that held
    300 MB and freed it must still be told at 300 MB above what the look after it sees,
    as the kernel's high-water mark (Linux's VmHWM, started over here first).
    The mark is compared with the look, not with the RSS before the run: under memory
    pressure the kernel may drop this process's file pages meanwhile, which lowers the
    mark and the look alike but not their difference (anonymous pages stay: no swap)."""
    real = runner.run_one

    def heavy(r):
        out = real(r)  # the run's own work first: the look then sees only what it kept
        # A mapping of its own, every page written: np.ones could be served from free heap
        # pages already resident (a worker's heap after earlier tests), which raise no mark.
        m = mmap.mmap(-1, 300 * 2**20)
        a = np.frombuffer(m, np.uint8)
        a[:: mmap.PAGESIZE] = 1
        del a
        m.close()  # unmapped: the RSS drops
        return out

    monkeypatch.setattr(runner, "run_one", heavy)
    meminfo.reset_peak()  # the high-water mark from the RSS now, not this worker's past
    seen = _Seen()
    runner.run(["hot-set"], "tiny", 1, tmp_path, backend="serial", progress=seen,
               where=runner.parse_where(["workload=uniform"]))  # fmt: skip
    assert seen.runs == 1 and len(seen.mem) == 1
    ((name, now),) = seen.mem[0].items()
    assert name == f"pid {os.getpid()}"
    assert seen.peak[0][name] - now >= 280 * 2**20, (seen.peak[0][name], now)


@pytest.mark.slow
def test_process_workers_report_their_memory(tmp_path):
    seen = _Seen()
    runner.run(["workloads"], "tiny", 2, tmp_path, backend="process", jobs=2, progress=seen)
    assert seen.runs == 4
    pids = {k for m in seen.mem for k in m}
    assert pids and f"pid {os.getpid()}" not in pids  # the workers', not this process's
    assert all(v > 10 * 2**20 for m in seen.mem for v in m.values())  # a Python process
    # each look's high-water marks: the workers', none below what it saw them hold (read
    # after it; a worker gone between the two reads has no mark)
    assert len(seen.peak) == len(seen.mem)
    both = [(p, m, p.keys() & m.keys()) for p, m in zip(seen.peak, seen.mem, strict=True)]
    assert any(ks for _, _, ks in both)
    assert all(p[k] >= m[k] for p, m, ks in both for k in ks)


def _cli(*args):
    return [sys.executable, "-m", "kvcxl.cli.main", "experiment", *args]


# The same command, in a process whose third run waits (the first two are written by
# then), so the signal lands mid-way however fast the runs or slow this test's polling.
_HOLD_THIRD = """
import signal, sys, time
# A shell's background job starts with SIGINT ignored, and Python then keeps it ignored:
# the user's Ctrl-C, which this test stands for, reaches a process that has the default.
signal.signal(signal.SIGINT, signal.default_int_handler)
from kvcxl.experiments import runner
real, calls = runner.run_one, []
def held(r):
    calls.append(r)
    if len(calls) == 3:
        time.sleep(3600)
    return real(r)
runner.run_one = held
from kvcxl.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_the_same_command_resumes_after_an_interrupt(tmp_path, sig):
    """A real process, stopped by a signal after some runs are written, then the same
    command again: it runs only what is missing, and the result equals an uninterrupted
    run's (no timing asserted: the kill waits for lines in the file, however slow)."""
    seeds = 6  # ladder at tiny: 2 workloads × 6 seeds = 12 runs
    out, js = tmp_path / "out", tmp_path / "r.json"
    argv = _cli("ladder", "--scale", "tiny", "--seeds", str(seeds), "--backend", "serial",
                "--out", str(out), "--json", str(js), "--no-progress")  # fmt: skip
    f = runner.out_file(out, "ladder", "tiny")
    held = [sys.executable, "-c", _HOLD_THIRD, *argv[3:]]  # (argv less "-m kvcxl.cli.main")
    p = subprocess.Popen(held, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 900
    while (not f.exists() or len(f.read_text().splitlines()) < 2) and p.poll() is None:
        assert time.monotonic() < deadline, "no run written in 15 min"
        time.sleep(0.02)
    p.send_signal(sig)
    _, err = p.communicate(timeout=900)
    before = f.read_text()
    written = len(before.splitlines())
    total = 2 * seeds
    assert p.returncode in (-signal.SIGKILL, 130), (p.returncode, err)  # it was stopped
    assert 2 <= written < total, written  # mid-way
    if sig == signal.SIGINT:
        assert "the same command resumes" in err, err
    assert not js.exists()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr
    after = f.read_text()
    assert after.startswith(before.rstrip("\n"))  # what was there stays
    keys = [json.loads(line)["key"] for line in after.splitlines() if line.strip()]
    assert len(keys) == len(set(keys)) == total  # the rest ran, and only once
    whole = runner.run(["ladder"], "tiny", seeds, tmp_path / "whole", backend="serial")
    assert json.loads(js.read_text())["experiments"]["ladder"]["rows"] == whole["ladder"]


@pytest.mark.slow
def test_a_dask_cluster_that_loses_a_worker_gives_the_serial_rows(tmp_path):
    """Two workers on a LocalCluster; once the first result is in, the worker that holds
    runs is killed (SIGKILL); the scheduler reruns its runs elsewhere and the rows equal
    the serial run's."""
    distributed = pytest.importorskip("dask.distributed")
    serial = runner.run(["ladder"], "tiny", 3, tmp_path / "serial", backend="serial")

    class KillOne(runner.Progress):
        killed: list = []
        mem: list = []

        def memory(self, mem):
            self.mem.append(mem)

        def ran(self, run):
            if self.killed:
                return
            busy = [w for w, keys in client.processing().items() if keys]
            if not busy:
                return  # nothing left on a worker to lose: try after the next run
            pid = client.run(os.getpid, workers=[busy[0]])[busy[0]]
            os.kill(pid, signal.SIGKILL)
            self.killed.append(busy[0])

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=600)
        done = runner.run(
            ["ladder"], "tiny", 3, tmp_path / "dask", backend="dask",
            address=cluster.scheduler_address, progress=KillOne(),
        )  # fmt: skip
    assert KillOne.killed, "no worker held a run once the first result was in"
    assert done == serial
    # the bar's memory per worker: what the scheduler says each one holds
    assert {"worker 0", "worker 1"} <= {k for m in KillOne.mem for k in m}
    assert all(v > 10 * 2**20 for m in KillOne.mem for v in m.values())


@pytest.mark.slow
def test_a_local_worker_that_dies_is_reported_and_the_finished_runs_resume(tmp_path):
    """Two local worker processes; at the first look at their memory one is killed
    (SIGKILL, as the out-of-memory killer does): the run stops with the user's error
    (WorkerLost: exit status 1, naming the run and what to do, not an internal error),
    every finished run is kept, and the same run again completes with the serial rows."""
    serial = runner.run(["ladder"], "tiny", 3, tmp_path / "serial", backend="serial")

    class KillOne(runner.Progress):
        killed: list = []

        def memory(self, mem):
            if not self.killed and mem:
                pid = int(sorted(mem)[0].split()[1])
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)

    out = tmp_path / "process"
    with pytest.raises(runner.WorkerLost) as lost:
        runner.run(["ladder"], "tiny", 3, out, backend="process", jobs=2, progress=KillOne())
    assert KillOne.killed
    msg = str(lost.value)
    assert "died while running ladder" in msg and "the same command resumes" in msg, msg
    assert "--jobs 1" in msg, msg
    assert runner.WorkerLost.exit_code == 1  # (kvcxl.cli.main.explain: a user's error)
    f = runner.out_file(out, "ladder", "tiny")
    kept = f.read_text().splitlines() if f.exists() else []
    assert len(kept) < 6  # stopped mid-way
    assert runner.run(["ladder"], "tiny", 3, out, backend="process", jobs=2) == serial
