"""The device touches only what is its own.

Every guest-controlled index, length and address (the service socket's READ/WRITE/CXL.mem
frames, the ring's commands) is tried at and one past each boundary: the answer must be the
protocol's (data, an ERROR frame, the ring's return code) and no byte outside the addressed
range may change (compared with a shadow copy, or with a snapshot of the whole ring).  The
sockets and media files are owner-only; a second client on the service socket cannot disturb
the first's frames or data.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cxl import mem
from kvcxl.cxl import ring as L
from kvcxl.emu.device import service as svc
from kvcxl.emu.device.device import MAX_CONTEXTS, MAX_INDEX_CELLS, Type3Device
from kvcxl.qemu.ring_client import RingClient
from kvcxl.qemu.service import FirmwareService

BASE = 1 << 32
CAP = 256 << 20
END = BASE + CAP  # one past the last byte decoder 0 maps


@pytest.fixture
def served(tmp_path: Path):
    """An in-process `device serve`: decoder 0 maps [BASE, END) onto a DRAM file."""
    dev = Type3Device(CAP, dram_pages=16, dram_file=tmp_path / "dram.img")
    dev.hdm.program(0, base=BASE, size=CAP, ways=1, granularity=256, position=0)
    dev.hdm.commit(0)
    with svc.serving(svc.Engine(dev), tmp_path / "dev.sock") as server:
        yield server, dev
    dev.close()


def _raw(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(path))
    return s


def test_the_service_socket_and_media_are_owner_only(served, tmp_path) -> None:
    server, _ = served
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "dram.img").st_mode) == 0o600


def test_qemu_and_the_ring_service_start_owner_only(monkeypatch, tmp_path) -> None:
    """The QMP socket and the plugin ring are QEMU's creations: QEMU runs under the umask
    boot gives it, and a socket bound under that umask is owner-only."""
    import subprocess
    import sys

    from kvcxl.qemu import boot

    seen: list[int | None] = []
    real = subprocess.Popen

    def popen(cmd, **kw):  # the boot's own Popen calls, with a socket-binding stand-in
        seen.append(kw.get("umask"))
        path = str(tmp_path / f"qmp{len(seen)}.sock")
        code = "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"
        kw.pop("stdout", None), kw.pop("stderr", None), kw.pop("stdin", None)
        return real([sys.executable, "-c", code, path], **kw)

    monkeypatch.setattr(boot.subprocess, "Popen", popen)
    b = boot.Boot.__new__(boot.Boot)
    b.opts = boot.BootOptions(poison=())
    b.workdir = tmp_path
    b.qemu_command = lambda use_plugin: ["qemu"]
    b._read_console = lambda: None
    b.events = []
    b._start_qemu(False)
    b.qemu.wait(timeout=30)
    assert seen == [boot.OWNER_ONLY]
    mode = stat.S_IMODE(os.stat(tmp_path / "qmp1.sock").st_mode)
    assert mode & 0o077 == 0, oct(mode)


IO_ROWS = [
    # (what, hpa, length, accepted, mapped bytes)
    ("largest read", BASE, svc.MAX_IO, True, svc.MAX_IO),
    ("one past the largest", BASE, svc.MAX_IO + 1, False, 0),
    ("ends at the last mapped byte", END - 4096, 4096, True, 4096),
    ("one byte past the decoder", END - 4095, 4096, True, 4095),
    ("starts past the decoder", END, 64, True, 0),
    ("empty, at the decoder's end", END, 0, True, 0),  # found by the socket fuzzer
    ("empty, past the decoder", END + 4096, 0, True, 0),
    ("below the decoder", BASE - 64, 128, True, 64),
    ("ends at the HPA limit", mem.HPA_LIMIT - 64, 64, True, 0),
    ("one past the HPA limit", mem.HPA_LIMIT - 63, 64, False, 0),
    ("at the HPA limit", mem.HPA_LIMIT, 1, False, 0),
    ("largest HPA", (1 << 64) - 1, 1, False, 0),
]


@pytest.mark.parametrize(("what", "hpa", "n", "ok", "mapped"), IO_ROWS, ids=[r[0] for r in IO_ROWS])
def test_read_and_write_at_every_boundary(served, what, hpa, n, ok, mapped) -> None:
    server, _ = served
    rng = np.random.default_rng(n)
    # A shadow of the bytes around both ends of the decoder, written through the device.
    around = [(BASE, 1 << 20), (END - (1 << 20), 1 << 20)]
    shadow = {}
    with svc.Client(server.path) as c:
        for a, size in around:
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            c.write(a, data)
            shadow[a] = bytearray(data)
        payload = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        kind, body = c.call(svc.WRITE, struct.pack("<QB7x", hpa, 0) + payload)
        assert (kind == svc.WRITE) == ok, body
        if ok:
            flags = svc._RW_HDR.unpack_from(body)[0]
            assert bool(flags & svc.FLAG_UNMAPPED) == (mapped < n)
            for a, _ in around:  # what the write addressed and a decoder maps changes
                lo, hi = max(a, hpa, BASE), min(a + len(shadow[a]), hpa + n, END)
                if lo < hi:
                    shadow[a][lo - a : hi - a] = payload[lo - hpa : hi - hpa]
        kind, body = c.call(svc.READ, struct.pack("<QI", hpa, n))
        assert (kind == svc.READ) == ok, body
        if ok:
            got = body[svc._RW_HDR.size :]
            assert len(got) == n
            lo, hi = max(hpa, BASE), min(hpa + n, END)
            assert got[lo - hpa : hi - hpa] == payload[lo - hpa : hi - hpa]
            assert not any(got[: max(lo - hpa, 0)]) and not any(got[max(hi - hpa, 0) :])
        for a, size in around:  # and nothing else did
            got, _ = c.read(a, size)
            assert got == bytes(shadow[a]), what


def test_frame_lengths_at_the_limit(served) -> None:
    server, _ = served
    with _raw(server.path) as s:
        # The largest frame is read whole (then refused for its kind): the stream survives.
        s.sendall(struct.pack("<IB", svc.MAX_FRAME, 0x42) + bytes(svc.MAX_FRAME - 1))
        assert svc.recv_frame(s)[0] == svc.ERROR
        svc.send_frame(s, svc.READ, struct.pack("<QI", BASE, 8))
        assert svc.recv_frame(s)[0] == svc.READ
        for body in (bytes(11), bytes(13)):  # READ takes exactly 12 bytes
            svc.send_frame(s, svc.READ, body)
            assert svc.recv_frame(s)[1].startswith(b"bad_length")
        svc.send_frame(s, svc.WRITE, bytes(15))  # WRITE takes at least 16
        assert svc.recv_frame(s)[1].startswith(b"bad_length")
    with _raw(server.path) as s:  # one byte more: refused, and this connection closed
        s.sendall(struct.pack("<I", svc.MAX_FRAME + 1))
        kind, body = svc.recv_frame(s)
        assert kind == svc.ERROR and body.startswith(b"bad_frame")
        assert s.recv(1) == b""
    with _raw(server.path) as s:  # a zero length likewise
        s.sendall(struct.pack("<I", 0))
        assert svc.recv_frame(s)[0] == svc.ERROR


@pytest.mark.parametrize("offset", [-64, 0, 64])
def test_cxl_mem_lines_at_the_decoder_end(served, offset) -> None:
    server, _ = served
    hpa = END - 64 + offset  # the last mapped line, one before it, the first unmapped one
    with svc.Client(server.path) as c:
        c.write(END - 256, bytes(range(256)))
        before = c.read(END - 256, 256)[0]
        rsp = c.mem(mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR, 7, hpa >> 6, b"\xab" * 64))
        assert rsp is not None and rsp.tag == 7
        after = c.read(END - 256, 256)[0]
        want = bytearray(before)
        if hpa < END:
            want[hpa - (END - 256) : hpa - (END - 256) + 64] = b"\xab" * 64
        assert after == bytes(want)
        rd = c.mem(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, 8, hpa >> 6))
        assert rd.tag == 8
        assert rd.data == (b"\xab" * 64 if hpa < END else bytes(64))


def test_a_second_client_cannot_disturb_the_first(served) -> None:
    """Client A writes and reads its range while B floods the socket with partial,
    oversized, unknown and truncated frames: every answer A gets is the answer to its own
    frame, and its bytes read back intact."""
    server, _ = served
    stop = threading.Event()

    def intruder() -> None:
        rng = np.random.default_rng(1)
        while not stop.is_set():
            with _raw(server.path) as s:
                choice = int(rng.integers(4))
                try:
                    if choice == 0:  # half a frame, then hang up
                        s.sendall(struct.pack("<IB", 64, svc.WRITE) + bytes(10))
                    elif choice == 1:  # a length the stream cannot resynchronise after
                        s.sendall(struct.pack("<I", svc.MAX_FRAME + 1))
                        svc.recv_frame(s)
                    elif choice == 2:  # unknown kind and random bytes
                        svc.send_frame(s, 0x33, rng.bytes(40))
                        svc.recv_frame(s)
                    else:  # a truncated WRITE aimed at A's range
                        svc.send_frame(s, svc.WRITE, struct.pack("<Q", BASE))
                        svc.recv_frame(s)
                except OSError:
                    pass

    threads = [threading.Thread(target=intruder) for _ in range(2)]
    for t in threads:
        t.start()
    # B also holds a connection open in the middle of a frame for the whole run.
    holder = _raw(server.path)
    holder.sendall(struct.pack("<IB", 4096, svc.WRITE) + bytes(100))
    try:
        with svc.Client(server.path, timeout=5) as a:
            rng = np.random.default_rng(2)
            mine = {}
            for i in range(300):
                off = int(rng.integers(0, 1 << 20)) & ~63
                data = rng.bytes(int(rng.integers(1, 512)))
                assert a.write(BASE + off, data) == 0
                for o, d in list(mine.items()):  # later writes overwrite earlier ones
                    if o < off + len(data) and off < o + len(d):
                        del mine[o]
                mine[off] = data
                if i % 10 == 0:
                    for o, d in mine.items():
                        assert a.read(BASE + o, len(d))[0] == d
    finally:
        stop.set()
        holder.close()
        for t in threads:
            t.join()


# --- the ring ----------------------------------------------------------------------------------
@pytest.fixture
def ring(tmp_path: Path):
    media = tmp_path / "media.bin"
    with open(media, "wb") as f:
        f.truncate(64 << 20)
    fw = FirmwareService(media)
    cl = RingClient(media, heartbeat_timeout=0.3)
    cl.wait_ready(timeout=1)
    yield fw, cl
    cl.close()


def _submit_raw(cl: RingClient, op: int, *, count=0, in_len=0, step=0, arg0=0, arg1=0) -> int:
    """An SQE with any in_len (RingClient.submit derives it from the payload)."""
    i = cl.sq_tail
    cl.mm[L.sq_offset(i) : L.sq_offset(i) + L.ENTRY] = L.SQE_FMT.pack(
        op, 0, cl.cid, step, 0, count, in_len, arg0, arg1
    )
    cl.cid += 1
    cl.sq_tail = (i + 1) & 0xFFFFFFFF
    struct.pack_into("<I", cl.mm, L.RING_BASE + L.HOST_HDR, cl.sq_tail)
    return i


def _call_checked(fw: FirmwareService, cl: RingClient, submit) -> tuple[int, int]:
    """Run one command; assert it changed only the device's header, its completion entry and
    its output slot's first out_len bytes.  Returns (status, r0)."""
    i = submit()  # the guest's own stores (its SQE and payload) come before the snapshot
    before = np.frombuffer(bytes(fw.mm[: L.KV_BASE + (1 << 20)]), np.uint8)
    c = cl.wait(i, fw.poll_once)
    after = np.frombuffer(bytes(fw.mm[: L.KV_BASE + (1 << 20)]), np.uint8)
    changed = np.flatnonzero(before != after)
    allowed = [
        (L.RING_BASE + L.DEV_HDR, L.RING_BASE + L.HOST_HDR),
        (L.RING_BASE + L.HOST_HDR, L.RING_BASE + L.HOST_HDR + 8),  # the client's cq_head
        (L.cq_offset(i), L.cq_offset(i) + L.ENTRY),
        (L.slot_out_offset(i), L.slot_out_offset(i) + c.out_len),
    ]
    stray = [int(x) for x in changed if not any(lo <= x < hi for lo, hi in allowed)]
    assert not stray, f"bytes changed outside the command's own: {[hex(x) for x in stray[:5]]}"
    assert c.out_len <= L.SLOT_OUT
    return c.status, c.r[0]


def _open(fw, cl, n=64, eb=64, cap=8) -> int:
    payload = L.OPEN_FMT.pack(n, eb, cap, 16, 0)
    return _call_checked(fw, cl, lambda: cl.submit(L.OP_OPEN, payload=payload))[0]


def test_ring_in_len_and_count_at_the_limit(ring) -> None:
    fw, cl = ring
    assert _open(fw, cl, n=2048) == L.RC_SUCCESS
    rec = np.zeros(L.CREATE_MAX, L.CREATE_REC)
    rec["entry"] = np.arange(L.CREATE_MAX)
    rec["block"] = 100
    st, _ = _call_checked(
        fw, cl, lambda: cl.submit(L.OP_CREATE, count=L.CREATE_MAX, payload=rec.tobytes())
    )
    assert st == L.RC_SUCCESS
    for count in (L.ATTN_MAX, L.ATTN_MAX + 1):
        n = min(count, L.ATTN_MAX)
        att = np.zeros(n, L.ATTN_REC)
        att["entry"] = np.arange(n) % L.CREATE_MAX
        att["weight"] = 0.01

        def go(att=att, count=count):
            o = L.slot_in_offset(cl.sq_tail)
            cl.mm[o : o + att.nbytes] = att.tobytes()
            return _submit_raw(cl, L.OP_ATTN, count=count, in_len=att.nbytes, step=1)

        st, _ = _call_checked(fw, cl, go)
        assert st == (L.RC_SUCCESS if count <= L.ATTN_MAX else L.RC_INVALID_PAYLOAD_LENGTH)
    for in_len in (L.SLOT_IN, L.SLOT_IN + 1):
        # SLOT_IN bytes is a legal length (for the wrong count: refused by the count check);
        # one byte more is refused before the payload is read.
        st, _ = _call_checked(
            fw, cl, lambda in_len=in_len: _submit_raw(cl, L.OP_ATTN, count=1, in_len=in_len, step=1)
        )
        assert st == L.RC_INVALID_PAYLOAD_LENGTH
    assert any("in_len 8193" in m for m in fw.error_log)
    assert not any("in_len 8192 >" in m for m in fw.error_log)  # the count check refused it


def test_ring_open_and_poison_at_the_media_end(ring) -> None:
    fw, cl = ring
    eb = 4096
    fits = (fw.size - L.KV_BASE) // eb
    assert _open(fw, cl, n=fits + 1, eb=eb) == L.RC_INVALID_INPUT
    assert _open(fw, cl, n=fits, eb=eb) == L.RC_SUCCESS
    for dpa, length, want in (
        (fw.size - 64, 64, L.RC_SUCCESS),
        (fw.size - 64, 128, L.RC_INVALID_INPUT),
        (fw.size, 64, L.RC_INVALID_INPUT),
        ((1 << 64) - 64, 64, L.RC_INVALID_INPUT),
        (L.KV_BASE, 0, L.RC_INVALID_INPUT),
    ):
        st, _ = _call_checked(
            fw, cl, lambda d=dpa, n=length: cl.submit(L.OP_POISON, arg0=d, arg1=n)
        )
        assert st == want, (hex(dpa), length)


@pytest.mark.parametrize(
    ("field", "value", "want"),
    [
        ("ctx", MAX_CONTEXTS - 1, L.RC_SUCCESS),
        ("ctx", MAX_CONTEXTS, L.RC_INVALID_INPUT),
        ("ctx", 0xFFFFFFFF, L.RC_INVALID_INPUT),
        ("layer", 0x7FFF, L.RC_SUCCESS),
        ("layer", 0x8000, L.RC_INVALID_INPUT),
        ("head", 0x8000, L.RC_INVALID_INPUT),
        ("block", MAX_INDEX_CELLS - 1, L.RC_SUCCESS),  # the index spans 1 × 1 × 2^23
        ("block", MAX_INDEX_CELLS, L.RC_INVALID_INPUT),  # one cell more
        ("block", 0x7FFFFFFF // 16 + 1, L.RC_INVALID_INPUT),
        ("tokens", 1 << 40, L.RC_SUCCESS),
        ("tokens", (1 << 40) + 1, L.RC_INVALID_INPUT),
    ],
)
def test_ring_only_session_ids_at_their_bounds(ring, field, value, want) -> None:
    """Without the device emulator the service's own session indexes per-context arrays by
    the guest's ids: the same bounds as the device's, before any use."""
    fw, cl = ring
    assert _open(fw, cl) == L.RC_SUCCESS
    if field == "tokens" or field == "ctx":
        rec = np.zeros(1, L.CTX_LEN_REC)
        rec["ctx"] = value if field == "ctx" else 0
        rec["tokens"] = value if field == "tokens" else 16
        st, _ = _call_checked(
            fw, cl, lambda: cl.submit(L.OP_CTX_LEN, count=1, payload=rec.tobytes())
        )
        assert st == want
    if field != "tokens":
        rec = np.zeros(1, L.CREATE_REC)
        rec["entry"] = fw.table.n
        rec["block"] = 100
        rec[field] = value
        st, _ = _call_checked(
            fw, cl, lambda: cl.submit(L.OP_CREATE, count=1, payload=rec.tobytes())
        )
        assert st == want


def test_an_answer_longer_than_its_slot_is_an_error_with_no_output(ring) -> None:
    """A handler's answer over the output slot completes as Internal Error carrying no
    output: nothing lands past the slot (the next slot's input is left as it was)."""
    fw, cl = ring
    fw.op_nop = lambda *a: (b"\xee" * (L.SLOT_OUT + 64), (1, 2, 3, 4, 5))
    nxt = L.slot_in_offset(cl.sq_tail + 1)
    cl.mm[nxt : nxt + 64] = bytes(range(64))
    c = cl.call(L.OP_NOP, fw.poll_once)
    assert (c.status, c.out_len, c.r) == (L.RC_INTERNAL, 0, (0, 0, 0, 0, 0))
    assert cl.mm[nxt : nxt + 64] == bytes(range(64))
    assert fw.status_counts == {"Internal Error": 1} and fw.commands == {"NOP": 1}


def test_ring_doorbell_more_than_a_ring_ahead_is_refused(ring) -> None:
    fw, cl = ring
    served = []
    fw.op_nop = lambda *a: served.append(1) or (b"", (0,) * 5)  # the NOP row's handler
    for ahead, want in ((L.DEPTH + 1, 0), (0xFFFFFFFF, 0), (L.DEPTH, L.DEPTH)):
        for k in range(min(ahead, L.DEPTH)):  # fill the slots with NOPs
            o = L.sq_offset(fw.sq_head + k)
            cl.mm[o : o + L.ENTRY] = L.SQE_FMT.pack(L.OP_NOP, 0, 1, 0, 0, 0, 0, 0, 0)
        struct.pack_into("<I", cl.mm, L.RING_BASE + L.HOST_HDR, (fw.sq_head + ahead) & 0xFFFFFFFF)
        served.clear()
        assert fw.poll_once() == want
        assert len(served) == want
    assert fw.status_counts["BAD_DOORBELL"] == 2


def test_the_device_bounds_the_prefetch_index_its_ids_span() -> None:
    """Describe Entries: ids within every field's range can still make the firmware's dense
    per-context index huge (layers × heads × blocks); the sum over contexts is bounded."""
    dev = Type3Device(256 << 20, entries="host")
    dev.describe([0], [0], [0], [0], [MAX_INDEX_CELLS - 1])  # 1 × 1 × 2^23 cells: the limit
    with pytest.raises(ValueError, match="prefetch index"):
        dev.describe([1], [1], [0], [0], [0])  # a second context: one cell more
    with pytest.raises(ValueError, match="prefetch index"):
        dev.describe([1], [0], [1], [0], [0])  # a second layer doubles the first context's
    dev.describe([1], [0], [0], [0], [5])  # inside the extent: no new cell
