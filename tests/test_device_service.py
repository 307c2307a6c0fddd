"""The service: `kvcxl device serve` on a Unix socket, driven by the client and raw frames."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.emu.device import service as svc

BASE = 1 << 32


@pytest.fixture
def server(tmp_path):
    sock = tmp_path / "dev.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvcxl.cli.main",
            "device",
            "serve",
            "--socket",
            str(sock),
            "--capacity",
            "256MiB",
            "--dram-pages",
            "16",
            "--decoder",
            hex(BASE),
            "--dram-file",
            str(tmp_path / "dram.img"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 30
    while not sock.exists():
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(proc.stderr.read().decode())
        time.sleep(0.05)
    yield sock
    proc.terminate()
    proc.wait(timeout=10)
    assert proc.returncode == 0
    assert not sock.exists()


def test_serve_end_to_end(server):
    with svc.Client(server) as c:
        assert c.write(BASE + 10, b"kvcxl" * 2000) == 0
        data, flags = c.read(BASE + 10, 10_000)
        assert data == b"kvcxl" * 2000 and flags == 0
        rsp = c.mem(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, 42, BASE >> 6))
        assert rsp.tag == 42 and rsp.data[10:15] == b"kvcxl"
        assert c.mem(mem.M2SReq(mem.M2SReqOpcode.MEM_SPEC_RD, 1, BASE >> 6)) is None
        nxm = c.mem(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, 43, 0))
        assert nxm.opcode == mem.S2MDRSOpcode.MEM_DATA_NXM
        _, flags = c.read(0, 64)
        assert flags == svc.FLAG_UNMAPPED
        r = c.cci(mb.Opcode.IDENTIFY_MEMORY_DEVICE, tag=3)
        assert r.rc == 0 and r.tag == 3 and len(r.payload) == 0x45
        assert c.cci(0x1234).rc == mb.ReturnCode.UNSUPPORTED
        assert c.hdm("list")["decoders"][0]["committed"] is True
        assert c.hdm("program", index=0, base=0, size=1)["reason"] == "committed"


def test_malformed_frames_get_error_frames_and_the_connection_survives(server):
    with svc.Client(server) as c:
        kind, body = c.call(0x42, b"")
        assert kind == svc.ERROR and body.startswith(b"bad_kind")
        kind, body = c.call(svc.MEM, b"\x01\x02")
        assert kind == svc.ERROR and body.startswith(b"mem_bad_length")
        kind, body = c.call(svc.MEM, mem.encode(mem.S2MNDR(0, 1)))
        assert body.startswith(b"mem_wrong_direction")
        kind, body = c.call(svc.READ, b"\0" * 5)
        assert body.startswith(b"bad_length")
        assert c.hdm("bogus")["reason"] == "bad_op"
        assert c.read(BASE, 4)[1] == 0  # still serving
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(server))
    s.sendall(struct.pack("<I", svc.MAX_FRAME + 1))
    kind, body = svc.recv_frame(s)
    assert kind == svc.ERROR and body.startswith(b"bad_frame")
    assert s.recv(1) == b""  # closed: the stream cannot be resynchronised
    s.close()


def test_dram_file_is_the_device_media(server, tmp_path):
    with svc.Client(server) as c:
        c.cci(mb.Opcode.VENDOR_ATTENTION_REPORT, struct.pack("<IIIf", 0, 1, 2, 1.0))
        c.write(BASE + 2 * 4096, b"shared!")
        fd = os.open(tmp_path / "dram.img", os.O_RDONLY)
        try:
            assert os.pread(fd, 7, 2 * 4096) == b"shared!"  # DPA = file offset
        finally:
            os.close(fd)


def test_stats_and_describe_commands(server):
    out = subprocess.run(
        [sys.executable, "-m", "kvcxl.cli.main", "device", "stats", "--socket", str(server)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert '"dram_pages": 16' in out and '"tiering": true' in out
    out = subprocess.run(
        [sys.executable, "-m", "kvcxl.cli.main", "device", "describe"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "M2S_RWD" in out and "4300h  Get Poison List" in out


def test_random_frames_over_the_socket_never_take_the_service_down(tmp_path):
    import random

    from kvcxl.emu.device.fuzz import make_engine

    path = tmp_path / "fuzz.sock"
    rng = random.Random(7)
    kinds = [svc.MEM, svc.CCI, svc.READ, svc.WRITE, svc.HDM, 0, 0x7F, 0x99]
    answered = 0
    with svc.serving(make_engine(), path):
        c = svc.Client(path)
        for _ in range(2000):
            kind, _ = c.call(rng.choice(kinds), rng.randbytes(rng.randrange(100)))
            assert kind in svc.KINDS
            answered += 1
        c.close()
        for bad in (0, svc.MAX_FRAME + 1):  # unframeable lengths: error, then close
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))
            s.sendall(struct.pack("<I", bad))
            assert svc.recv_frame(s)[0] == svc.ERROR
            s.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(path))
        s.sendall(struct.pack("<I", 50) + b"\x01abc")  # half a frame, then hang up
        s.close()
        with svc.Client(path) as c:  # still serving
            assert c.hdm("list")["ok"]
    assert answered == 2000


def test_a_host_walking_the_churned_pages_in_order_meets_nvme_pages() -> None:
    """The churn's moves, one per tick, against a host reading one page per tick in
    order just ahead of where a sweep would be: it meets about half of them on NVMe in
    every pass.  A sweep (demote page t, promote page t - n/2 at tick t) lets such a host
    meet none: a patched QEMU's datapath boot met no NVMe page one time in six."""
    from kvcxl.emu.device.device import Type3Device

    n = 32
    dev = Type3Device(256 << 20, dram_pages=n)
    churn = svc.Churn(svc.Engine(dev), list(range(n)))
    for _ in range(8 * n):  # mixed: every page drawn several times
        churn.tick()
    met = []
    for t in range(100 * n):
        churn.tick()
        met.append(not dev.in_dram[(t + 1) % n])
    per_pass = [sum(met[i : i + n // 2]) for i in range(0, len(met), n // 2)]
    assert min(per_pass) > 0, per_pass
    assert 0.4 < sum(met) / len(met) < 0.6
    assert not dev.inflight and churn.moves == len(met) + 8 * n
