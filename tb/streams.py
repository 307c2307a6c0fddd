"""Stream bus functional models: one Source, one Sink and one Monitor for an Amaranth stream.

An Amaranth ``stream.Signature`` appears in the Verilog as ``<name>__valid``,
``<name>__ready`` and ``<name>__payload``; a beat moves on a rising edge where valid
and ready are both high, and a source never retracts a beat it offered.  Payloads are
packed and unpacked with the RTL's own layouts (:mod:`kvcxl.rtl.layouts`).

Every endpoint of a DUT is stepped by one :class:`Clock` loop (one coroutine per bench,
not one per stream: each trigger costs more than a cycle's Python): at the falling edge
it lets each endpoint drive its inputs for the coming rising edge, wakes the bench (which
so always resumes at a falling edge, where it may write inputs), then waits for
``ReadOnly`` and lets each one sample what that edge transfers.  Driving and sampling in
the middle of the cycle behaves the same on Verilator and Icarus, which disagree on
what a read right at the rising edge returns.  Endpoints are stepped in the order they
were made, so a seeded bench draws its random back-pressure in a fixed order.

Back-pressure follows cocotbext-axi's pause generators: a :class:`Pause` decides per
cycle whether a source withholds its next beat or a sink drops ready.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

import cocotb
from cocotb.clock import Clock as _CocotbClock
from cocotb.triggers import Event, FallingEdge, ReadOnly, RisingEdge

from kvcxl.rtl import layouts as L


class Pause:
    """Random back-pressure: each call is True (pause this cycle) with probability ``p``.
    Draws one number per call whatever ``p`` is, so that seeds replay."""

    def __init__(self, p: float = 0.0, rng: random.Random | None = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"pause probability = {p}: must be in [0, 1]")
        self.p, self.rng = p, rng or random.Random(0)

    def __call__(self) -> bool:
        return self.rng.random() < self.p


class Clock:
    """The clock loop of one DUT: steps every endpoint once per cycle (see the module doc)."""

    def __init__(self, dut: Any, clk: Any = None) -> None:
        self.dut = dut
        self.clk = clk if clk is not None else dut.clk
        self.endpoints: list[Any] = []
        self.cycles = 0
        self.on_cycle: list[Callable[[], None]] = []  # called after each cycle's sampling
        self._fall = Event()

    def add(self, endpoint: Any) -> None:
        self.endpoints.append(endpoint)

    def start_clock(self, period_ns: int = 10) -> None:
        """The C clock (no Python per edge)."""
        cocotb.start_soon(_CocotbClock(self.clk, period_ns, unit="ns", impl="gpi").start())

    async def reset(self, rst: Any = None, cycles: int = 3) -> None:
        """Hold ``rst`` (default ``dut.rst``) for ``cycles`` rising edges."""
        rst = rst if rst is not None else self.dut.rst
        rst.value = 1
        for _ in range(cycles):
            await RisingEdge(self.clk)
        rst.value = 0

    def start(self) -> None:
        cocotb.start_soon(self._loop())

    async def _loop(self) -> None:
        falling, readonly = FallingEdge(self.clk), ReadOnly()
        eps = self.endpoints
        while True:
            await falling
            self.cycles += 1
            for ep in eps:
                ep.drive()
            self._fall.set()  # the bench runs now, before ReadOnly
            self._fall.clear()
            await readonly
            for ep in eps:
                ep.sample()
            for fn in self.on_cycle:
                fn()

    async def wait(self, cycles: int = 1) -> None:
        """Return at the ``cycles``-th falling edge from now (after the endpoints drove)."""
        for _ in range(cycles):
            await self._fall.wait()


class _Endpoint:
    def __init__(self, clock: Clock, name: str, layout: Any = None) -> None:
        d = clock.dut
        self.clock, self.name = clock, name
        self.valid = getattr(d, f"{name}__valid")
        self.payload = getattr(d, f"{name}__payload")
        self.ready = getattr(d, f"{name}__ready", None)  # a tap may have none
        self.unpack = L.unpacker(layout) if layout is not None else int
        self.layout = layout
        self.beats = 0  # transferred
        self.stalls = 0  # valid while not ready
        clock.add(self)

    def drive(self) -> None:
        pass

    def sample(self) -> None:
        pass


class Source(_Endpoint):
    """Drives an input stream from a queue of beats (dicts packed with ``layout``, or ints);
    ``pause`` withholds a beat (a gap) before it is offered, never after."""

    def __init__(
        self, clock: Clock, name: str, layout: Any = None, pause: Pause | None = None
    ) -> None:
        super().__init__(clock, name, layout)
        self.queue: deque[int] = deque()
        self.pause = pause
        self.gaps = 0  # beats withheld by the pause
        self.offering = False
        self._shadow = 0  # the valid last written (each VPI write costs)
        self.valid.value = 0
        self.payload.value = 0
        self.idle = Event()  # set when the queue is empty and nothing is offered
        self.idle.set()
        self.queued = 0  # beats ever queued (beats: ever transferred)

    def put(self, beat: dict | int) -> None:
        """Queue one beat (it goes out in order)."""
        bits = beat if isinstance(beat, int) else L.pack(self.layout, beat)
        self.queue.append(bits)
        self.queued += 1
        self.idle.clear()

    async def send(self, beat: dict | int) -> None:
        """Queue one beat and return at the falling edge after the rising edge that took it."""
        self.put(beat)
        await self.flush()

    async def flush(self) -> None:
        """Return at the falling edge after every queued beat has been transferred."""
        ticket = self.queued
        while self.beats < ticket:
            await self.clock.wait()

    def drive(self) -> None:
        if not self.offering and self.queue:
            if self.pause is not None and self.pause():
                self.gaps += 1
            else:
                self.payload.value = self.queue.popleft()
                self.offering = True
        v = int(self.offering)
        if self._shadow != v:
            self._shadow = v
            self.valid.value = v

    def sample(self) -> None:
        if not self.offering:
            return
        if self.ready is None or self.ready.value:
            self.beats += 1
            self.offering = False
            if not self.queue:
                self.idle.set()
        else:
            self.stalls += 1


class Sink(_Endpoint):
    """Takes an output stream: ready low on the cycles ``pause`` says, every transferred beat
    (unpacked with ``layout``) to the ``on_beat`` callbacks and to :meth:`recv`."""

    def __init__(
        self, clock: Clock, name: str, layout: Any = None, pause: Pause | None = None
    ) -> None:
        super().__init__(clock, name, layout)
        self.pause = pause
        self.on_beat: list[Callable[[Any], None]] = []
        self.queue: deque = deque()
        self.keep = True  # hold beats for recv(); a bench that only uses callbacks clears it
        self._ready = 0
        self.ready.value = 0

    def drive(self) -> None:
        r = 0 if (self.pause is not None and self.pause()) else 1
        if r != self._ready:
            self._ready = r
            self.ready.value = r

    def sample(self) -> None:
        if not self.valid.value:
            return
        if not self._ready:
            self.stalls += 1
            return
        self.beats += 1
        beat = self.unpack(int(self.payload.value))
        for fn in self.on_beat:
            fn(beat)
        if self.keep:
            self.queue.append(beat)

    async def recv(self, timeout: int | None = None) -> Any:
        """The next transferred beat, at a falling edge; None after ``timeout`` cycles."""
        waited = 0
        while not self.queue:
            if timeout is not None and waited >= timeout:
                return None
            await self.clock.wait()
            waited += 1
        return self.queue.popleft()

    def drain(self) -> list:
        """The beats transferred and not yet received."""
        out = list(self.queue)
        self.queue.clear()
        return out


class Monitor(_Endpoint):
    """Watches a stream it does not drive: every beat the rising edge transfers (valid, and
    ready where the stream has one) to the ``on_beat`` callbacks."""

    def __init__(self, clock: Clock, name: str, layout: Any = None) -> None:
        super().__init__(clock, name, layout)
        self.on_beat: list[Callable[[Any], None]] = []

    def sample(self) -> None:
        if not self.valid.value:
            return
        if self.ready is not None and not self.ready.value:
            self.stalls += 1
            return
        self.beats += 1
        beat = self.unpack(int(self.payload.value))
        for fn in self.on_beat:
            fn(beat)
