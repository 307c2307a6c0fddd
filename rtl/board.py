"""The board top: the policy core behind a UART host link, and the link's protocol table.

A host loads records, the decay table and the parameters, sends a pass's sweep beats
and reads the victims over a serial line.  Every exchange is one command: the host
sends an opcode byte and the command's request bytes, the board answers with a status
byte and the command's reply bytes.  Requests and replies are the engine's own stream
payloads (:mod:`kvcxl.rtl.layouts`), little-endian, padded to whole bytes, so their
lengths follow from the engine's shape (the ``info`` reply tells it).

:data:`COMMANDS` is the one protocol table: the command decoder below is generated
from it, the host driver (:mod:`kvcxl.rtl.host`) packs with it and docs/rtl.md's table
is :func:`markdown_table`.  :data:`BOARDS` sizes the engine for each FPGA board.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Elaboratable, Module, Signal, unsigned
from amaranth.lib import data, fifo, io, wiring
from amaranth.lib.wiring import In, Out

from . import layouts as L
from .core import PolicyCore
from .uart import UartRx, UartTx

PROTOCOL_VERSION = 1
MAGIC = 0x4B  # "K": the first byte of the info reply
STATUS = {
    "ok": 0x06,  # the command was carried out; its reply bytes follow
    "none": 0x15,  # victim: no victim is waiting (zero bytes follow)
    "unknown": 0x3F,  # not an opcode of COMMANDS: no bytes follow
}
RX_FIFO_DEPTH = 16  # request bytes buffered while a command executes or replies


@dataclass(frozen=True)
class Command:
    opcode: int
    name: str
    request: str | None  # the payload layout the host sends (a key of EngineShape.layouts)
    reply: str | None  # the payload layout after the status byte
    doc: str


COMMANDS: tuple[Command, ...] = (
    Command(0x49, "info", None, "info", "protocol version and the engine's shape"),
    Command(0x50, "params", "params", None, "set α, touch threshold, decay shift and k"),
    Command(0x52, "record", "rec_w", None, "write one memory word: `lanes` records at addr"),
    Command(0x54, "table", "table_w", None, "write one entry of the decay table"),
    Command(
        0x55,
        "update",
        "upd",
        None,
        "one sweep beat (weights, read flags of `lanes` entries, in address order); the "
        "table's last word ends the pass and starts the eviction; waits while the engine "
        "is busy",
    ),
    Command(
        0x56,
        "victim",
        None,
        "victim",
        "take the next victim of the pass: status ok and the victim beat, or status none "
        "(nothing waiting yet)",
    ),
)
BY_NAME = {c.name: c for c in COMMANDS}


def info_layout() -> data.StructLayout:
    return data.StructLayout(
        {
            "magic": unsigned(8),
            "version": unsigned(8),
            "entries": unsigned(16),
            "lanes": unsigned(8),
            "batch": unsigned(16),
        }
    )


def params_layout(batch: int) -> data.StructLayout:
    """The core's parameter inputs, held in board registers between ``params`` commands."""
    return data.StructLayout(
        {
            "alpha": unsigned(L.ALPHA_BITS),
            "touch": unsigned(L.Q_BITS),
            "shift": unsigned(L.SHIFT_BITS),
            "k": unsigned(max(batch.bit_length(), 1)),
        }
    )


def nbytes(layout: data.Layout | None) -> int:
    return 0 if layout is None else (layout.size + 7) // 8


@dataclass(frozen=True)
class EngineShape:
    entries: int
    lanes: int
    batch: int

    def check(self) -> None:
        if self.lanes < 1 or self.entries < self.lanes or self.entries % self.lanes:
            raise ValueError(
                f"entries = {self.entries}, lanes = {self.lanes}: entries must be a positive "
                "multiple of lanes"
            )
        if not 1 <= self.entries < 1 << 16 or not 1 <= self.lanes < 256:
            raise ValueError(f"{self}: entries must be < 65536 and lanes < 256 (info reply)")
        if not 1 <= self.batch < 1 << 16:
            raise ValueError(f"batch = {self.batch}: must be in [1, 65535]")

    @property
    def groups(self) -> int:
        return self.entries // self.lanes

    def layouts(self) -> dict[str, data.Layout]:
        """Every payload of the protocol, by the name COMMANDS uses."""
        addr_bits = max((self.groups - 1).bit_length(), 1)  # as the scoring engine's
        index_bits = max((self.entries - 1).bit_length(), 1)  # as the eviction engine's
        return {
            "info": info_layout(),
            "params": params_layout(self.batch),
            "rec_w": L.record_write_layout(self.lanes, addr_bits),
            "table_w": L.table_write_layout(),
            "upd": L.update_layout(self.lanes),
            "victim": L.victim_layout(index_bits),
        }

    def info(self) -> dict:
        return {
            "magic": MAGIC,
            "version": PROTOCOL_VERSION,
            "entries": self.entries,
            "lanes": self.lanes,
            "batch": self.batch,
        }


@dataclass(frozen=True)
class BoardSpec:
    platform: str  # module:class in amaranth_boards
    shape: EngineShape
    baud: int
    note: str


BOARDS: dict[str, BoardSpec] = {
    "ulx3s-85f": BoardSpec(
        "amaranth_boards.ulx3s:ULX3S_85F_Platform",
        EngineShape(entries=4096, lanes=1, batch=16),
        115200,
        "LFE5U-85F, 25 MHz clock; UART on the FTDI port",
    ),
    "icebreaker": BoardSpec(
        "amaranth_boards.icebreaker:ICEBreakerPlatform",
        EngineShape(entries=256, lanes=1, batch=8),
        115200,
        "iCE40UP5K, 12 MHz clock; UART on the FTDI port; a smaller table and top-k to fit "
        "5,280 logic cells",
    ),
}


class BoardTop(wiring.Component):
    """PolicyCore + UART + the command decoder generated from :data:`COMMANDS`.

    ``divisor`` is the UART bit time in clock cycles.
    """

    def __init__(self, shape: EngineShape, divisor: int, *, decay_init=None):
        shape.check()
        self.shape = shape
        self.divisor = divisor
        self.core = PolicyCore(shape.entries, shape.lanes, shape.batch, decay_init=decay_init)
        self.layouts = shape.layouts()
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.urx = urx = UartRx(self.divisor)
        m.submodules.utx = utx = UartTx(self.divisor)
        m.submodules.rxq = rxq = fifo.SyncFIFOBuffered(width=8, depth=RX_FIFO_DEPTH)
        m.d.comb += [
            urx.rx.eq(self.rx),
            self.tx.eq(utx.tx),
            rxq.w_data.eq(urx.data.payload),
            rxq.w_en.eq(urx.data.valid),
            urx.data.ready.eq(rxq.w_rdy),
        ]
        lay = self.layouts
        req_len = {c.opcode: nbytes(lay.get(c.request)) for c in COMMANDS}
        rep_len = {c.opcode: 1 + nbytes(lay.get(c.reply)) for c in COMMANDS}
        max_req, max_rep = max(req_len.values()), max(rep_len.values())

        # Parameter registers, reset to the core's defaults.
        p_lay = lay["params"]
        params = Signal(p_lay, init={"alpha": core.alpha.init, "k": self.shape.batch})
        m.d.comb += [
            core.alpha.eq(params.alpha),
            core.touch.eq(params.touch),
            core.shift.eq(params.shift),
            core.k.eq(params.k),
        ]

        op = Signal(8)
        # Request bytes shift in from the top: a command of n bytes ends in the top n.
        buf = Signal(8 * max(max_req, 1))
        left = Signal(range(max_req + 1))
        reply = Signal(8 * max_rep)
        rleft = Signal(range(max_rep + 1))

        def request(c: Command):
            n = req_len[c.opcode]
            return buf[8 * (max_req - n) : 8 * (max_req - n) + lay[c.request].size]

        def answer(status: str, payload=None, c: Command | None = None):
            parts = [Const(STATUS[status], 8)]
            if payload is not None:
                parts.append(payload)
            return [reply.eq(Cat(*parts)), rleft.eq(rep_len[c.opcode] if c else 1)]

        streams = {"rec_w": core.rec_w, "table_w": core.table_w, "upd": core.upd}
        with m.FSM():
            with m.State("OPCODE"):
                m.d.comb += rxq.r_en.eq(1)
                with m.If(rxq.r_rdy):
                    m.d.sync += op.eq(rxq.r_data)
                    with m.Switch(rxq.r_data):
                        for c in COMMANDS:
                            with m.Case(c.opcode):
                                if req_len[c.opcode]:
                                    m.d.sync += left.eq(req_len[c.opcode])
                                    m.next = "ARGS"
                                else:
                                    m.next = "EXEC"
                        with m.Default():
                            m.d.sync += answer("unknown")
                            m.next = "REPLY"
            with m.State("ARGS"):
                m.d.comb += rxq.r_en.eq(1)
                with m.If(rxq.r_rdy):
                    m.d.sync += [buf.eq(Cat(buf[8:], rxq.r_data)), left.eq(left - 1)]
                    with m.If(left == 1):
                        m.next = "EXEC"
            with m.State("EXEC"):
                with m.Switch(op):
                    for c in COMMANDS:
                        with m.Case(c.opcode):
                            self._execute(m, c, request, answer, streams, params, core)
            with m.State("REPLY"):
                m.d.comb += [utx.data.valid.eq(1), utx.data.payload.eq(reply[:8])]
                with m.If(utx.data.ready):
                    m.d.sync += [reply.eq(reply >> 8), rleft.eq(rleft - 1)]
                    with m.If(rleft == 1):
                        m.next = "OPCODE"
        return m

    def _execute(self, m, c: Command, request, answer, streams, params, core) -> None:
        if c.name == "info":
            info = L.pack(self.layouts["info"], self.shape.info())
            m.d.sync += answer("ok", Const(info, self.layouts["info"].size), c)
            m.next = "REPLY"
        elif c.name == "params":
            m.d.sync += [params.eq(request(c)), *answer("ok", None, c)]
            m.next = "REPLY"
        elif c.name == "victim":
            m.d.comb += core.victim.ready.eq(1)
            with m.If(core.victim.valid):
                m.d.sync += answer("ok", core.victim.payload.as_value(), c)
            with m.Else():
                m.d.sync += answer("none", Const(0, self.layouts["victim"].size), c)
            m.next = "REPLY"
        else:  # a stream of the core: hold the beat until it is taken
            port = streams[c.request]
            m.d.comb += [port.valid.eq(1), port.payload.eq(request(c))]
            with m.If(port.ready):
                m.d.sync += answer("ok", None, c)
                m.next = "REPLY"


class BoardDesign(Elaboratable):
    """:class:`BoardTop` on a board's clock and UART pins at the board's baud rate."""

    def __init__(self, board: str, *, decay_init=None):
        if board not in BOARDS:
            raise ValueError(f"board = {board!r}: must be one of {sorted(BOARDS)}")
        self.spec = BOARDS[board]
        self.decay_init = decay_init
        self.divisor: int | None = None

    def elaborate(self, platform):
        m = Module()
        self.divisor = round(platform.default_clk_frequency / self.spec.baud)
        m.submodules.board = top = BoardTop(
            self.spec.shape, self.divisor, decay_init=self.decay_init
        )
        uart = platform.request("uart", 0, dir="-")
        m.submodules.rx_buf = rx_buf = io.Buffer("i", uart.rx)
        m.submodules.tx_buf = tx_buf = io.Buffer("o", uart.tx)
        m.d.comb += [top.rx.eq(rx_buf.i), tx_buf.o.eq(top.tx)]
        return m


def markdown_table(shape: EngineShape | None = None) -> str:
    """The protocol as a Markdown table (docs/rtl.md), byte counts for ``shape``."""
    shape = shape or BOARDS["ulx3s-85f"].shape
    lay = shape.layouts()
    rows = [
        "| opcode | command | request bytes | reply bytes (after the status byte) | what it does |",
        "|---|---|---|---|---|",
    ]
    for c in COMMANDS:
        req = f"{nbytes(lay.get(c.request))} (`{c.request}`)" if c.request else "0"
        rep = f"{nbytes(lay.get(c.reply))} (`{c.reply}`)" if c.reply else "0"
        rows.append(f"| 0x{c.opcode:02X} | `{c.name}` | {req} | {rep} | {c.doc} |")
    return "\n".join(rows)
