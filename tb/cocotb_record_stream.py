"""cocotb entry point: the records-in-DRAM engine (rtl/record_stream.py) on Verilator or
Icarus, behind the DRAM model of tb/record_stream_model.py (``Dram``: burst commands,
latency, shared bandwidth).

Random records and sweeps (a third of them ``hold`` evaluations; random weights, reads
and k), the engine's victims (a Sink with random back-pressure) against the firmware's
integer golden step, and after every sweep the records in the DRAM model against the
step's new state.  Reports cycles per sweep, records per cycle and the DRAM's bytes per
cycle.  Configuration in KVCXL_TB_CONFIG (JSON: design, sweeps, seed, results path; and
optionally entries, lanes, batch, burst, latency, bytes_per_cycle, depth and data_first,
the DRAM taking write data before its command, for a sized run:
``kvcxl.tb.record_stream_model.run``).  A sweep's records are compared once ``busy``
falls, which with ``data_first`` can be after its last victim.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
import numpy as np

from kvcxl.rtl import layouts as L
from kvcxl.rtl.record_stream import step_layout
from kvcxl.tb import record_stream_model as M
from kvcxl.tb.streams import Clock, Pause, Sink, Source

STALL = 0.2  # probability that victim is not ready in a cycle


class DramEndpoint:
    """The DRAM model on the engine's four memory streams, stepped by the bench's clock."""

    def __init__(self, clock: Clock, dram: M.Dram) -> None:
        d = clock.dut
        self.d, self.dram = d, dram
        clock.add(self)

    def drive(self) -> None:
        m, d = self.dram, self.d
        offer = None
        if m.data_first:  # it looks at the write command and data on offer (registers)
            wcp = int(d.wr_cmd__payload.value)
            offer = M.Port(wr_cmd_valid=int(d.wr_cmd__valid.value), wr_cmd_len=wcp >> self.abits,
                           wr_data_valid=int(d.wr_data__valid.value))  # fmt: skip
        m.drive(offer)
        d.rd_cmd__ready.value = m.rd_cmd_ready
        d.wr_cmd__ready.value = m.wr_cmd_ready
        d.rd_data__valid.value = m.rd_valid
        if m.rd_valid:
            d.rd_data__payload.value = m.rd_word
        d.wr_data__ready.value = m.wr_ready

    def sample(self) -> None:
        d = self.d
        rcp = int(d.rd_cmd__payload.value)
        wcp = int(d.wr_cmd__payload.value)
        self.dram.sample(
            M.Port(
                int(d.rd_cmd__valid.value), rcp & self.amask, rcp >> self.abits,
                int(d.rd_data__ready.value), int(d.wr_cmd__valid.value), wcp & self.amask,
                wcp >> self.abits, int(d.wr_data__valid.value),
                int(d.wr_data__payload.value) if d.wr_data__valid.value else 0,
            )
        )  # fmt: skip


@cocotb.test()
async def record_stream_test(dut):
    cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
    keys = ("entries", "lanes", "batch", "burst")
    shape = {k: cfg.get(k, M.params()[k]) for k in keys}
    entries, lanes, batch = shape["entries"], shape["lanes"], shape["batch"]
    words = entries // lanes
    rng = random.Random(cfg["seed"])
    prm = M.int_params()
    recs = M.random_records(rng, entries)
    sweeps = M.random_sweeps(rng, recs, cfg["sweeps"], batch, prm)
    dram = M.Dram(
        M.pack_words(recs["score"], recs["idle"], recs["pinned"], recs["resident"], lanes),
        lanes, cfg.get("latency", 20), cfg.get("bytes_per_cycle"), cfg.get("depth", 4),
        cfg.get("data_first", False),
    )  # fmt: skip
    clock = Clock(dut)
    addr_bits = max((words - 1).bit_length(), 1)
    mem = DramEndpoint(clock, dram)
    mem.abits, mem.amask = addr_bits, (1 << addr_bits) - 1
    step = Source(clock, "step", step_layout())
    upd = Source(clock, "upd", L.update_layout(lanes))
    victim = Sink(clock, "victim", L.victim_layout(max((entries - 1).bit_length(), 1)),
                  Pause(STALL, rng))  # fmt: skip
    dut.alpha.value, dut.touch.value, dut.shift.value = prm.alpha_q, prm.touch_q, prm.shift
    clock.start_clock()
    await clock.reset(cycles=2)
    clock.start()
    bad: list[str] = []
    per_sweep: list[int] = []
    for s, sw in enumerate(sweeps):
        dut.k.value = sw.k
        start = clock.cycles
        step.put({"hold": int(sw.hold)})
        for bits in M.pack_updates(sw.weights, sw.read, sw.hold, lanes):
            upd.put(bits)
        got = []
        while True:
            beat = await victim.recv(timeout=50 * words + 2000)
            if beat is None:
                bad.append(f"sweep {s}: no last victim (a hang)")
                break
            if not beat["empty"]:
                got.append((beat["index"], beat["priority"]))
            if beat["last"]:
                break
        per_sweep.append(clock.cycles - start)
        # The sweep is over when busy falls: a memory that took the data first may take
        # the last write command after the last victim (the records land with it).
        for _ in range(50 * words + 2000):
            if not int(dut.busy.value):
                break
            await clock.wait()
        else:
            bad.append(f"sweep {s}: busy never fell (a hang)")
        if got != sw.want:
            bad.append(f"sweep {s} ({'hold' if sw.hold else 'update'}, k {sw.k}): "
                       f"victims {got[:4]}, firmware {sw.want[:4]}")  # fmt: skip
        after = M.unpack_words(dram.mem, lanes)
        for f in ("score", "idle", "pinned", "resident"):
            if not np.array_equal(after[f], sw.after[f]):
                bad.append(f"sweep {s}: records' {f} differ from the golden step")
        if bad:
            break
    total = sum(per_sweep)
    res = {
        "simulator": cocotb.SIM_NAME,
        "design": cfg["design"],
        **shape,
        "latency": dram.latency,
        "depth": dram.depth,
        "data_first": dram.data_first,
        "bytes_per_cycle": dram.bpc,
        "word_bytes": dram.word_bytes,
        "sweeps": len(per_sweep),
        "hold_sweeps": sum(sw.hold for sw in sweeps[: len(per_sweep)]),
        "victims": sum(len(sw.want) for sw in sweeps[: len(per_sweep)]),
        "cycles_per_sweep": per_sweep,
        "records_per_cycle": round(entries * len(per_sweep) / total, 4) if total else None,
        "dram_words_read": dram.reads,
        "dram_words_written": dram.writes,
        "dram_bytes_per_cycle": round((dram.reads + dram.writes) * dram.word_bytes / total, 3)
        if total
        else None,
        "mismatches": len(bad),
        "examples": [b[:300] for b in bad[:3]],
        "cycles": clock.cycles,
        "victim_stalls": victim.stalls,
    }
    with open(cfg["results"], "w") as f:
        json.dump(res, f, indent=2)
    assert not bad, f"{len(bad)} mismatches: {res['examples']}"
