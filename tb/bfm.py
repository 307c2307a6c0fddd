"""Pin-level bus functional model of PolicyCore: its streams through :mod:`kvcxl.tb.streams`.

One :class:`~kvcxl.tb.streams.Clock` loop steps a Source on ``upd``, ``rec_w`` and
``table_w``, a Sink on ``victim`` and a Monitor on the ``scored`` tap, with random gaps
and back-pressure (:class:`Pressure`); the level inputs (α, touch, shift, k) are written
at a falling edge between beats.  Payloads are packed and unpacked with the RTL's own
layouts (:mod:`kvcxl.rtl.layouts`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from cocotb.queue import Queue
from cocotb.triggers import Event, FallingEdge

from kvcxl.rtl import layouts as L
from kvcxl.tb.streams import Clock, Monitor, Pause, Sink, Source


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


class _Regs:
    """The level inputs, written at the falling edge after they were set (a Clock endpoint)."""

    def __init__(self, dut) -> None:
        self.dut, self.pending = dut, {}

    def drive(self) -> None:
        if self.pending:
            for name, v in self.pending.items():
                getattr(self.dut, name).value = v
            self.pending = {}

    def sample(self) -> None:
        pass


class PolicyCoreBfm:
    def __init__(self, dut, lanes: int, entries: int, batch: int, rng: random.Random):
        self.dut, self.lanes, self.entries, self.batch = dut, lanes, entries, batch
        self.groups = entries // lanes
        addr_bits = max((self.groups - 1).bit_length(), 1)
        index_bits = max((entries - 1).bit_length(), 1)
        self.upd_layout = L.update_layout(lanes)
        self.rec_layout = L.record_write_layout(lanes, addr_bits)
        self.table_layout = L.table_write_layout()
        self.scored_layout = L.scored_group_layout(lanes, addr_bits)
        self.victim_layout = L.victim_layout(index_bits)
        self.rng = rng
        self.pressure = Pressure()
        self.regs = _Regs(dut)
        self.idle = Event()  # set when every queued input beat has been transferred
        # Monitors subscribe here; called inline from the clock loop, in bus order.
        self.on_scored = lambda beat: None  # an unpacked scored beat
        self.on_pass = lambda victims: None  # one eviction pass: [(index, priority), ...]
        self.pass_done = Queue()  # the driver waits on this for the end of a step
        self._victims: list[tuple[int, int]] = []

    async def start(self) -> None:
        d, p, rng = self.dut, self.pressure, self.rng
        for sig in ("touch", "shift"):
            getattr(d, sig).value = 0
        d.alpha.value = 1
        d.k.value = self.batch
        # Endpoints in the order the old single loop drew its random numbers (seeds replay).
        self.clock = clk = Clock(d)
        clk.add(self.regs)
        self.upd = Source(clk, "upd", self.upd_layout, Pause(p.upd_gap, rng))
        self.rec = Source(clk, "rec_w", self.rec_layout, Pause(p.rec_gap, rng))
        self.table = Source(clk, "table_w", self.table_layout)
        self.victim = Sink(clk, "victim", self.victim_layout, Pause(p.victim_stall, rng))
        self.victim.keep = False
        self.victim.on_beat.append(self._on_victim)
        self.scored = Monitor(clk, "scored", self.scored_layout)
        self.scored.on_beat.append(lambda beat: self.on_scored(beat))
        clk.on_cycle.append(self._check_idle)
        clk.start_clock()
        await clk.reset()
        clk.start()

    @property
    def count(self) -> Counters:
        """The bus figures so far, from the stream endpoints."""
        return Counters(
            cycles=self.clock.cycles,
            upd_beats=self.upd.beats, upd_stalls=self.upd.stalls, upd_gaps=self.upd.gaps,
            rec_beats=self.rec.beats, rec_stalls=self.rec.stalls,
            victim_beats=self.victim.beats, victim_stalls=self.victim.stalls,
            scored_beats=self.scored.beats, table_writes=self.table.beats,
        )  # fmt: skip

    def set_regs(self, **regs: int) -> None:
        self.regs.pending.update(regs)

    def _on_victim(self, v: dict) -> None:
        if not v["empty"]:
            self._victims.append((v["index"], v["priority"]))
        if v["last"]:
            self.on_pass(self._victims)
            self._victims = []
            self.pass_done.put_nowait(True)

    def _check_idle(self) -> None:
        if self.upd.idle.is_set() and self.rec.idle.is_set() and self.table.idle.is_set():
            if not self.regs.pending:
                self.idle.set()

    # --- input helpers used by the driver -------------------------------------------------

    def queue_step(self, weights, read) -> None:
        n = self.lanes
        for g in range(self.groups):
            lo = g * n
            mask = sum(int(bool(read[lo + i])) << i for i in range(n))
            beat = {"weight": [int(w) for w in weights[lo : lo + n]], "read": mask}
            self.upd.put(beat)
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
            self.rec.put({"addr": g, "data": recs})
        self.idle.clear()

    def queue_table(self, table) -> None:
        for a, v in enumerate(table):
            self.table.put({"addr": a, "data": int(v)})
        self.idle.clear()

    async def wait_idle(self) -> None:
        # Let the loop see the new work before waiting for it to drain.
        await FallingEdge(self.dut.clk)
        await FallingEdge(self.dut.clk)
        await self.idle.wait()
