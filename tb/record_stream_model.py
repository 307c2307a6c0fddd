"""The records-in-DRAM engine's world: a DRAM model behind its memory port, and what
every sweep must answer.

:class:`Dram` is the device DRAM the engine (rtl/record_stream.py) streams its records
from: burst commands queue up to ``depth`` deep per direction; a read burst's first word
is offered ``latency`` cycles after its command was taken, the rest in order; reads and
writes share ``bytes_per_cycle`` of bandwidth (a word costs its bits / 8 bytes; unused
bandwidth is not banked beyond two words).  With ``data_first`` it takes write data
before the command, as AXI allows: it buffers every word offered and takes a write
command only once it holds all of that burst's words (so a sweep's last write command
comes after its last word).  It is cycle-driven (``drive`` then
``sample`` each cycle), so the Amaranth-simulator test and the cocotb bench run the same
model.

What a sweep must answer is the firmware's integer golden step
(:mod:`kvcxl.firmware.golden_step`): ``step`` for an update sweep (victims, and the
records written back), ``evaluate`` for a ``hold`` sweep (victims; the records
unchanged): the on-chip engine's contract, so the victims are the on-chip engine's.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware import golden_step
from kvcxl.firmware.config import PolicyConfig
from kvcxl.rtl import layouts as L
from kvcxl.rtl.record_stream import word_bits

ENTRIES, LANES, BATCH, BURST = 256, 4, 16, 16  # the bench's engine (64 words a sweep)


def params() -> dict:
    """``kvcxl.rtl.export.build("record_stream", **params())``, with the firmware's
    default decay table (the one :func:`int_params` gives the bench)."""
    from kvcxl.rtl.export import default_decay

    return {"entries": ENTRIES, "lanes": LANES, "batch": BATCH, "burst": BURST,
            "decay_init": default_decay()}  # fmt: skip


def _fields() -> list[tuple[str, int, int]]:
    return [(n, f.offset, L._width(f.shape)) for n, f in L.record_layout()]


def pack_words(score, idle, pinned, resident, lanes: int) -> list[int]:
    """Records (one array per field, in entry order) as memory words of ``lanes`` records,
    packed by the engine's layout (rtl/layouts.py ``record_layout``)."""
    cols = {"score": score, "idle": idle, "pinned": pinned, "resident": resident}
    rec = np.zeros(len(score), dtype=np.uint64)
    for name, off, _ in _fields():
        rec |= np.asarray(cols[name], dtype=np.uint64) << np.uint64(off)
    rb = L.record_layout().size
    per = rec.reshape(-1, lanes).tolist()
    return [sum(int(r) << (i * rb) for i, r in enumerate(row)) for row in per]


def unpack_words(words: list[int], lanes: int) -> dict[str, NDArray]:
    """The inverse of :func:`pack_words`: one array per field."""
    rb = L.record_layout().size
    rec = np.array(
        [(w >> (i * rb)) & ((1 << rb) - 1) for w in words for i in range(lanes)], dtype=np.uint64
    )
    return {
        name: ((rec >> np.uint64(off)) & np.uint64((1 << width) - 1)).astype(np.int64)
        for name, off, width in _fields()
    }


@dataclass
class Port:
    """What the engine shows the memory in one cycle (sampled before the clock edge)."""

    rd_cmd_valid: int = 0
    rd_cmd_addr: int = 0
    rd_cmd_len: int = 0
    rd_data_ready: int = 0
    wr_cmd_valid: int = 0
    wr_cmd_addr: int = 0
    wr_cmd_len: int = 0
    wr_data_valid: int = 0
    wr_data: int = 0


class Dram:
    """Device DRAM behind the engine's memory port (see the module doc)."""

    def __init__(
        self,
        words: list[int],
        lanes: int,
        latency: int = 20,
        bytes_per_cycle: float | None = None,
        depth: int = 4,
        data_first: bool = False,
    ) -> None:
        self.mem = list(words)
        self.data_first = data_first
        self.wbuf: deque[int] = deque()  # write words taken before their command
        self.word_bytes = word_bits(lanes) / 8
        self.latency, self.depth = latency, depth
        self.bpc = 2 * self.word_bytes if bytes_per_cycle is None else bytes_per_cycle
        self.cap = max(2 * self.word_bytes, self.bpc)
        self.tokens = self.cap
        self.rq: deque[list[int]] = deque()  # [addr, words left, cycle the data may start]
        self.wq: deque[list[int]] = deque()  # [addr, words left]
        self.now = 0
        self.turn = 0  # who goes first when the bandwidth allows one word only
        self.reads = self.writes = 0  # words moved
        # what this cycle offers
        self.rd_cmd_ready = self.wr_cmd_ready = self.rd_valid = self.wr_ready = 0
        self.rd_word = 0

    def drive(self, offer: Port | None = None) -> None:
        """Decide this cycle's ready and valid outputs.  A ``data_first`` memory looks at
        what the engine offers this cycle (``offer``: its write command's valid and length,
        its write data's valid; all from its registers), as an AXI slave may wait for a
        valid before its ready."""
        self.rd_cmd_ready = int(len(self.rq) < self.depth)
        wb = self.word_bytes
        can_r = bool(self.rq) and self.rq[0][2] <= self.now and self.tokens >= wb
        if self.data_first:
            if offer is None:
                raise ValueError("offer = None: a data_first Dram must see the engine's offer")
            self.wr_cmd_ready = int(offer.wr_cmd_valid and len(self.wbuf) >= offer.wr_cmd_len)
            can_w = bool(offer.wr_data_valid) and self.tokens >= wb
        else:
            self.wr_cmd_ready = int(len(self.wq) < self.depth)
            can_w = bool(self.wq) and self.tokens >= wb
        if can_r and can_w and self.tokens < 2 * wb:
            can_r, can_w = (True, False) if self.turn == 0 else (False, True)
        self.rd_valid, self.wr_ready = int(can_r), int(can_w)
        self.rd_word = self.mem[self.rq[0][0]] if can_r else 0

    def sample(self, p: Port) -> None:
        """Apply the transfers of this cycle's edge and move on one cycle."""
        wb = self.word_bytes
        if self.rd_valid and p.rd_data_ready:
            head = self.rq[0]
            head[0] += 1
            head[1] -= 1
            if head[1] == 0:
                self.rq.popleft()
            self.tokens -= wb
            self.reads += 1
            self.turn = 1
        if self.wr_ready and p.wr_data_valid and self.data_first:
            self.wbuf.append(p.wr_data)
            self.tokens -= wb
            self.writes += 1
            self.turn = 0
        elif self.wr_ready and p.wr_data_valid:
            head = self.wq[0]
            self.mem[head[0]] = p.wr_data
            head[0] += 1
            head[1] -= 1
            if head[1] == 0:
                self.wq.popleft()
            self.tokens -= wb
            self.writes += 1
            self.turn = 0
        if self.rd_cmd_ready and p.rd_cmd_valid:
            self.rq.append([p.rd_cmd_addr, p.rd_cmd_len, self.now + 1 + self.latency])
        if self.wr_cmd_ready and p.wr_cmd_valid and self.data_first:
            for a in range(p.wr_cmd_addr, p.wr_cmd_addr + p.wr_cmd_len):
                self.mem[a] = self.wbuf.popleft()
        elif self.wr_cmd_ready and p.wr_cmd_valid:
            self.wq.append([p.wr_cmd_addr, p.wr_cmd_len])
        self.tokens = min(self.tokens + self.bpc, self.cap)
        self.now += 1


@dataclass
class Sweep:
    """One sweep the bench runs, and what the firmware says it must answer."""

    hold: bool
    k: int
    weights: NDArray  # Q0.16 per entry
    read: NDArray  # bool per entry
    want: list[tuple[int, int]]  # (index, priority) in eviction order
    after: dict[str, NDArray]  # the records after the sweep


def int_params(config: PolicyConfig | None = None) -> golden_step.IntParams:
    return golden_step.IntParams.from_config(config or PolicyConfig())


def random_records(rng: random.Random, n: int) -> dict[str, NDArray]:
    """Records with the corners among them (scores 0, 1 and Q_MAX, idle at its ceiling)."""
    g = np.random.default_rng(rng.randrange(1 << 32))
    score = np.where(g.random(n) < 0.5, g.choice([0, 1, fx.Q_MAX], n), g.integers(0, fx.Q_ONE, n))
    idle = np.where(
        g.random(n) < 0.5, g.choice([0, fx.IDLE_MAX, fx.IDLE_MAX - 1], n), g.integers(0, 300, n)
    )
    return {
        "score": score.astype(np.int64),
        "idle": idle.astype(np.int64),
        "pinned": (g.random(n) < 0.1).astype(np.int64),
        "resident": (g.random(n) < 0.8).astype(np.int64),
    }


def random_sweeps(
    rng: random.Random, recs: dict[str, NDArray], count: int, batch: int, params
) -> list[Sweep]:
    """``count`` sweeps (a third of them ``hold`` evaluations), each with random weights,
    reads and k, and the golden step's answer, the records carried from one to the next."""
    n = recs["score"].size
    g = np.random.default_rng(rng.randrange(1 << 32))
    out = []
    state = {k: v.copy() for k, v in recs.items()}
    for _ in range(count):
        hold = rng.random() < 0.33
        k = rng.choice([0, 1, batch, rng.randint(0, batch)])
        w = np.where(g.random(n) < 0.5, g.choice([0, fx.Q_MAX], n), g.integers(0, fx.Q_ONE, n))
        read = g.random(n) < 0.5
        elig = (state["resident"] == 1) & (state["pinned"] == 0)
        fn = golden_step.evaluate if hold else golden_step.step
        res = fn(state["score"], state["idle"], w, read, elig, k, params)
        if not hold:
            state = {**state, "score": res.score, "idle": res.idle}
        out.append(Sweep(hold, k, w, read, res.pairs(), {k_: v.copy() for k_, v in state.items()}))
    return out


def pack_updates(weights: NDArray, read: NDArray, hold: bool, lanes: int) -> list[int]:
    """A sweep's ``upd`` beats, packed by the engine's layout (``update_layout``)."""
    lay = L.update_layout(lanes)
    w = np.asarray(weights, dtype=np.int64).reshape(-1, lanes)
    r = np.asarray(read, dtype=np.int64).reshape(-1, lanes)
    wb = L.Q_BITS
    out = [0] * w.shape[0]
    for i in range(lanes):
        sh = lay["weight"].offset + i * wb
        for a, v in enumerate(w[:, i].tolist()):
            out[a] |= v << sh
        sh = lay["read"].offset + i
        for a, v in enumerate(r[:, i].tolist()):
            out[a] |= v << sh
    if hold:
        out = [x | (1 << lay["hold"].offset) for x in out]
    return out


def run(
    sim: str = "verilator",
    *,
    entries: int = ENTRIES,
    lanes: int = LANES,
    batch: int = BATCH,
    burst: int = BURST,
    latency: int = 20,
    bytes_per_cycle: float | None = None,
    depth: int = 4,
    sweeps: int = 4,
    seed: int = 1,
    data_first: bool = False,
    defect: str | None = None,
) -> dict:
    """The cocotb bench on an engine of any size (``kvcxl.tb.runner.run_unit`` builds the
    registry's bench shape): ``sweeps`` random sweeps behind a DRAM of ``latency`` cycles
    and ``bytes_per_cycle`` (None: two words a cycle, never the bound), taking write data
    before its command with ``data_first``, the engine with a planted ``defect`` if given;
    the bench's figures (cycles per sweep, records per cycle, DRAM bytes per cycle)."""
    from kvcxl.rtl import designs, toolchain
    from kvcxl.rtl.export import build, default_decay, to_verilog, write_if_changed
    from kvcxl.tb import runner

    toolchain.apply_env()
    d = designs.get("record_stream")
    shape = {"entries": entries, "lanes": lanes, "batch": batch, "burst": burst}
    tag = f"{entries}x{lanes}-b{batch}-{burst}" + (f"-{defect}" if defect else "")
    bdir = runner.build_root() / f"{sim}-record_stream-{tag}"
    src = bdir / f"{d.module}.v"
    extra = {"defect": defect} if defect else {}
    text = to_verilog(build("record_stream", **shape, decay_init=default_decay(), **extra),
                      d.module)  # fmt: skip
    write_if_changed(src, runner.icarus_start(text) if sim == "icarus" else text)
    cfg = {**shape, "sweeps": sweeps, "seed": seed, "latency": latency,
           "bytes_per_cycle": bytes_per_cycle, "depth": depth, "data_first": data_first,
           "design": "record_stream", "results": str(bdir / f"results-{seed}.json")}  # fmt: skip
    res, *_ = runner._cocotb(sim, src, d.module, bdir, f"kvcxl.tb.{d.bench}", cfg, seed)
    return res
