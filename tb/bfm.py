"""Pin-level bus functional model of PolicyCore: one clock loop drives and samples every stream.

Each cycle, at the falling edge, the loop decides the inputs for the next rising
edge (a beat from a queue, or a random gap; a random ``victim.ready``), then waits
for ``ReadOnly`` and records what the rising edge will transfer (valid ∧ ready).
Driving and sampling in the middle of the cycle behaves the same on Verilator and
Icarus, which disagree on what a read right at the rising edge returns.

Payloads are packed and unpacked with the RTL's own layouts (:mod:`kvcxl.rtl.layouts`).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import cocotb
from cocotb.clock import Clock
from cocotb.queue import Queue
from cocotb.triggers import Event, FallingEdge, ReadOnly, RisingEdge

from kvcxl.rtl import layouts as L


@dataclass
class Pressure:
    """Random back-pressure: probability that a source withholds a beat / a sink is not ready."""

    upd_gap: float = 0.1
    rec_gap: float = 0.2
    victim_stall: float = 0.15


@dataclass
class Counters:
    cycles: int = 0
    upd_beats: int = 0
    upd_stalls: int = 0  # upd valid while the DUT is not ready
    upd_gaps: int = 0  # the source withheld a beat
    rec_beats: int = 0
    rec_stalls: int = 0
    victim_beats: int = 0
    victim_stalls: int = 0  # victim valid while the testbench is not ready
    scored_beats: int = 0
    table_writes: int = 0
    extra: dict = field(default_factory=dict)


class PolicyCoreBfm:
    def __init__(self, dut, lanes: int, entries: int, batch: int, rng: random.Random):
        self.dut, self.lanes, self.entries, self.batch = dut, lanes, entries, batch
        self.groups = entries // lanes
        addr_bits = max((self.groups - 1).bit_length(), 1)
        index_bits = max((entries - 1).bit_length(), 1)
        self.upd_layout = L.update_layout(lanes)
        self.rec_layout = L.record_write_layout(lanes, addr_bits)
        self.table_layout = L.table_write_layout()
        self.unpack_scored = L.unpacker(L.scored_group_layout(lanes, addr_bits))
        self.unpack_victim = L.unpacker(L.victim_layout(index_bits))
        self.rng = rng
        self.pressure = Pressure()
        self.count = Counters()
        self.upd_q: deque[int] = deque()
        self.rec_q: deque[int] = deque()
        self.table_q: deque[int] = deque()
        self.regs: dict[str, int] = {}
        self.idle = Event()  # set when every queued input beat has been transferred
        # Monitors subscribe here; called inline from the clock loop, in bus order.
        self.on_scored = lambda beat: None  # an unpacked scored beat
        self.on_pass = lambda victims: None  # one eviction pass: [(index, priority), ...]
        self.pass_done = Queue()  # the driver waits on this for the end of a step
        self._victims: list[tuple[int, int]] = []

    async def start(self) -> None:
        d = self.dut
        for sig in ("upd__valid", "rec_w__valid", "table_w__valid", "victim__ready"):
            getattr(d, sig).value = 0
        for sig in ("upd__payload", "rec_w__payload", "table_w__payload", "touch", "shift"):
            getattr(d, sig).value = 0
        d.alpha.value = 1
        d.k.value = self.batch
        d.rst.value = 1
        # The C clock: no Python per edge.
        cocotb.start_soon(Clock(d.clk, 10, unit="ns", impl="gpi").start())
        for _ in range(3):
            await RisingEdge(d.clk)
        d.rst.value = 0
        cocotb.start_soon(self._loop())

    def set_regs(self, **regs: int) -> None:
        self.regs.update(regs)

    async def _loop(self) -> None:
        d, c, p, rng = self.dut, self.count, self.pressure, self.rng
        clk = d.clk
        # Handles fetched once; 1-bit controls written only when they change (each VPI
        # write costs more than the rest of the cycle's Python).
        upd_v, upd_p, upd_r = d.upd__valid, d.upd__payload, d.upd__ready
        rec_v, rec_p, rec_r = d.rec_w__valid, d.rec_w__payload, d.rec_w__ready
        tab_v, tab_p = d.table_w__valid, d.table_w__payload
        sc_v, sc_p = d.scored__valid, d.scored__payload
        vic_v, vic_p, vic_r = d.victim__valid, d.victim__payload, d.victim__ready
        shadow = {"upd": 0, "rec": 0, "tab": 0, "vr": 0}
        sigs = {"upd": upd_v, "rec": rec_v, "tab": tab_v, "vr": vic_r}

        def put(name: str, v: int) -> None:
            if shadow[name] != v:
                shadow[name] = v
                sigs[name].value = v

        upd_valid = rec_valid = False
        falling, readonly = FallingEdge(clk), ReadOnly()
        while True:
            await falling
            c.cycles += 1
            if self.regs:
                for name, v in self.regs.items():
                    getattr(d, name).value = v
                self.regs = {}
            # A beat stays on the bus until it is taken (stream rule: no retraction).
            if not upd_valid and self.upd_q:
                if rng.random() < p.upd_gap:
                    c.upd_gaps += 1
                else:
                    upd_p.value = self.upd_q.popleft()
                    upd_valid = True
            put("upd", int(upd_valid))
            if not rec_valid and self.rec_q and rng.random() >= p.rec_gap:
                rec_p.value = self.rec_q.popleft()
                rec_valid = True
            put("rec", int(rec_valid))
            table_valid = bool(self.table_q)
            if table_valid:
                tab_p.value = self.table_q.popleft()
            put("tab", int(table_valid))
            vready = rng.random() >= p.victim_stall
            put("vr", int(vready))

            await readonly
            if upd_valid:
                if upd_r.value:
                    c.upd_beats += 1
                    upd_valid = False
                else:
                    c.upd_stalls += 1
            if rec_valid:
                if rec_r.value:
                    c.rec_beats += 1
                    rec_valid = False
                else:
                    c.rec_stalls += 1
            if table_valid:
                c.table_writes += 1
            if sc_v.value:
                c.scored_beats += 1
                self.on_scored(self.unpack_scored(int(sc_p.value)))
            if vic_v.value:
                if vready:
                    c.victim_beats += 1
                    v = self.unpack_victim(int(vic_p.value))
                    if not v["empty"]:
                        self._victims.append((v["index"], v["priority"]))
                    if v["last"]:
                        self.on_pass(self._victims)
                        self._victims = []
                        self.pass_done.put_nowait(True)
                else:
                    c.victim_stalls += 1
            if not (upd_valid or rec_valid or self.upd_q or self.rec_q or self.table_q):
                if not self.regs:
                    self.idle.set()

    # --- input helpers used by the driver -------------------------------------------------

    def queue_step(self, weights, read) -> None:
        n = self.lanes
        for g in range(self.groups):
            lo = g * n
            mask = sum(int(bool(read[lo + i])) << i for i in range(n))
            beat = {"weight": [int(w) for w in weights[lo : lo + n]], "read": mask}
            self.upd_q.append(L.pack(self.upd_layout, beat))
        self.idle.clear()

    def queue_records(self, score, idle, pinned, resident) -> None:
        n = self.lanes
        for g in range(self.groups):
            recs = [
                {
                    "score": int(score[g * n + i]),
                    "idle": int(idle[g * n + i]),
                    "pinned": int(pinned[g * n + i]),
                    "resident": int(resident[g * n + i]),
                }
                for i in range(n)
            ]
            self.rec_q.append(L.pack(self.rec_layout, {"addr": g, "data": recs}))
        self.idle.clear()

    def queue_table(self, table) -> None:
        for a, v in enumerate(table):
            self.table_q.append(L.pack(self.table_layout, {"addr": a, "data": int(v)}))
        self.idle.clear()

    async def wait_idle(self) -> None:
        # Let the loop see the new work before waiting for it to drain.
        await FallingEdge(self.dut.clk)
        await FallingEdge(self.dut.clk)
        await self.idle.wait()
