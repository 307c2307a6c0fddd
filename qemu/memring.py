"""The device's end of the CXL.mem request ring shared with a patched QEMU.

QEMU (``kvcxl-ring=FILE``) writes each trapped access as one record of the file this
module creates and publishes ``req_tail``; :class:`MemRingServer` answers in the same
record and publishes ``req_head`` (layout: :mod:`kvcxl.cxl.ring`, ``MR_*``;
docs/qemu.md, "The CXL.mem request ring").  The socket stays for the mailbox and as the other
way to send CXL.mem requests (QEMU uses the socket when ``kvcxl-ring`` is not given).

Wake-up: the server spins on ``req_tail`` after its last request (a guest touching
trapped memory makes its next request within microseconds) for ``MR_DEVICE_SPIN_S``,
then it raises ``dev_sleep`` and sleeps in futex(2) on ``req_tail``.  QEMU calls futex
wake only when it sees ``dev_sleep`` set, and does the same on ``req_head``
(``host_sleep``).  A busy link therefore makes no system call.  Every sleep is bounded
(``MR_WAIT_NS``), so a wake-up lost to a race costs a millisecond, never a hang.

A bad record (unknown opcode, a read with byte enables, a write with none, a sequence
number that is not its index) is answered ``MR_ST_REFUSED`` — that one access fails in
QEMU, the ring keeps working.  A ``req_tail`` more than ``MR_DEPTH`` ahead of
``req_head`` cannot be answered record by record (which records are new?): the server
sets ``fault`` and stops, and QEMU takes the link down, as for a broken socket stream.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
import threading
import time
from pathlib import Path

from kvcxl.cxl import mem
from kvcxl.cxl import ring as L
from kvcxl.emu.device.service import Engine, LineRefused

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def futex_wait(addr: int, expected: int, timeout_ns: int) -> bool:
    """Sleep while the u32 at ``addr`` holds ``expected`` (at most ``timeout_ns``); True when
    the sleep ended by its timeout (not a wake-up, nor a changed word).  The call releases
    the GIL (ctypes), so the device's other threads run meanwhile."""
    ts = _Timespec(timeout_ns // 1_000_000_000, timeout_ns % 1_000_000_000)
    rc = _syscall(
        ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAIT),
        ctypes.c_uint32(expected), ctypes.byref(ts), None, ctypes.c_int(0),
    )  # fmt: skip
    return rc == -1 and ctypes.get_errno() == errno.ETIMEDOUT


def futex_wake(addr: int) -> None:
    """Wake every sleeper on the u32 at ``addr``."""
    _syscall(
        ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAKE),
        ctypes.c_int(0x7FFFFFFF), None, None, ctypes.c_int(0),
    )  # fmt: skip


def create(path: str | Path) -> None:
    """A fresh ring file at ``path``: the header's geometry, both indices 0."""
    buf = bytearray(L.MR_BYTES)
    for name, value in (
        ("magic", L.MR_MAGIC), ("version", L.MR_VERSION), ("depth", L.MR_DEPTH),
        ("rec_bytes", L.MR_REC_BYTES),
    ):  # fmt: skip
        _U32.pack_into(buf, L.MR_HDR[name], value)
    tmp = Path(str(path) + ".tmp")
    old = os.umask(0o177)  # owner only: the ring reads and writes device memory
    try:
        tmp.write_bytes(bytes(buf))
    finally:
        os.umask(old)
    os.replace(tmp, path)


class MemRingServer(threading.Thread):
    """Serves the ring at ``path`` onto ``engine`` (its lock, its doorbells) until
    :meth:`stop`."""

    def __init__(self, engine: Engine, path: str | Path) -> None:
        super().__init__(daemon=True, name="kvcxl-memring")
        self.engine, self.path = engine, Path(path)
        self._f = open(path, "r+b")
        self.mm = mmap.mmap(self._f.fileno(), L.MR_BYTES)
        if _U32.unpack_from(self.mm, L.MR_HDR["magic"])[0] != L.MR_MAGIC:
            raise ValueError(f"{path} is not a kvcxl request ring (magic)")
        self._words = ctypes.c_uint32 * (L.MR_BYTES // 4)
        self._view = self._words.from_buffer(self.mm)  # the futex words' addresses
        self.halt = threading.Event()
        self.served = 0
        self._counts = [0] * (max(_STATUS_NAMES) + 1)  # answers by status
        self.wakes = self.sleeps = 0
        self.sleep_timeouts = 0  # sleeps that ended by their timeout, not a wake-up
        self.refusals: list[str] = []  # the first reasons, for the report
        self.fault: str | None = None

    def _addr(self, name: str) -> int:
        return ctypes.addressof(self._view) + L.MR_HDR[name]

    def stop(self) -> None:
        """End the loop (woken until it has: a wake-up can land just before its sleep)."""
        self.halt.set()
        t0 = time.monotonic()
        while self.is_alive() and time.monotonic() - t0 < 5:
            futex_wake(self._addr("req_tail"))
            self.join(timeout=0.01)

    def close(self) -> None:
        del self._view
        self.mm.close()
        self._f.close()

    @property
    def statuses(self) -> dict[str, int]:
        """Answers by status name."""
        return {name: self._counts[st] for st, name in _STATUS_NAMES.items()}

    def stats(self) -> dict:
        return {
            "path": str(self.path),
            "served": self.served,
            "statuses": self.statuses,
            "device_sleeps": self.sleeps,
            "device_sleep_timeouts": self.sleep_timeouts,
            "host_wakes": self.wakes,
            "refusals": self.refusals,
            "fault": self.fault,
        }

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        mm, hdr = self.mm, L.MR_HDR
        o_tail, o_head, o_dsleep = hdr["req_tail"], hdr["req_head"], hdr["dev_sleep"]
        unpack = _U32.unpack_from
        head = unpack(mm, o_head)[0]
        spin_s, wait_ns = L.MR_DEVICE_SPIN_S, L.MR_WAIT_NS
        clock = time.perf_counter
        while not self.halt.is_set():
            idle_since = clock()
            tail = unpack(mm, o_tail)[0]
            while tail == head:  # spin, then sleep on req_tail
                if clock() - idle_since > spin_s:
                    _U32.pack_into(mm, o_dsleep, 1)
                    with self.engine.lock:  # a locked instruction: the flag before the index
                        tail = unpack(mm, o_tail)[0]
                    if tail == head and not self.halt.is_set():
                        self.sleeps += 1
                        self.sleep_timeouts += futex_wait(self._addr("req_tail"), head, wait_ns)
                    _U32.pack_into(mm, o_dsleep, 0)
                    if self.halt.is_set():
                        return
                    idle_since = clock()
                tail = unpack(mm, o_tail)[0]
            if (tail - head) & 0xFFFFFFFF > L.MR_DEPTH:
                self._fault(f"req_tail {tail} is more than {L.MR_DEPTH} ahead of {head}")
                return
            while head != tail:
                self._serve(head)
                head = (head + 1) & 0xFFFFFFFF
                _U32.pack_into(mm, o_head, head)
                self.served += 1
                with self.engine.lock:  # a locked instruction: the index before the flag
                    asleep = unpack(mm, hdr["host_sleep"])[0]
                if asleep:
                    self.wakes += 1
                    futex_wake(self._addr("req_head"))

    def _fault(self, why: str) -> None:
        self.fault = why
        _U32.pack_into(self.mm, L.MR_HDR["fault"], L.MR_FAULT_BAD_INDEX)
        futex_wake(self._addr("req_head"))

    def _serve(self, i: int) -> None:
        """Answer record ``i``: its status and, for a read, the line."""
        mm = self.mm
        at = L.MR_RECORDS + (i % L.MR_DEPTH) * L.MR_REC_BYTES
        op, flags, seq, addr, be = L.MR_REQ_FMT.unpack_from(mm, at)
        data = at + L.MR_REC["data"]
        why = check(op, flags, seq, i, addr, be)
        status = L.MR_ST_REFUSED
        if why is None:
            try:
                if op == L.MR_OP_READ:
                    flag, mm[data : data + 64] = self.engine.line(False, addr, 0, b"")
                else:
                    flag, _ = self.engine.line(True, addr, be, mm[data : data + 64])
                status = L.MR_ST_POISON if flag else L.MR_ST_OK
            except LineRefused as exc:
                why = str(exc)
            if why is not None and len(self.refusals) < 16:
                self.refusals.append(f"record {i}: {why}")
        elif len(self.refusals) < 16:
            self.refusals.append(f"record {i}: {why}")
        self._counts[status] += 1
        _U16.pack_into(mm, at + L.MR_REC["status"], status)


_STATUS_NAMES = {L.MR_ST_OK: "ok", L.MR_ST_POISON: "poison", L.MR_ST_REFUSED: "refused"}


def check(op: int, flags: int, seq: int, index: int, addr: int, be: int) -> str | None:
    """Why record ``index`` (its fields as read) cannot be served, or None."""
    if op == L.MR_OP_READ and not (flags or be or addr >> mem.ADDR_BITS) and seq == index:
        return None  # the common case, in one test
    if op not in (L.MR_OP_READ, L.MR_OP_WRITE):
        return f"unknown opcode {op}"
    if flags:
        return f"flags {flags:#x} (none are defined)"
    if seq != index:
        return f"sequence number {seq} in the record of request {index}"
    if addr >> mem.ADDR_BITS:
        return f"address {addr:#x} beyond CXL.mem's {mem.ADDR_BITS}-bit line address"
    if op == L.MR_OP_READ and be:
        return f"a read with byte enables {be:#x}"
    if op == L.MR_OP_WRITE and not be:
        return "a write with no byte enabled"
    return None
