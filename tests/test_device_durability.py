"""Faults survived with nothing lost.

The device service is killed with SIGKILL in the middle of a soak (writes and attention
reports that make the policy migrate pages between DRAM and NVMe) and started again on the
same media files: every write acknowledged before the kill reads back as written (compared
with the client's shadow copy); the one write in flight at the kill was never acknowledged,
so its own bytes may hold old or new data, and every other byte must match.  A disk that
refuses writes gives the protocol's media error, not a crash.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.emu.device import service as svc
from kvcxl.emu.device.cci import Mailbox
from kvcxl.emu.device.device import Type3Device

BASE = 1 << 32
SPAN = 64 * 4096  # 64 pages, 16 of them in DRAM: the policy migrates constantly


def _start(tmp: Path, tiered: bool = True) -> tuple[subprocess.Popen, Path]:
    sock = tmp / "dev.sock"
    sock.unlink(missing_ok=True)  # the killed service's socket is left behind
    cmd = [sys.executable, "-m", "kvcxl.cli.main", "device", "serve", "--socket", str(sock)]
    cmd += ["--capacity", "256MiB", "--decoder", hex(BASE), "--dram-file", str(tmp / "dram.img")]
    if tiered:
        cmd += ["--dram-pages", "16", "--nvme-file", str(tmp / "nvme.img")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    # The socket's file appears at bind, before listen: a connect in between is refused
    # (seen once under load), so wait for one that is accepted.
    while not _accepts(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(proc.stderr.read().decode())
        time.sleep(0.02)
    return proc, sock


def _accepts(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


def _report(c: svc.Client, step: int, pages: np.ndarray) -> None:
    rec = np.zeros(pages.size, mb.ATTENTION_RECORD)
    rec["entry"], rec["weight"] = pages, 1.0
    rsp = c.cci(
        mb.Opcode.VENDOR_ATTENTION_REPORT, struct.pack("<II", step, pages.size) + rec.tobytes()
    )
    assert rsp.rc == mb.ReturnCode.SUCCESS


def _soak_until_killed(sock: Path, proc, shadow: bytearray, rng, step0: int) -> dict:
    """Write and report until the service dies under us (killed from another thread after
    a random delay).  Returns the in-flight write and the last statistics seen."""
    killer = threading.Timer(float(rng.uniform(0.4, 1.2)), os.kill, (proc.pid, signal.SIGKILL))
    stats: dict = {}
    inflight = None
    killer.start()
    try:
        with svc.Client(sock, timeout=10) as c:
            for i in range(1_000_000):
                n = int(rng.integers(1, 4097))
                off = int(rng.integers(0, SPAN - n + 1))
                data = rng.bytes(n)
                inflight = (off, data)
                c.write(BASE + off, data)  # returns: acknowledged
                shadow[off : off + n] = data
                inflight = None
                if i % 4 == 3:
                    inflight = ("report", None)
                    _report(c, step0 + i, rng.integers(0, SPAN // 4096, 8))
                    inflight = None
                if i % 64 == 0:
                    inflight = ("stats", None)
                    stats = json.loads(c.cci(mb.Opcode.VENDOR_GET_STATS).payload)
                    inflight = None
    except (OSError, ValueError):
        pass  # the kill: the connection broke mid-operation
    finally:
        killer.cancel()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return {"inflight": inflight, "stats": stats}


@pytest.mark.parametrize(("seed", "tiered"), [(0, True), (1, True), (2, False)])
def test_sigkill_mid_soak_loses_no_acknowledged_write(tmp_path, seed, tiered) -> None:
    """Tiered: both tiers and the tier map are files.  Untiered: every page stays in the
    DRAM file (no --nvme-file, no --dram-pages)."""
    rng = np.random.default_rng(seed)
    shadow = bytearray(SPAN)
    migrated = 0
    last: dict = {"inflight": None}
    for cycle in range(3):
        proc, sock = _start(tmp_path, tiered)
        if cycle:
            with svc.Client(sock) as c:
                st = json.loads(c.cci(mb.Opcode.VENDOR_GET_STATS).payload)
                restart = st["media"]["restart"]
                assert (restart or {}).get("tier_map") == ("restored" if tiered else None)
                got = b"".join(c.read(BASE + o, 65536)[0] for o in range(0, SPAN, 65536))
            ok = _matches(got, shadow, last["inflight"])
            assert ok, f"cycle {cycle}: bytes lost across the kill"
            if last["inflight"] and isinstance(last["inflight"][0], int):
                off, data = last["inflight"]  # the unacknowledged write: take what is there
                shadow[off : off + len(data)] = got[off : off + len(data)]
        last = _soak_until_killed(sock, proc, shadow, rng, 1000 * cycle)
        migrated += last["stats"].get("counters", {}).get("migrations_to_nvme", 0)
    assert (migrated > 0) == tiered  # pages were on NVMe when the tiered service died


def _matches(got: bytes, shadow: bytearray, inflight) -> bool:
    if got == bytes(shadow):
        return True
    if inflight and isinstance(inflight[0], int):
        off, data = inflight  # never acknowledged: its own bytes may hold either
        rest = bytes(got[:off]) + bytes(got[off + len(data) :])
        return rest == bytes(shadow[:off]) + bytes(shadow[off + len(data) :])
    return False


def test_a_full_disk_is_a_media_error(tmp_path) -> None:
    """/dev/full accepts the open and refuses every write (ENOSPC): the NVMe tier's writes
    come back as the protocol's media error and the device keeps serving."""
    dev = Type3Device(
        256 << 20, dram_pages=4, nvme_file="/dev/full", tier_map_file=tmp_path / "t.tiers"
    )
    dev.hdm.program(0, base=BASE, size=256 << 20)
    dev.hdm.commit(0)
    engine = svc.Engine(dev)
    kind, body = engine.handle(svc.WRITE, struct.pack("<QB7x", BASE + 10 * 4096, 0) + b"x" * 64)
    assert kind == svc.ERROR and body.startswith(b"media_error"), body
    msg = mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR, 3, (BASE + 20 * 4096) >> 6, b"y" * 64)
    kind, body = engine.handle(svc.MEM, mem.encode(msg))
    assert kind == svc.ERROR and body.startswith(b"media_error"), body
    # A promotion copies NVMe → DRAM and then clears the NVMe copy: refused, so the page
    # stays where it was, and the mailbox answers Media Disabled.
    rec = np.zeros(1, mb.ATTENTION_RECORD)
    rec["entry"], rec["weight"] = 10, 1.0
    rsp = Mailbox(dev).execute(
        mb.request(mb.Opcode.VENDOR_ATTENTION_REPORT, struct.pack("<II", 0, 1) + rec.tobytes())
    )
    assert mb.CciMessage.decode(rsp).rc == mb.ReturnCode.MEDIA_DISABLED
    kind, body = engine.handle(svc.READ, struct.pack("<QI", BASE, 64))  # still serving
    assert kind == svc.READ
    assert dev.counters["media_errors"] == 3 and dev.counters["internal_errors"] == 0
    dev.close()


def test_an_unwritable_nvme_file_is_refused_at_start(tmp_path, capsys) -> None:
    from kvcxl.cli.main import main

    rc = main(["device", "serve", "--socket", str(tmp_path / "s"), "--nvme-file", "/sys/x.img"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--nvme-file /sys/x.img" in err[0], err
