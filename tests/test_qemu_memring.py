"""The CXL.mem request ring in shared memory (kvcxl/qemu/memring.py), without QEMU.

QEMU's end is written here a second time from docs/qemu.md ("The CXL.mem request ring"),
plainly: a record, the tail, the wake-up when the device sleeps, then wait for the head.
Checked: every answer equals the socket's for the same request on a twin device (bytes,
poison, counters), the doorbell rings the command ring through it, each bad record is
refused and the ring goes on, a tail too far ahead faults the ring (and the server ends,
not the process), a sleeping device is woken, mutated records never crash the server,
and the C header generated for QEMU carries the same numbers as the Python tables."""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import struct
import time
from pathlib import Path

import pytest

from kvcxl.cxl import mem
from kvcxl.cxl import ring as L
from kvcxl.emu.device.service import MEM, Engine
from kvcxl.qemu import memring
from kvcxl.qemu.ring_device import build

U32 = struct.Struct("<I")
TRAP = (L.WIDTHS_BASE, L.WIDTHS_BYTES)


class HostEnd:
    """QEMU's side of the ring (one request at a time, as QEMU holds its link lock)."""

    def __init__(self, path: Path) -> None:
        self._f = open(path, "r+b")
        self.mm = mmap.mmap(self._f.fileno(), L.MR_BYTES)
        self._view = (ctypes.c_uint32 * (L.MR_BYTES // 4)).from_buffer(self.mm)
        self.base = ctypes.addressof(self._view)
        self.tail = U32.unpack_from(self.mm, L.MR_HDR["req_head"])[0]

    def word(self, name: str) -> int:
        return U32.unpack_from(self.mm, L.MR_HDR[name])[0]

    def post(self, op: int, addr: int, be: int = 0, data: bytes = bytes(64), **bad) -> int:
        """Write record ``tail`` (fields overridable to make it bad) and publish it."""
        t = self.tail
        at = L.MR_RECORDS + (t % L.MR_DEPTH) * L.MR_REC_BYTES
        fields = {"op": op, "flags": 0, "seq": t, "addr": addr, "byte_enable": be, **bad}
        struct.pack_into("<H", self.mm, at + L.MR_REC["op"], fields["op"])
        struct.pack_into("<H", self.mm, at + L.MR_REC["flags"], fields["flags"])
        struct.pack_into("<I", self.mm, at + L.MR_REC["seq"], fields["seq"])
        struct.pack_into("<Q", self.mm, at + L.MR_REC["addr"], fields["addr"])
        struct.pack_into("<Q", self.mm, at + L.MR_REC["byte_enable"], fields["byte_enable"])
        self.mm[at + L.MR_REC["data"] : at + L.MR_REC["data"] + 64] = data
        self.tail = (t + 1) & 0xFFFFFFFF
        U32.pack_into(self.mm, L.MR_HDR["req_tail"], self.tail)
        if self.word("dev_sleep"):
            memring.futex_wake(self.base + L.MR_HDR["req_tail"])
        return at

    def wait(self, at: int, timeout: float = 10.0) -> tuple[int, bytes]:
        t0 = time.monotonic()
        while self.word("req_head") != self.tail:
            if self.word("fault"):
                raise ConnectionError("the device faulted the ring")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError("no answer")
            time.sleep(0)  # the server is a thread of this process: let it have the GIL
        st = struct.unpack_from("<H", self.mm, at + L.MR_REC["status"])[0]
        return st, bytes(self.mm[at + L.MR_REC["data"] : at + L.MR_REC["data"] + 64])

    def call(self, op: int, addr: int, be: int = 0, data: bytes = bytes(64), **bad):
        return self.wait(self.post(op, addr, be, data, **bad))

    def close(self) -> None:
        del self._view
        self.mm.close()
        self._f.close()


def _device(tmp: Path, name: str):
    media = tmp / f"{name}.bin"
    with open(media, "wb") as f:
        f.truncate(256 << 20)  # sparse: the smallest device the HDM decoder takes
    engine, ring = build(media, tmp / f"{name}-ps.bin", trap=(TRAP,))
    return engine, ring


@pytest.fixture
def served(tmp_path):
    """A device serving its request ring, QEMU's end of it, and a twin device (same
    state) reached the socket's way (Engine.handle with MEM frames)."""
    engine, _ring = _device(tmp_path, "a")
    twin, _ = _device(tmp_path, "b")
    path = tmp_path / "mem-ring.bin"
    memring.create(path)
    srv = memring.MemRingServer(engine, path)
    srv.start()
    host = HostEnd(path)
    yield engine, twin, srv, host
    srv.stop()
    host.close()
    srv.close()
    engine.device.close()
    twin.device.close()


def _socket_way(twin: Engine, op: int, addr: int, be: int, data: bytes) -> tuple[int, bytes]:
    """The same request as a MEM frame: (ring status it corresponds to, line read)."""
    if op == L.MR_OP_READ:
        req = mem.M2SReq(mem.M2SReqOpcode.MEM_RD, tag=0, addr=addr)
    else:
        req = mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR_PTL, tag=0, addr=addr, byte_enable=be,
                         data=data)  # fmt: skip
    kind, body = twin.handle(MEM, mem.encode(req))
    assert kind == MEM
    rsp = mem.decode(body)
    if isinstance(rsp, mem.S2MDRS):
        return (L.MR_ST_POISON if rsp.poison else L.MR_ST_OK), rsp.data
    return L.MR_ST_OK, bytes(64)


def test_answers_equal_the_sockets_for_random_reads_and_writes(served) -> None:
    engine, twin, srv, host = served
    rng = random.Random(7)
    lines = L.WIDTHS_BYTES // 64
    # a poisoned line in both devices (the ring must answer POISON where the socket does)
    for e in (engine, twin):
        e.device.inject_poison(L.WIDTHS_BASE + 5 * 64)
    for i in range(400):
        addr = (L.WIDTHS_BASE >> 6) + (5 if i % 50 == 0 else rng.randrange(lines))
        if i % 50 == 0 or rng.random() < 0.5:
            got = host.call(L.MR_OP_READ, addr)
            want = _socket_way(twin, L.MR_OP_READ, addr, 0, bytes(64))
        else:
            size = rng.choice((1, 2, 4, 8))
            off = rng.randrange(0, 64 - size + 1)
            be = ((1 << size) - 1) << off
            data = bytes(rng.randrange(256) for _ in range(64))
            got = host.call(L.MR_OP_WRITE, addr, be, data)
            want = _socket_way(twin, L.MR_OP_WRITE, addr, be, data)
            got = (got[0], bytes(64))  # a write's data field is the host's own bytes
        assert got == want
    a, b = engine.device.counters, twin.device.counters
    for k in ("mem_requests", "reads", "writes", "write_bytes", "poisoned_reads"):
        assert a[k] == b[k], k
    assert (
        engine.device.read(L.WIDTHS_BASE, L.WIDTHS_BYTES).data
        == twin.device.read(L.WIDTHS_BASE, L.WIDTHS_BYTES).data
    )
    assert srv.statuses["poison"] > 0 and srv.fault is None


def test_the_doorbell_rings_the_command_ring_through_it(served, tmp_path) -> None:
    engine, _twin, _srv, host = served
    ring = engine.doorbells[(L.RING_BASE + L.HOST_HDR) >> 6][1].__self__
    mm = ring.mm
    # one NOP in the SQ, then the doorbell's store of sq_tail as QEMU sends it
    L.SQE_FMT.pack_into(mm, L.sq_offset(0), L.OP_NOP, 0, 1, 0, 0, 0, 0, 0xABC, 0)
    line = bytearray(64)
    off = L.HOST_HDR & 63
    struct.pack_into("<I", line, off, 1)
    st, _ = host.call(L.MR_OP_WRITE, (L.RING_BASE + L.HOST_HDR) >> 6, 0xF << off, bytes(line))
    assert st == L.MR_ST_OK
    # answered before the write completed: the completion is there
    cqe = L.CQE_FMT.unpack_from(mm, L.cq_offset(0))
    assert cqe[1] == L.RC_SUCCESS and cqe[-1] == 1 and cqe[-2] == 0xABC
    assert engine.rung == 1


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"op": 7}, "unknown opcode"),
        ({"op": 0}, "unknown opcode"),
        ({"flags": 1}, "flags"),
        ({"seq": 12345}, "sequence number"),
        ({"addr": 1 << mem.ADDR_BITS}, "line address"),
        ({"be": 0xFF}, "byte enables"),  # on a read
    ],
)
def test_a_bad_record_is_refused_and_the_ring_goes_on(served, bad, why) -> None:
    _engine, _twin, srv, host = served
    st, _ = host.call(**{"op": L.MR_OP_READ, "addr": L.WIDTHS_BASE >> 6, **bad})
    assert st == L.MR_ST_REFUSED
    assert why in srv.refusals[-1]
    st, _ = host.call(L.MR_OP_READ, L.WIDTHS_BASE >> 6)  # the next good one is served
    assert st == L.MR_ST_OK and srv.fault is None


def test_a_write_with_no_byte_enabled_is_refused(served) -> None:
    _engine, _twin, srv, host = served
    st, _ = host.call(L.MR_OP_WRITE, L.WIDTHS_BASE >> 6, 0)
    assert st == L.MR_ST_REFUSED and "no byte" in srv.refusals[-1]


def test_a_device_failure_is_a_refusal_not_a_crash(served, monkeypatch) -> None:
    engine, _twin, srv, host = served

    def boom(*_a, **_k):
        raise RuntimeError("planted")

    monkeypatch.setattr(engine.device, "read_line", boom)
    st, _ = host.call(L.MR_OP_READ, L.WIDTHS_BASE >> 6)
    assert st == L.MR_ST_REFUSED and "internal: RuntimeError: planted" in srv.refusals[-1]
    assert engine.device.counters["internal_errors"] == 1
    monkeypatch.undo()
    assert host.call(L.MR_OP_READ, L.WIDTHS_BASE >> 6)[0] == L.MR_ST_OK


def test_a_tail_too_far_ahead_faults_the_ring_and_ends_the_server(served) -> None:
    _engine, _twin, srv, host = served
    host.tail = (host.tail + L.MR_DEPTH) & 0xFFFFFFFF  # DEPTH + 1 unanswered once posted
    with pytest.raises(ConnectionError):
        host.call(L.MR_OP_READ, L.WIDTHS_BASE >> 6)
    srv.join(timeout=5)
    assert not srv.is_alive() and "ahead" in srv.fault
    assert host.word("fault") == L.MR_FAULT_BAD_INDEX


def test_a_sleeping_device_is_woken(tmp_path, monkeypatch) -> None:
    """The device asleep in futex is woken by the host's FUTEX_WAKE, not by its timeout
    (made 60 s here): none of its sleeps ended by the timeout."""
    monkeypatch.setattr(L, "MR_WAIT_NS", 60_000_000_000)
    engine, _ring = _device(tmp_path, "a")
    path = tmp_path / "mem-ring.bin"
    memring.create(path)
    srv = memring.MemRingServer(engine, path)
    srv.start()
    host = HostEnd(path)
    try:
        for _ in range(3):
            t0 = time.monotonic()
            while not host.word("dev_sleep"):  # idle past its spin: asleep in futex
                assert time.monotonic() - t0 < 60, "the device never went to sleep"
                time.sleep(0.001)
            time.sleep(0.01)
            assert host.call(L.MR_OP_READ, L.WIDTHS_BASE >> 6)[0] == L.MR_ST_OK
        assert srv.sleeps >= 3 and srv.sleep_timeouts == 0
    finally:
        srv.stop()
        host.close()
        srv.close()
        engine.device.close()


def test_mutated_records_get_the_models_status_and_never_crash(served) -> None:
    """Fuzz: records with fields drawn from good and bad values; each status is the one a
    plain model of the rules predicts, and the server serves on."""
    _engine, _twin, srv, host = served
    rng = random.Random(1)
    for _ in range(600):
        op = rng.choice((L.MR_OP_READ, L.MR_OP_WRITE, 0, 3, 0xFFFF))
        flags = rng.choice((0, 0, 0, 1, 0x8000))
        seq_bad = rng.random() < 0.15
        addr = rng.choice(((L.WIDTHS_BASE >> 6) + rng.randrange(1024), 1 << 46, (1 << 64) - 1))
        be = rng.choice((0, 1, 0xFF << 8, (1 << 64) - 1, 0x8000000000000001))
        kw = {"flags": flags}
        if seq_bad:
            kw["seq"] = (host.tail + 1 + rng.randrange(1000)) & 0xFFFFFFFF
        st, _ = host.call(op, addr, be, bytes(rng.randrange(256) for _ in range(64)), **kw)
        ok = (
            op in (L.MR_OP_READ, L.MR_OP_WRITE) and flags == 0 and not seq_bad
            and addr < 1 << 46 and (be == 0) == (op == L.MR_OP_READ)
        )  # fmt: skip
        if not ok:
            assert st == L.MR_ST_REFUSED
        else:
            assert st in (L.MR_ST_OK, L.MR_ST_POISON)
    assert srv.is_alive() and srv.fault is None
    assert srv.served == 600 and sum(srv.statuses.values()) == 600


def test_the_generated_header_carries_the_layout(tmp_path) -> None:
    """QEMU's numbers are the Python tables', compiled: a probe prints the header's."""
    from kvcxl.qemu.qemu_patch import render_header

    (tmp_path / "h.h").write_text(render_header())
    names = [f"KVCXL_MR_OFF_{k.upper()}" for k in L.MR_HDR]
    names += [f"KVCXL_MR_REC_{k.upper()}" for k in L.MR_REC]
    names += ["KVCXL_MR_MAGIC", "KVCXL_MR_VERSION", "KVCXL_MR_DEPTH", "KVCXL_MR_REC_BYTES",
              "KVCXL_MR_RECORDS", "KVCXL_MR_BYTES", "KVCXL_MR_OP_READ", "KVCXL_MR_OP_WRITE",
              "KVCXL_MR_ST_OK", "KVCXL_MR_ST_POISON", "KVCXL_MR_ST_REFUSED"]  # fmt: skip
    body = "".join(f'printf("%llu\\n", (unsigned long long)({n}));' for n in names)
    (tmp_path / "p.c").write_text(f'#include <stdio.h>\n#include "h.h"\nint main(void){{{body}}}')
    import subprocess

    subprocess.run(["gcc", "-o", tmp_path / "p", tmp_path / "p.c"], check=True, cwd=tmp_path)
    got = [int(x) for x in subprocess.check_output([tmp_path / "p"]).split()]
    want = [*L.MR_HDR.values(), *L.MR_REC.values(), L.MR_MAGIC, L.MR_VERSION, L.MR_DEPTH,
            L.MR_REC_BYTES, L.MR_RECORDS, L.MR_BYTES, L.MR_OP_READ, L.MR_OP_WRITE,
            L.MR_ST_OK, L.MR_ST_POISON, L.MR_ST_REFUSED]  # fmt: skip
    assert got == want
    # the ring file the device creates carries the geometry QEMU checks
    path = tmp_path / "r.bin"
    memring.create(path)
    raw = path.read_bytes()
    assert len(raw) == L.MR_BYTES and os.stat(path).st_mode & 0o077 == 0
    for k, v in (("magic", L.MR_MAGIC), ("version", L.MR_VERSION), ("depth", L.MR_DEPTH),
                 ("rec_bytes", L.MR_REC_BYTES)):  # fmt: skip
        assert U32.unpack_from(raw, L.MR_HDR[k])[0] == v
