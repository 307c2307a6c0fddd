"""UART receiver and transmitter (8 data bits, no parity, one stop bit) as stream components.

``divisor`` is the bit time in clock cycles (clock / baud rate): the board's real baud
rate in a bitstream, a few cycles in simulation.  Both ends keep to the stream rules:
a received byte stays valid until it is taken (a byte that arrives before then
replaces it and sets ``overrun``), and the transmitter takes a byte only when idle.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out


def _check_divisor(divisor: int) -> None:
    if divisor < 4:
        raise ValueError(f"divisor = {divisor}: a bit must last at least 4 clock cycles")


class UartRx(wiring.Component):
    """Serial line ``rx`` to a stream of bytes; samples each bit in its middle."""

    def __init__(self, divisor: int):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__({"rx": In(1, init=1), "data": Out(stream.Signature(8)), "overrun": Out(1)})

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        # The line is asynchronous to the clock.
        m.submodules.sync = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(self.divisor + self.divisor // 2 + 1))
        bits = Signal(range(9))
        shreg = Signal(8)
        with m.If(self.data.valid & self.data.ready):
            m.d.sync += self.data.valid.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~rx):
                    m.d.sync += timer.eq(self.divisor // 2)
                    m.next = "START"
            with m.State("START"):  # confirm the start bit in its middle
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(rx):  # a glitch, not a start bit
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [timer.eq(self.divisor - 1), bits.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [shreg.eq(Cat(shreg[1:], rx)), timer.eq(self.divisor - 1)]
                    m.d.sync += bits.eq(bits + 1)
                    with m.If(bits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    # A missing stop bit (framing error) drops the byte.
                    with m.If(rx):
                        m.d.sync += [self.data.payload.eq(shreg), self.data.valid.eq(1)]
                        with m.If(self.data.valid & ~self.data.ready):
                            m.d.sync += self.overrun.eq(1)
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """A stream of bytes to serial line ``tx`` (idle high)."""

    def __init__(self, divisor: int):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__({"data": In(stream.Signature(8)), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        # Start bit, eight data bits (LSB first), stop bit; shifted out from bit 0.
        frame = Signal(10, init=0x3FF)
        left = Signal(range(11))
        m.d.comb += self.tx.eq(frame[0])
        with m.If(left == 0):
            m.d.comb += self.data.ready.eq(1)
            with m.If(self.data.valid):
                m.d.sync += [
                    frame.eq(Cat(Const(0, 1), self.data.payload, Const(1, 1))),
                    left.eq(10),
                    timer.eq(self.divisor - 1),
                ]
        with m.Elif(timer != 0):
            m.d.sync += timer.eq(timer - 1)
        with m.Else():
            m.d.sync += [frame.eq(Cat(frame[1:], Const(1, 1))), left.eq(left - 1)]
            m.d.sync += timer.eq(self.divisor - 1)
        return m
