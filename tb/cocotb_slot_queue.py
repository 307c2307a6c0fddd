"""cocotb + pyuvm entry point: a slot-queue engine (CLOCK, SIEVE or S3-FIFO) on Verilator or
Icarus.

A pyuvm environment: a sequence of random host commands (``slot_queue_model.script``;
S3-FIFO's from ``s3fifo_model.script``),
a driver that puts each on ``cmd`` through a stream Source (a WALK is done when its last
victim has left), a monitor that groups the ``victim`` stream (a Sink with random
back-pressure) into walks and one that counts the ``visit`` tap, and a scoreboard that
predicts every walk with the golden step (:class:`kvcxl.firmware.golden_clock.SlotQueue`,
:class:`kvcxl.firmware.golden_s3fifo.S3Queue`).
Configuration in KVCXL_TB_CONFIG (JSON: design, commands, seed, results path).
"""

from __future__ import annotations

import json
import os
import random
from collections import deque

import cocotb
import pyuvm
from cocotb.queue import Queue
from pyuvm import (
    ConfigDB,
    uvm_analysis_port,
    uvm_component,
    uvm_driver,
    uvm_env,
    uvm_root,
    uvm_sequence,
    uvm_sequence_item,
    uvm_sequencer,
    uvm_subscriber,
    uvm_test,
)

from kvcxl.firmware import golden_clock as gc
from kvcxl.firmware import golden_s3fifo as gs
from kvcxl.rtl import layouts as L
from kvcxl.rtl.s3fifo import arg_bits
from kvcxl.tb import s3fifo_model
from kvcxl.tb.slot_queue_model import SLOTS, script
from kvcxl.tb.streams import Clock, Monitor, Pause, Sink, Source

STALL = 0.3  # probability that victim is not ready in a cycle
KINDS = {L.VISIT_SKIP: "skipped", L.VISIT_DECREMENT: "decremented", L.VISIT_VICTIM: "evicted",
         L.VISIT_PROMOTE: "promoted"}  # fmt: skip


def model(design: str, ceiling: int = 1):
    """(``script(n, rng)``, the golden step for ``ceiling``, the width of ``arg``)."""
    if design == "s3fifo":
        ids = s3fifo_model.IDS
        return s3fifo_model.script, gs.S3Queue(SLOTS, ids, ceiling), arg_bits(SLOTS, ids)
    return (
        (lambda n, rng: script(design, n, rng)),
        gc.SlotQueue(SLOTS, design, ceiling),
        (SLOTS.bit_length()),
    )


class CmdItem(uvm_sequence_item):
    """One host command (op, slot, arg, keep)."""

    def __init__(self, name: str, cmd: tuple[int, int, int, int]):
        super().__init__(name)
        self.cmd = cmd


class CmdSeq(uvm_sequence):
    def __init__(self, name: str, cmds: list):
        super().__init__(name)
        self.cmds = cmds

    async def body(self):
        for i, c in enumerate(self.cmds):
            item = CmdItem(f"cmd{i}", c)
            await self.start_item(item)
            await self.finish_item(item)


class Bus:
    """The engine's pins through the stream BFMs: Source on cmd, Sink on victim, Monitor on
    the visit tap; ``walks`` receives each walk's victims when its last beat has moved."""

    def __init__(self, dut, rng: random.Random, ceiling: int, cb: int) -> None:
        ib = max((SLOTS - 1).bit_length(), 1)
        dut.ref_max.value = ceiling
        self.clock = Clock(dut)
        self.cmd = Source(self.clock, "cmd", L.slot_cmd_layout(ib, cb))
        self.victim = Sink(self.clock, "victim", L.slot_victim_layout(ib), Pause(STALL, rng))
        self.victim.keep = False
        self.visit = Monitor(self.clock, "visit", L.slot_visit_layout(ib))
        self.walks: Queue = Queue()
        self._walk: list[int] = []
        self.victim.on_beat.append(self._on_victim)

    def _on_victim(self, beat: dict) -> None:
        if not beat["empty"]:
            self._walk.append(beat["index"])
        if beat["last"]:
            self.walks.put_nowait(self._walk)
            self._walk = []

    async def start(self) -> None:
        self.clock.start_clock()
        await self.clock.reset(cycles=2)
        self.clock.start()


class Driver(uvm_driver):
    def build_phase(self):
        self.ap = uvm_analysis_port("ap", self)
        self.bus = ConfigDB().get(self, "", "BUS")

    async def run_phase(self):
        bus = self.bus
        while True:
            item = await self.seq_item_port.get_next_item()
            self.ap.write(item)  # predicted before the engine answers
            op, s, arg, keep = item.cmd
            bus.cmd.put({"op": op, "slot": s, "arg": arg, "keep": keep})
            await bus.cmd.flush()
            self.seq_item_port.item_done()


class WalkMonitor(uvm_component):
    """Each walk's victims, in stream order, when its last beat has moved."""

    def build_phase(self):
        self.ap = uvm_analysis_port("ap", self)
        self.bus = ConfigDB().get(self, "", "BUS")

    async def run_phase(self):
        while True:
            self.ap.write(await self.bus.walks.get())


class _Port(uvm_subscriber):
    def __init__(self, name, parent, fn):
        super().__init__(name, parent)
        self.fn = fn

    def write(self, t):
        self.fn(t)


class Scoreboard(uvm_component):
    """Predicts each walk with the golden step; counts walks, victims and mismatches."""

    def build_phase(self):
        cfg = ConfigDB().get(self, "", "CFG")
        _, self.golden, _ = model(cfg["design"], cfg["ref_max"])
        self.want: deque[list[int]] = deque()
        self.walks = self.victims = self.empty = 0
        self.bad: list[str] = []
        self.cmd = _Port("cmd", self, self._on_cmd)
        self.got = _Port("got", self, self._on_walk)

    def _on_cmd(self, item: CmdItem) -> None:
        out = self.golden.run([item.cmd])
        if item.cmd[0] == gc.Op.WALK:
            self.want.append(out)

    def _on_walk(self, got: list[int]) -> None:
        want = self.want.popleft() if self.want else None
        if got != want:
            self.bad.append(f"walk {self.walks}: victims {got}, golden step {want}")
        self.walks += 1
        self.victims += len(got)
        self.empty += not got


class SlotEnv(uvm_env):
    def build_phase(self):
        self.seqr = uvm_sequencer("seqr", self)
        self.driver = Driver("driver", self)
        self.walk_mon = WalkMonitor("walk_mon", self)
        self.scoreboard = Scoreboard("scoreboard", self)

    def connect_phase(self):
        self.driver.seq_item_port.connect(self.seqr.seq_item_export)
        self.driver.ap.connect(self.scoreboard.cmd.analysis_export)
        self.walk_mon.ap.connect(self.scoreboard.got.analysis_export)


@pyuvm.test()
class SlotQueueTest(uvm_test):
    def build_phase(self):
        cfg = json.loads(os.environ["KVCXL_TB_CONFIG"])
        rng = random.Random(cfg["seed"])
        run, _, cb = model(cfg["design"])
        ceiling, self.cmds, _ = run(cfg["commands"], rng)
        self.cfg = {**cfg, "ref_max": ceiling}
        self.bus = Bus(cocotb.top, rng, ceiling, cb)
        self.visits = dict.fromkeys(KINDS.values(), 0)
        self.bus.visit.on_beat.append(self._on_visit)
        ConfigDB().set(None, "*", "BUS", self.bus)
        ConfigDB().set(None, "*", "CFG", self.cfg)
        self.env = SlotEnv("env", self)

    def _on_visit(self, beat: dict) -> None:
        self.visits[KINDS[beat["kind"]]] += 1

    async def run_phase(self):
        self.raise_objection()
        bus = self.bus
        await bus.start()
        seq = cocotb.start_soon(CmdSeq("seq", self.cmds).start(self.env.seqr))
        # A walk ends within `bound` cycles (8 slots, counters of at most 3 bits): an engine
        # that takes no command for longer has hung (the run stops instead of waiting).
        bound = 20 * SLOTS * (self.cfg["ref_max"] + 2) + 100
        seen, idle = -1, 0
        while not (seq.done() and not self.env.scoreboard.want) and idle < bound:
            await bus.clock.wait()
            idle = idle + 1 if (bus.cmd.beats, bus.victim.beats) == seen else 0
            seen = (bus.cmd.beats, bus.victim.beats)
        self.hung = not seq.done()
        if self.hung:
            seq.cancel()
        self.drop_objection()

    def check_phase(self):
        sb, bus = self.env.scoreboard, self.bus
        if self.hung or sb.want:
            sb.bad.append(f"{len(sb.want)} walks never ended (a hang)")
        res = {
            "simulator": cocotb.SIM_NAME,
            "design": self.cfg["design"],
            "ref_max": self.cfg["ref_max"],
            "commands": len(self.cmds),
            "walks": sb.walks,
            "empty_walks": sb.empty,
            "victims": sb.victims,
            **self.visits,
            "mismatches": len(sb.bad),
            "examples": [b[:300] for b in sb.bad[:3]],
            "cycles": bus.clock.cycles,
            "victim_stalls": bus.victim.stalls,
            "cmd_stalls": bus.cmd.stalls,
        }
        with open(self.cfg["results"], "w") as f:
            json.dump(res, f, indent=2)
        assert not sb.bad, f"{len(sb.bad)} mismatches: {res['examples']}"


__all__ = ["SlotQueueTest", "uvm_root"]
