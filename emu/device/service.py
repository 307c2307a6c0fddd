"""``kvcxl device serve``: the device and its firmware behind a Unix stream socket.

Framing (all integers little endian)::

    u32 length   -- bytes that follow (kind + body), at most MAX_FRAME
    u8  kind
    ...  body

Every request frame gets exactly one response frame, in order.

=====  ===========  ==============================================  ===========================
kind   name         request body                                    response body
=====  ===========  ==============================================  ===========================
0x01   MEM          one CXL.mem M2S message                         the S2M message; empty for
                    (kvcxl.cxl.mem)                        MemSpecRd (no completion)
0x02   CCI          one CCI mailbox request                         the CCI response
                    (kvcxl.cxl.mailbox)
0x03   READ         u64 HPA, u32 length (≤ 1 MiB)                   u8 flags, 7 pad, f64
                                                                    latency ns, data
0x04   WRITE        u64 HPA, u8 flags (bit 0 poison), 7 pad, data   u8 flags, 7 pad, f64
                                                                    latency ns
0x05   HDM          JSON {"op": "program"|"commit"|"uncommit"|      JSON {"ok": true, ...} or
                    "reset"|"list", ...register fields}             {"ok": false, "reason", ..}
0x06   PLACE        u8 tier (0 DRAM, 1 NVMe), 3 pad, u32 count,     u32 pages moved
                    count × u64 DPA page number (a host-side
                    placement: the ring's firmware placing victims)
0x7F   ERROR        (response only)                                 UTF-8 "reason: detail"
                                                                    (media_error: a file-backed
                                                                    tier's disk refused)
=====  ===========  ==============================================  ===========================

Response flags: bit 0 = some byte was poisoned, bit 1 = some byte was not mapped
by any decoder (read as zeros / write dropped).  A malformed frame (unknown kind,
short body, undecodable CXL.mem message) is answered with an ERROR frame and the
connection stays usable; a length above MAX_FRAME is answered with ERROR and the
connection is closed, since the stream cannot be resynchronised.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.cxl.hdm import HdmError

from .cci import Mailbox
from .device import Type3Device
from .media import MediaError

MEM, CCI, READ, WRITE, HDM, PLACE, ERROR = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x7F
KINDS = {
    MEM: "MEM", CCI: "CCI", READ: "READ", WRITE: "WRITE", HDM: "HDM", PLACE: "PLACE",
    ERROR: "ERROR",
}  # fmt: skip
_PLACE_HDR = struct.Struct("<B3xI")
MAX_FRAME = 2 << 20
MAX_IO = 1 << 20
FLAG_POISON, FLAG_UNMAPPED = 1, 2
_RW_HDR = struct.Struct("<B7xd")
READ_REQ = struct.Struct("<QI")  # READ's body: u64 HPA, u32 length
WRITE_REQ = struct.Struct("<QB7x")  # WRITE's body before the data: u64 HPA, u8 flags


class Engine:
    """Frame-level dispatch onto one device and its mailbox (thread-safe)."""

    def __init__(self, device: Type3Device) -> None:
        self.device = device
        self.mailbox = Mailbox(device)
        self.lock = threading.Lock()
        # DPA line -> (byte in the line, what a host write of that byte rings): a doorbell,
        # run under the lock before the write's completion is sent, so the host's next
        # read sees its effect.
        self.doorbells: dict[int, tuple[int, Callable[[], object]]] = {}
        self.rung = 0  # doorbell writes served

    def doorbell(self, dpa: int, ring: Callable[[], object]) -> None:
        """A CXL.mem write that covers the byte at ``dpa`` calls ``ring`` before it
        completes; the page is trapped, so a patched QEMU always sends that write here."""
        self.device.trap(dpa & ~63, 64)
        self.doorbells[dpa >> 6] = (dpa & 63, ring)

    def handle(self, kind: int, body: bytes) -> tuple[int, bytes]:
        with self.lock:
            if self.device.leaving:  # demotions waiting for QEMU to unmap their pages
                self.device.settle_leaving()
            try:
                return self._handle(kind, body)
            except _FrameError as exc:
                return ERROR, str(exc).encode()
            except MediaError as exc:  # the disk under a file-backed tier refused
                self.device.counters["media_errors"] += 1
                return ERROR, f"media_error: {exc}".encode()
            except Exception as exc:  # never let host input kill the service, nor go uncounted
                self.device.counters["internal_errors"] += 1
                return ERROR, f"internal: {type(exc).__name__}: {exc}".encode()

    def _ring_bell(self, addr: int, byte_enable: int) -> None:
        """A write of the line at CXL.mem address ``addr`` rings the doorbell whose byte
        it enables (after the write landed)."""
        dpa = self.device.hdm.translate(addr << 6)
        bell = None if dpa is None else self.doorbells.get(dpa >> 6)
        if bell is not None and byte_enable >> bell[0] & 1:
            self.rung += 1
            bell[1]()

    def line(self, write: bool, addr: int, byte_enable: int, data: bytes) -> tuple[int, bytes]:
        """One CXL.mem line request without the framing (the shared request ring's path,
        as fast as the device allows): a read returns (0, 1 poisoned or 2 unmapped; the
        line), a write (0, b"") after any doorbell it rings was served.  Raises
        LineRefused, counted as :meth:`handle` counts its errors, when the device fails."""
        with self.lock:
            dev = self.device
            if dev.leaving:  # demotions waiting for QEMU to unmap their pages
                dev.settle_leaving()
            try:
                if not write:
                    line, status = dev.read_line(addr)
                    return status, line
                dev.write_line(addr, data, byte_enable)
                if self.doorbells:
                    self._ring_bell(addr, byte_enable)
                return 0, b""
            except MediaError as exc:
                dev.counters["media_errors"] += 1
                raise LineRefused(f"media_error: {exc}") from None
            except Exception as exc:
                dev.counters["internal_errors"] += 1
                raise LineRefused(f"internal: {type(exc).__name__}: {exc}") from None

    def _handle(self, kind: int, body: bytes) -> tuple[int, bytes]:
        dev = self.device
        if kind == MEM:
            try:
                msg = mem.decode(body)
            except mem.MessageError as exc:
                raise _FrameError(f"mem_{exc.reason}: {exc}") from None
            if not isinstance(msg, mem.M2SReq | mem.M2SRwD):
                raise _FrameError(f"mem_wrong_direction: {msg.CLASS.name} is not a request")
            rsp = dev.handle(msg)
            if self.doorbells and isinstance(msg, mem.M2SRwD):
                self._ring_bell(msg.addr, msg.byte_enable)
            return MEM, b"" if rsp is None else mem.encode(rsp)
        if kind == CCI:
            return CCI, self.mailbox.execute(body)
        if kind == READ:
            if len(body) != READ_REQ.size:
                raise _FrameError(f"bad_length: READ body is 12 bytes, got {len(body)}")
            hpa, n = READ_REQ.unpack(body)
            if n > MAX_IO or hpa + n > mem.HPA_LIMIT:
                raise _FrameError(f"bad_range: {n} bytes at {hpa:#x}")
            r = dev.read(hpa, n)
            flags = FLAG_POISON * r.poisoned | FLAG_UNMAPPED * r.unmapped
            return READ, _RW_HDR.pack(flags, r.latency_ns) + r.data
        if kind == WRITE:
            if len(body) < WRITE_REQ.size:
                raise _FrameError(f"bad_length: WRITE body is at least 16 bytes, got {len(body)}")
            hpa, flags = WRITE_REQ.unpack_from(body)
            data = body[WRITE_REQ.size :]
            if len(data) > MAX_IO or hpa + len(data) > mem.HPA_LIMIT:
                raise _FrameError(f"bad_range: {len(data)} bytes at {hpa:#x}")
            mapped = dev.write(hpa, data, poison=bool(flags & FLAG_POISON))
            latency = dev.latencies[-1]  # the write just appended its latency
            return WRITE, _RW_HDR.pack(0 if mapped else FLAG_UNMAPPED, latency)
        if kind == HDM:
            return HDM, json.dumps(self._hdm(body)).encode()
        if kind == PLACE:
            if len(body) < _PLACE_HDR.size:
                raise _FrameError(f"bad_length: PLACE body is at least {_PLACE_HDR.size} bytes")
            tier, count = _PLACE_HDR.unpack_from(body)
            if tier not in (0, 1) or len(body) != _PLACE_HDR.size + 8 * count:
                raise _FrameError(f"bad_field: tier {tier}, {count} pages in {len(body)} B")
            pages = struct.unpack_from(f"<{count}Q", body, _PLACE_HDR.size)
            if any(p >= dev.n_pages for p in pages):
                raise _FrameError(f"bad_range: a page beyond the device's {dev.n_pages}")
            for p in pages:
                dev.move_page(p, to_dram=tier == 0)
            return PLACE, struct.pack("<I", len(pages))
        raise _FrameError(f"bad_kind: frame kind {kind:#04x} is not one of {sorted(KINDS)}")

    def _hdm(self, body: bytes) -> dict:
        try:
            req = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return {"ok": False, "reason": "bad_json", "error": "body is not UTF-8 JSON"}
        if not isinstance(req, dict):
            return {"ok": False, "reason": "bad_json", "error": "body must be a JSON object"}
        hdm = self.device.hdm
        op = req.pop("op", None)
        # Every field is checked by name before the call: a KeyError or TypeError from the
        # decoders is a bug (counted as internal), never a refusal.
        need = {"program": {"index", "base", "size"}, "commit": {"index"}, "uncommit": {"index"}}
        allowed = {"index", "base", "size", "ways", "granularity", "position", "dpa_skip", "lock"}
        if op not in (*need, "reset", "list"):
            return {"ok": False, "reason": "bad_op", "error": f"unknown op {op!r}"}
        missing = need.get(op, set()) - set(req)
        extra = set(req) - (allowed if op == "program" else need.get(op, set()))
        if missing or extra:
            return {"ok": False, "reason": "bad_field",
                    "error": f"missing {sorted(missing)}, unknown {sorted(extra)}"}  # fmt: skip
        if not all(isinstance(v, int) for v in req.values()):
            return {"ok": False, "reason": "bad_field", "error": "fields are integers"}
        try:
            if op == "program":
                hdm.program(req.pop("index"), **req)
            elif op == "commit":
                hdm.commit(req["index"])
            elif op == "uncommit":
                hdm.uncommit(req["index"])
            elif op == "reset":
                hdm.reset()
        except HdmError as exc:
            return {"ok": False, "reason": exc.reason, "error": str(exc)}
        return {"ok": True, "decoders": hdm.describe()}


class _FrameError(Exception):
    pass


class LineRefused(Exception):
    """A line request the device could not serve (its reason: ``media_error: …`` or
    ``internal: …``, as the socket's ERROR frame says it)."""


# --- socket plumbing ---------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def send_frame(sock: socket.socket, kind: int, body: bytes) -> None:
    sock.sendall(struct.pack("<IB", len(body) + 1, kind) + body)


def recv_frame(sock: socket.socket) -> tuple[int, bytes] | None:
    hdr = _recv_exact(sock, 4)
    if hdr is None:
        return None
    (n,) = struct.unpack("<I", hdr)
    if n == 0 or n > MAX_FRAME:
        raise ConnectionError(f"frame length {n} out of range 1 … {MAX_FRAME}")
    data = _recv_exact(sock, n)
    if data is None:
        return None
    return data[0], data[1:]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        engine: Engine = self.server.engine  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        while True:
            try:
                frame = recv_frame(sock)
            except ConnectionError as exc:
                send_frame(sock, ERROR, f"bad_frame: {exc}".encode())
                return
            if frame is None:
                return
            kind, body = engine.handle(*frame)
            send_frame(sock, kind, body)


UNMAP_POLL_S = 0.0005  # how often a move waiting for QEMU to unmap its page looks again


class Churn(threading.Thread):
    """Moves ``pages`` to NVMe and back while hosts use the device, one move per tick: each
    tick flips a page drawn at random (seeded) to the other tier, so that once mixed each
    page is on NVMe about half the time, independently of the others.  The stress under
    which a patched QEMU's direct accesses must stay right and its trapped ones find NVMe
    pages.  Random, not a sweep: a host walking the pages in order as fast as a sweep's
    front would meet none of them on NVMe (a guest did, one boot in six).  Each move is
    three steps (copy, record the new tier, drop the old copy) with the engine's lock
    released between them, so that any request — a write to the page, a firmware reset —
    can arrive in the middle of a migration."""

    def __init__(
        self, engine: Engine, pages: list[int], interval_s: float = 0.0, seed: int = 0
    ) -> None:
        super().__init__(daemon=True, name="kvcxl-churn")
        if not pages:
            raise ValueError("the churn needs at least one page")
        self.engine, self.pages, self.interval_s = engine, pages, interval_s
        self.rng = random.Random(seed)
        self.halt = threading.Event()
        self.moves = 0

    def _flip(self, p: int) -> None:
        """Page ``p`` to the tier it is not on, in steps."""
        lock, dev = self.engine.lock, self.engine.device
        while True:
            with lock:
                to_dram = not dev.in_dram[p]
                # a page leaving DRAM waits (lock released) until QEMU no longer maps it
                if to_dram or dev.unmap(p):
                    if not dev.start_migration(p, to_dram):
                        return
                    break
            if self.halt.wait(UNMAP_POLL_S):
                return
        while not self.halt.is_set():
            time.sleep(0)  # let a waiting request in between the steps
            with lock:
                if p not in dev.inflight or dev.inflight[p].to_dram != to_dram:
                    return  # a reset (or another move) settled it
                if dev.step_migration(p):
                    self.moves += 1
                    return

    def tick(self) -> None:
        """One move: a page drawn at random flips tier."""
        self._flip(self.pages[self.rng.randrange(len(self.pages))])

    def run(self) -> None:
        while not self.halt.wait(self.interval_s):
            self.tick()


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog (5) refuses (EAGAIN) a burst of concurrent connects.
    request_queue_size = 128

    def __init__(self, path: str | Path, engine: Engine) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.is_socket():
            self.path.unlink()  # a stale socket from an earlier run
        self.engine = engine
        # Owner-only from the moment it exists: the socket reads and writes device memory.
        old = os.umask(0o177)
        try:
            super().__init__(str(self.path), _Handler)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    def server_close(self) -> None:
        super().server_close()
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def serving(engine: Engine, path: str | Path) -> Iterator[Server]:
    """The service on ``path`` in a thread of this process, for the ``with`` block."""
    server = Server(path, engine)
    th = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    th.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        th.join()


@contextlib.contextmanager
def serve_process(path: str | Path, capacity: int, base: int) -> Iterator[subprocess.Popen]:
    """A device of ``capacity`` bytes (the defaults of :class:`Type3Device` otherwise),
    decoder 0 committed over it at HPA ``base``, served on ``path`` in its own process
    (this module run as a script), once its socket exists; stopped (SIGTERM) when the
    ``with`` block ends."""
    path = Path(path)
    cmd = [sys.executable, "-m", __name__, str(path), str(capacity), hex(base)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        while not path.exists():
            if proc.poll() is not None or time.monotonic() - t0 > 60:
                raise RuntimeError(f"device service did not start: {proc.stderr.read()!r}")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def stop_on_sigterm() -> None:
    """SIGTERM ends :func:`serve_until_stopped` as Ctrl-C does; set before the socket
    exists, since a client that sees the socket may stop the service at once."""
    import signal

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def serve_until_stopped(server: Server, dev: Type3Device, announce: str = "") -> None:
    """Print ``announce`` (if any), serve until SIGTERM (:func:`stop_on_sigterm`) or
    Ctrl-C, then close both; a stop during the announcement closes them too."""
    try:
        if announce:
            print(announce, flush=True)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        dev.close()


def _serve_main(path: str, capacity: int, base: int) -> None:
    """The process :func:`serve_process` starts: serve until SIGTERM."""
    dev = Type3Device(capacity)
    dev.hdm.program(0, base=base, size=capacity)
    dev.hdm.commit(0)
    stop_on_sigterm()
    serve_until_stopped(Server(path, Engine(dev)), dev)


class Client:
    """A blocking client of the service (used by the tests and QEMU's bridge)."""

    def __init__(self, path: str | Path, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))

    def call(self, kind: int, body: bytes) -> tuple[int, bytes]:
        send_frame(self.sock, kind, body)
        frame = recv_frame(self.sock)
        if frame is None:
            raise ConnectionError("service closed the connection")
        return frame

    def mem(self, msg: mem.Message) -> mem.Message | None:
        kind, body = self.call(MEM, mem.encode(msg))
        if kind == ERROR:
            raise ValueError(body.decode())
        return mem.decode(body) if body else None

    def cci(self, opcode: int, payload: bytes = b"", tag: int = 0):
        _, body = self.call(CCI, mb.request(opcode, payload, tag))
        return mb.CciMessage.decode(body)

    def read(self, hpa: int, n: int) -> tuple[bytes, int]:
        kind, body = self.call(READ, READ_REQ.pack(hpa, n))
        if kind == ERROR:
            raise ValueError(body.decode())
        flags, _lat = _RW_HDR.unpack_from(body)
        return body[_RW_HDR.size :], flags

    def write(self, hpa: int, data: bytes, poison: bool = False) -> int:
        kind, body = self.call(WRITE, WRITE_REQ.pack(hpa, int(poison)) + data)
        if kind == ERROR:
            raise ValueError(body.decode())
        return _RW_HDR.unpack_from(body)[0]

    def place(self, pages: list[int], to_dram: bool) -> int:
        """Move DPA ``pages`` to the DRAM or the NVMe tier; returns how many were asked."""
        body = _PLACE_HDR.pack(0 if to_dram else 1, len(pages)) + struct.pack(
            f"<{len(pages)}Q", *pages
        )
        kind, rsp = self.call(PLACE, body)
        if kind == ERROR:
            raise ValueError(rsp.decode())
        return struct.unpack("<I", rsp)[0]

    def hdm(self, op: str, **fields: int) -> dict:
        _, body = self.call(HDM, json.dumps({"op": op, **fields}).encode())
        return json.loads(body)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    _serve_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3], 0))
