"""Host driver of the board's UART link (:mod:`kvcxl.rtl.board`): load, run passes, read victims.

    link = Link(open_port("/dev/ttyUSB0"))
    shape = link.info()
    link.params(alpha_q, touch_q, shift, k); link.table(decay); link.records(...)
    link.step(weights, read); victims = link.victims()

Every command is packed with :data:`kvcxl.rtl.board.COMMANDS` and the engine's own
layouts.  :func:`run_script` drives seeded random passes and, asked to, compares every
pass's victims with the firmware's integer golden step (:mod:`kvcxl.firmware.golden_step`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from kvcxl.common.progress import progress as progress_bar
from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware import golden_step
from kvcxl.firmware.config import PolicyConfig

from . import layouts as L
from .board import (
    BY_NAME,
    MAGIC,
    PROTOCOL_VERSION,
    STATUS,
    Command,
    EngineShape,
    info_layout,
    nbytes,
)

CHUNK = 32  # commands written before their replies are read (the board buffers 16 bytes)


class LinkError(RuntimeError):
    """The board did not answer as the protocol says: ``kvcxl`` prints it as one line and
    exits with ``exit_code``."""

    exit_code = 1


class Port(Protocol):
    """What the driver needs of a serial port (pyserial's ``Serial`` is one)."""

    def write(self, data: bytes) -> int | None: ...

    def read(self, size: int) -> bytes: ...


def open_port(dev: str, baud: int = 115200, timeout: float = 2.0) -> Port:
    """A serial device, or any pyserial URL (``loop://``, ``socket://host:port``)."""
    import serial  # lazy: pyserial is the 'hdl' extra

    try:
        return serial.serial_for_url(dev, baudrate=baud, timeout=timeout)
    except (serial.SerialException, ValueError) as exc:
        raise LinkError(f"--port {dev}: cannot open ({exc})") from None


class Link:
    """One board on one port; :meth:`info` first (it learns the engine's shape)."""

    def __init__(self, port: Port):
        self.port = port
        self.shape: EngineShape | None = None
        self.layouts: dict = {}
        self.commands = 0

    # --- framing ---------------------------------------------------------------------

    def _request(self, c: Command, value: dict | None) -> bytes:
        out = bytes([c.opcode])
        if c.request:
            lay = self.layouts[c.request]
            out += L.pack(lay, value or {}).to_bytes(nbytes(lay), "little")
        return out

    def _read(self, n: int, what: str) -> bytes:
        got = self.port.read(n)
        if len(got) != n:
            raise LinkError(f"{what}: {len(got)} of {n} reply bytes before the timeout")
        return got

    def _reply(self, c: Command) -> tuple[int, dict | None]:
        status = self._read(1, c.name)[0]
        if status == STATUS["unknown"]:
            raise LinkError(f"{c.name}: the board does not know opcode 0x{c.opcode:02X}")
        if status not in (STATUS["ok"], STATUS["none"]):
            raise LinkError(f"{c.name}: status byte 0x{status:02X} is not a protocol status")
        self.commands += 1
        if not c.reply:
            return status, None
        lay = self.layouts[c.reply] if c.name != "info" else info_layout()
        raw = int.from_bytes(self._read(nbytes(lay), c.name), "little")
        return status, L.unpack(lay, raw)

    def _batch(self, name: str, values: list[dict]) -> None:
        """Write a command ``len(values)`` times, ``CHUNK`` at a time, then check each reply."""
        c = BY_NAME[name]
        for i in range(0, len(values), CHUNK):
            part = values[i : i + CHUNK]
            self.port.write(b"".join(self._request(c, v) for v in part))
            for _ in part:
                status, _ = self._reply(c)
                if status != STATUS["ok"]:
                    raise LinkError(f"{name}: status 0x{status:02X}, want ok")

    # --- commands --------------------------------------------------------------------

    def info(self) -> EngineShape:
        c = BY_NAME["info"]
        self.port.write(bytes([c.opcode]))
        _, info = self._reply(c)
        if info["magic"] != MAGIC or info["version"] != PROTOCOL_VERSION:
            raise LinkError(
                f"info: magic 0x{info['magic']:02X} version {info['version']}, want "
                f"0x{MAGIC:02X} version {PROTOCOL_VERSION}: not a kvcxl board"
            )
        self.shape = EngineShape(info["entries"], info["lanes"], info["batch"])
        self.layouts = self.shape.layouts()
        return self.shape

    def params(self, alpha_q: int, touch_q: int, shift: int, k: int) -> None:
        self._batch("params", [{"alpha": alpha_q, "touch": touch_q, "shift": shift, "k": k}])

    def table(self, values) -> None:
        self._batch("table", [{"addr": a, "data": int(v)} for a, v in enumerate(values)])

    def records(self, score, idle, pinned, resident) -> None:
        n = self.shape.lanes
        words = []
        for g in range(self.shape.groups):
            sl = range(g * n, g * n + n)
            recs = [
                {
                    "score": int(score[e]),
                    "idle": int(idle[e]),
                    "pinned": int(pinned[e]),
                    "resident": int(resident[e]),
                }
                for e in sl
            ]
            words.append({"addr": g, "data": recs})
        self._batch("record", words)

    def step(self, weights, read) -> None:
        """One pass: the step's weights and read flags of every entry, in address order."""
        n = self.shape.lanes
        beats = []
        for g in range(self.shape.groups):
            lo = g * n
            mask = sum(int(bool(read[lo + i])) << i for i in range(n))
            beats.append({"weight": [int(w) for w in weights[lo : lo + n]], "read": mask})
        self._batch("update", beats)

    def victims(self, timeout: float = 5.0) -> list[tuple[int, int]]:
        """The pass's victims in order, as (index, priority); polls until the last one."""
        c = BY_NAME["victim"]
        out: list[tuple[int, int]] = []
        deadline = time.monotonic() + timeout
        while True:
            self.port.write(bytes([c.opcode]))
            status, v = self._reply(c)
            if status == STATUS["none"]:
                if time.monotonic() > deadline:
                    raise LinkError(f"victim: no last victim within {timeout} s")
                continue
            if not v["empty"]:
                out.append((v["index"], v["priority"]))
            if v["last"]:
                return out


@dataclass
class Golden:
    """The firmware's integer golden step over the same records: what each pass must evict."""

    score: np.ndarray
    idle: np.ndarray
    pinned: np.ndarray
    resident: np.ndarray
    params: golden_step.IntParams
    k: int

    def step(self, weights, read) -> list[tuple[int, int]]:
        r = golden_step.step(
            self.score, self.idle, weights, read, self.resident & ~self.pinned, self.k,
            self.params,
        )  # fmt: skip
        self.score, self.idle = r.score, r.idle
        return r.pairs()


def run_script(
    link: Link,
    *,
    steps: int = 8,
    seed: int = 1,
    check: bool = True,
    config: PolicyConfig | None = None,
    progress: bool = False,
) -> dict:
    """Load seeded random records and the config's parameters, run ``steps`` passes and read
    their victims; with ``check``, compare each pass with :class:`Golden` (Simulated or
    Measured: the caller knows which the port reaches)."""
    cfg = config or PolicyConfig()
    t0 = time.perf_counter()
    shape = link.info()
    n, rng = shape.entries, np.random.default_rng(seed)
    gold = Golden(
        score=rng.integers(0, fx.Q_MAX + 1, n),
        idle=rng.integers(0, 300, n),
        pinned=rng.random(n) < 0.1,
        resident=rng.random(n) < 0.85,
        params=golden_step.IntParams.from_config(cfg),
        k=shape.batch,
    )
    gp = gold.params
    link.params(gp.alpha_q, gp.touch_q, gp.shift, gold.k)
    link.table(gp.table)
    link.records(gold.score, gold.idle, gold.pinned, gold.resident)
    t_load = time.perf_counter() - t0
    passes, mismatches, victims = [], [], 0
    bar, update = progress_bar(steps, "passes", "it", off=not progress)
    for s in range(steps):
        # Sparse attention: most entries unread, a few heavy ones; ties from repeats.
        read = rng.random(n) < 0.3
        weights = np.where(read, rng.choice([0, 300, 655, 5000, 30000, 65535], n), 0)
        link.step(weights, read)
        got = link.victims()
        victims += len(got)
        passes.append([i for i, _ in got])
        if check:
            want = gold.step(weights, read)
            if got != want:
                mismatches.append({"pass": s, "got": got[:8], "want": want[:8]})
        update(1)
    bar.close()
    wall = time.perf_counter() - t0
    return {
        "shape": asdict(shape),
        "steps": steps,
        "seed": seed,
        "victims": victims,
        "checked": check,
        "mismatches": len(mismatches),
        "first_mismatches": mismatches[:3],
        "commands": link.commands,
        "load_s": round(t_load, 3),
        "wall_s": round(wall, 3),
        "commands_per_s": round(link.commands / wall, 1) if wall else None,
        "victims_per_pass": [len(p) for p in passes],
    }
