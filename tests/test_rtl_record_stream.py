"""The records-in-DRAM engine (rtl/record_stream.py) in Amaranth's simulator, behind the DRAM
model of tb/record_stream_model.py: every sweep's victims (index and priority, in order)
equal the firmware's integer golden step, and the records it writes back equal the step's
new state, at several DRAM latencies and bandwidths, with the DRAM taking write data after
its command or before it; planted defects (a ``hold`` sweep that writes back; a sweep that
ends before its last write command) are caught."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvcxl.tb.record_stream_model import (
    Dram,
    Port,
    int_params,
    pack_words,
    random_records,
    random_sweeps,
    unpack_words,
)

pytestmark = pytest.mark.hdl


def run(entries, lanes, batch, burst, latency, bpc, sweeps_n, seed, defect=None, data_first=False):
    """Run random sweeps; (mismatches, cycles per sweep, DRAM words read and written)."""
    from amaranth.sim import Simulator

    from kvcxl.rtl.record_stream import RecordStreamEngine

    rng = random.Random(seed)
    prm = int_params()
    recs = random_records(rng, entries)
    sweeps = random_sweeps(rng, recs, sweeps_n, batch, prm)
    dut = RecordStreamEngine(
        entries, lanes, batch, burst, decay_init=[int(v) for v in prm.table], defect=defect
    )
    dram = Dram(
        pack_words(recs["score"], recs["idle"], recs["pinned"], recs["resident"], lanes),
        lanes, latency, bpc, data_first=data_first,
    )  # fmt: skip
    bad: list[str] = []
    cycles: list[int] = []

    async def bench(ctx):
        ctx.set(dut.alpha, prm.alpha_q)
        ctx.set(dut.touch, prm.touch_q)
        ctx.set(dut.shift, prm.shift)
        words = entries // lanes
        vic = dut.victim.payload
        for s, sw in enumerate(sweeps):
            ctx.set(dut.k, sw.k)
            ctx.set(dut.step.payload, {"hold": int(sw.hold)})
            ctx.set(dut.step.valid, 1)
            sent = 0
            got: list[tuple[int, int]] = []
            start, done, busy = dram.now, False, 1
            # until the last victim, and busy low: a memory that takes the data first may
            # take the last write command (and land its words) after the last victim
            while not done or busy:
                if dram.now - start > 50 * words + 40 * latency + 500:
                    bad.append(f"sweep {s}: hang")
                    return
                offer = None
                if data_first:
                    offer = Port(wr_cmd_valid=ctx.get(dut.wr_cmd.valid),
                                 wr_cmd_len=ctx.get(dut.wr_cmd.payload.len),
                                 wr_data_valid=ctx.get(dut.wr_data.valid))  # fmt: skip
                dram.drive(offer)
                ctx.set(dut.rd_cmd.ready, dram.rd_cmd_ready)
                ctx.set(dut.wr_cmd.ready, dram.wr_cmd_ready)
                ctx.set(dut.rd_data.valid, dram.rd_valid)
                ctx.set(dut.rd_data.payload.as_value(), dram.rd_word)
                ctx.set(dut.wr_data.ready, dram.wr_ready)
                if sent < words:
                    a = sent * lanes
                    ctx.set(dut.upd.payload, {
                        "weight": [int(x) for x in sw.weights[a:a + lanes]],
                        "read": sum(int(b) << i for i, b in enumerate(sw.read[a:a + lanes])),
                        "hold": int(sw.hold)})  # fmt: skip
                ctx.set(dut.upd.valid, int(sent < words))
                vr = int(rng.random() < 0.7)
                ctx.set(dut.victim.ready, vr)
                vals = await ctx.tick().sample(
                    dut.step.ready, dut.upd.ready,
                    dut.rd_cmd.valid, dut.rd_cmd.payload.addr, dut.rd_cmd.payload.len,
                    dut.rd_data.ready, dut.wr_cmd.valid, dut.wr_cmd.payload.addr,
                    dut.wr_cmd.payload.len, dut.wr_data.valid, dut.wr_data.payload.as_value(),
                    dut.victim.valid, vic.index, vic.priority, vic.last, vic.empty, dut.busy,
                )  # fmt: skip
                (st_r, up_r, rcv, rca, rcl, rdr, wcv, wca, wcl, wdv, wd, vv, vi, vpr, vl, ve) = (
                    vals[-17:-1]
                )
                busy = vals[-1]
                if st_r:
                    ctx.set(dut.step.valid, 0)
                if up_r and sent < words:
                    sent += 1
                dram.sample(Port(rcv, rca, rcl, rdr, wcv, wca, wcl, wdv, wd))
                if vv and vr:
                    if not ve:
                        got.append((vi, vpr))
                    done = done or bool(vl)
            cycles.append(dram.now - start)
            if got != sw.want:
                bad.append(f"sweep {s} ({'hold' if sw.hold else 'update'}, k {sw.k}): "
                           f"victims {got[:4]}, firmware {sw.want[:4]}")  # fmt: skip
            # every write-back of this sweep has landed (busy stays up until it has)
            mem = unpack_words(dram.mem, lanes)
            for f in ("score", "idle", "pinned", "resident"):
                if not np.array_equal(mem[f], sw.after[f]):
                    bad.append(f"sweep {s}: records' {f} differ from the golden step")

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return bad, cycles, dram.reads, dram.writes


@pytest.mark.parametrize(
    "lanes,burst,latency,bpc,data_first",
    [(1, 4, 1, None, False), (4, 8, 12, None, False), (4, 3, 5, 6.0, False),
     (2, 16, 30, 3.0, False), (1, 4, 1, None, True), (4, 3, 5, 6.0, True)],
)  # fmt: skip
def test_victims_and_records_equal_the_golden_step(lanes, burst, latency, bpc, data_first):
    bad, cycles, reads, writes = run(
        32, lanes, 4, burst, latency, bpc, 12, seed=lanes + burst, data_first=data_first
    )
    assert not bad, bad[:4]
    assert reads == 12 * 32 // lanes and writes > 0
    assert min(cycles) >= 32 // lanes + latency  # a word a cycle at best, after the latency


def test_planted_hold_writeback_is_caught():
    bad, *_ = run(32, 4, 4, 8, 3, None, 12, seed=5, defect="hold_writes")
    assert any("records" in b for b in bad)


def test_planted_early_end_is_caught_by_a_memory_that_takes_data_first():
    """A sweep that ends with its last beat, its last write command unsent: a memory that
    takes data first never lands those words; one that takes commands first never sees it."""
    bad, *_ = run(32, 4, 4, 8, 3, None, 6, seed=5, defect="early_done", data_first=True)
    assert any("records" in b for b in bad)
    bad, *_ = run(32, 4, 4, 8, 3, None, 6, seed=5, defect="early_done")
    assert not bad, bad[:4]


def test_the_bench_packs_as_the_layouts_do():
    from kvcxl.rtl import layouts as L
    from kvcxl.rtl.record_stream import word_layout
    from kvcxl.tb.record_stream_model import pack_updates

    rng = random.Random(3)
    recs = random_records(rng, 12)
    words = pack_words(recs["score"], recs["idle"], recs["pinned"], recs["resident"], 4)
    for a, word in enumerate(words):
        lanes = [{f: int(recs[f][a * 4 + i]) for f in recs} for i in range(4)]
        assert word == L.pack(word_layout(4), lanes)
    back = unpack_words(words, 4)
    assert all(np.array_equal(back[f], recs[f]) for f in recs)
    w = np.array([rng.randrange(65536) for _ in range(12)])
    rd = np.array([rng.random() < 0.5 for _ in range(12)])
    got = pack_updates(w, rd, True, 4)
    for a in range(3):
        sl = slice(a * 4, a * 4 + 4)
        beat = {"weight": [int(x) for x in w[sl]], "hold": 1,
                "read": sum(int(b) << i for i, b in enumerate(rd[sl]))}  # fmt: skip
        assert got[a] == L.pack(L.update_layout(4), beat)


@pytest.mark.slow
@pytest.mark.parametrize("sim", ["verilator", "icarus"])
def test_record_stream_bench_on_both_simulators(sim):
    """The cocotb bench (tb/cocotb_record_stream.py): 24 random sweeps behind the DRAM model,
    victims and written-back records against the golden step."""
    from kvcxl.tb.runner import run_unit

    r = run_unit("record_stream", sim, count=24)
    assert r["mismatches"] == 0 and r["sweeps"] == 24
    for key in ("hold_sweeps", "victims", "dram_words_written", "victim_stalls"):
        assert r[key] > 0, f"{key} never exercised: {r}"


@pytest.mark.slow
def test_record_stream_bench_catches_the_planted_defect():
    from kvcxl.tb.runner import TbFailure, run_unit

    with pytest.raises(TbFailure, match="records"):
        run_unit("record_stream", "icarus", count=24, seed=1, defect="hold_writes")


@pytest.mark.slow
def test_record_stream_bench_behind_a_memory_that_takes_data_first():
    """The cocotb bench (Icarus) behind a DRAM that takes a burst's write data before its
    command: the engine's victims and records equal the golden step; the planted
    ``early_done`` (the sweep ends before its last write command) leaves words unwritten."""
    from kvcxl.tb.record_stream_model import run as bench
    from kvcxl.tb.runner import TbFailure

    shape = {"entries": 32, "lanes": 4, "batch": 4, "burst": 4, "latency": 3, "sweeps": 12}
    r = bench("icarus", **shape, data_first=True)
    assert r["mismatches"] == 0 and r["data_first"] and r["dram_words_written"] > 0
    with pytest.raises(TbFailure, match="records"):
        bench("icarus", **shape, data_first=True, defect="early_done")
