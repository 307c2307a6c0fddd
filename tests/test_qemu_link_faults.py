"""A broken device end of the patched QEMU's link: after the guest has started, a proxy
between QEMU and the kvcxl device answers one CXL.mem request wrongly — a frame of
impossible length, a frame cut short, no answer within QEMU's timeout, or a refusal
(an ERROR frame).  The first three mark the link down at once (the guest's accesses to
trapped pages then fail, it reports them and QEMU exits by itself); a refusal fails that
one access and the link stays up.  Compared against: the console line the patch prints
for each case and the guest's own read-back of the trapped buffer.

These boots send CXL.mem requests over the socket (``mem_link="socket"``), where the
proxy sits.  The shared-memory request ring (the default) has its own: the device
stopped (SIGSTOP) past QEMU's timeout, the ring's fault word set, and a record made bad
while the device is stopped (a refusal)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from kvcxl.cxl import ring as L
from kvcxl.emu.device import service as svc
from kvcxl.qemu.boot import guest_result

TRAP = ((L.XFER_H2G, L.XFER_BYTES), (L.XFER_G2H, L.XFER_BYTES))


def _went_down_once_and_nothing_hung(r: dict, b) -> None:
    """The link went down once (one line from QEMU), and the guest still finished its
    read of the whole trapped buffer and powered off before the host's timeout or stall
    watchdog: had QEMU waited its 5 s for each of the buffer's 8,192 later accesses, the
    job would have outlived any timeout."""
    downs = [line for line in b.console if "kvcxl: device link" in line]
    assert len(downs) == 1, downs
    assert guest_result(r, "datapath")["host_to_guest_bad"] > 0
    names = {e["event"] for e in r["events"]}
    assert "poweroff" in names and not names & {"host_timeout", "host_stall"}, names
    assert r["qemu"]["exit_code"] == 0 and b.qemu.poll() is not None


class FaultyLink:
    """Frames pass through both ways until ``armed``; then the next CXL.mem answer is
    replaced by ``fault`` (once), and after a fatal one nothing more is forwarded."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.armed = threading.Event()
        self.faulted_at: float | None = None  # monotonic
        self._keep: list[socket.socket] = []

    def __call__(self, device: Path, path: Path) -> FaultyLink:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        srv.listen(4)
        self._keep.append(srv)
        threading.Thread(target=self._accept, args=(srv, device), daemon=True).start()
        return self

    def _accept(self, srv: socket.socket, device: Path) -> None:
        while True:
            try:
                q, _ = srv.accept()
            except OSError:
                return
            d = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            d.connect(str(device))
            self._keep += [q, d]
            threading.Thread(target=self._pump, args=(q, d), daemon=True).start()

    def _pump(self, q: socket.socket, d: socket.socket) -> None:
        try:
            while (frame := svc.recv_frame(q)) is not None:
                svc.send_frame(d, *frame)
                answer = svc.recv_frame(d)
                if frame[0] == svc.MEM and self.armed.is_set() and self.faulted_at is None:
                    self.faulted_at = time.monotonic()
                    if not self._misbehave(q, *answer):
                        return  # the stream is lost: nothing more goes through
                    continue
                svc.send_frame(q, *answer)
        except OSError:
            return

    def _misbehave(self, q: socket.socket, kind: int, body: bytes) -> bool:
        """Send the fault instead of the answer (``kind``, ``body``); True when the link
        may go on."""
        if self.fault == "oversized":
            q.sendall(struct.pack("<IB", 0xFFFFFFF0, svc.MEM))  # and never the rest
        elif self.fault == "truncated":
            head = struct.pack("<IB", len(body) + 1, kind)  # the whole answer's length,
            q.sendall(head + body[: len(body) // 2])  # half its body, then gone
            q.close()
        elif self.fault == "late":
            time.sleep(7.0)  # past QEMU's 5 s
        elif self.fault == "refusal":
            msg = b"refused by the link test"
            q.sendall(struct.pack("<IB", len(msg) + 1, svc.ERROR) + msg)
            return True
        return False


# The guest says "waiting", sleeps this long, then reads the trapped buffer; the link arms
# when the host has read the word off the console, which a loaded machine can delay by
# seconds (a fresh-clone run beside another job armed too late at 2 s: no request faulted).
WAIT_S = 6


def _no_request(b) -> str:
    """Why a boot that should have faulted the link did not: the guest's last words."""
    return "the guest made no CXL.mem request after waiting; console: " + "\n".join(b.console[-15:])


def _boot(fault: str, alias: bool):
    from kvcxl.qemu.boot import BootOptions, boot

    link = FaultyLink(fault)

    def hook(ev: dict, b) -> None:
        if ev.get("event") == "waiting":
            link.armed.set()

    opts = BootOptions(
        qemu="kvcxl", jobs=("wait", "datapath"), wait_s=WAIT_S, plugin=False, trap=TRAP,
        on_event=hook, link=link, alias=alias, mem_link="socket", timeout=900,
    )  # fmt: skip
    r, b = boot(opts)
    return r, b, link


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("oversized", "sent a frame of impossible length"),
        ("truncated", "short response"),
        ("late", "no response"),
    ],
)
@pytest.mark.parametrize("alias", [False, True], ids=["mmio", "alias"])
def test_a_broken_device_end_takes_the_link_down_and_nothing_hangs(
    patched_host, fault, says, alias
) -> None:
    r, b, link = _boot(fault, alias)
    assert link.faulted_at is not None, _no_request(b)
    assert any(f"kvcxl: device link {says}" in line for line in b.console), b.console[-20:]
    # the guest's read of the trapped buffer failed, it said so and powered off; QEMU
    # exited by itself: the link went down on the bad frame itself (or at the 5 s timeout
    # when nothing came), not after a 5 s wait for every later access
    _went_down_once_and_nothing_hung(r, b)


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize("alias", [False, True], ids=["mmio", "alias"])
def test_a_refusal_fails_one_access_and_the_link_stays_up(patched_host, alias) -> None:
    r, b, link = _boot("refusal", alias)
    assert link.faulted_at is not None
    assert any("kvcxl: device refused" in line for line in b.console)
    assert not any("kvcxl: device link" in line for line in b.console)
    dp = guest_result(r, "datapath")
    # one access of at most 8 bytes failed; every other byte came through the device
    assert 0 < dp["host_to_guest_bad"] <= 8
    assert r["host_check"]["guest_to_host_bad_bytes"] == 0
    assert r["qemu"]["exit_code"] == 0


class RingFault:
    """Once the guest waits: stop the device (SIGSTOP), wait for QEMU's next request on the
    ring, then break it — ``late``: stay stopped 7 s (past QEMU's 5 s); ``fault``: set the
    ring's fault word; ``refusal``: make the pending record's opcode unknown — and let the
    device go on (SIGCONT)."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.faulted_at: float | None = None
        self.error: str | None = None

    def __call__(self, ev: dict, b) -> None:
        if ev.get("event") == "waiting" and self.faulted_at is None:
            threading.Thread(target=self._run, args=(b,), daemon=True).start()

    def _run(self, b) -> None:
        import mmap
        import os
        import signal

        pid = b.device.pid
        with open(b.mem_ring, "r+b") as f:
            mm = mmap.mmap(f.fileno(), L.MR_BYTES)
            word = lambda name: struct.unpack_from("<I", mm, L.MR_HDR[name])[0]  # noqa: E731
            os.kill(pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                while word("req_tail") == word("req_head"):  # QEMU's next request
                    if time.monotonic() - t0 > 60:
                        self.error = "no request on the ring after the guest waited"
                        return
                    time.sleep(0.001)
                self.faulted_at = time.monotonic()
                if self.fault == "late":
                    time.sleep(7.0)
                elif self.fault == "fault":
                    struct.pack_into("<I", mm, L.MR_HDR["fault"], L.MR_FAULT_BAD_INDEX)
                elif self.fault == "refusal":
                    i = word("req_head")
                    at = L.MR_RECORDS + (i % L.MR_DEPTH) * L.MR_REC_BYTES
                    struct.pack_into("<H", mm, at + L.MR_REC["op"], 0xFFFF)
            finally:
                os.kill(pid, signal.SIGCONT)
                mm.close()


def _ring_boot(fault: str):
    from kvcxl.qemu.boot import BootOptions, boot

    rf = RingFault(fault)
    opts = BootOptions(
        qemu="kvcxl", jobs=("wait", "datapath"), wait_s=WAIT_S, plugin=False, trap=TRAP,
        on_event=rf, mem_link="ring", timeout=900,
    )  # fmt: skip
    r, b = boot(opts)
    assert rf.error is None, rf.error
    assert rf.faulted_at is not None, _no_request(b)
    return r, b, rf


@pytest.mark.slow
@pytest.mark.qemu
@pytest.mark.parametrize(
    ("fault", "says"),
    [("late", "no response on its request ring"), ("fault", "faulted its request ring")],
)
def test_a_broken_request_ring_takes_the_link_down_and_nothing_hangs(
    patched_host, fault, says
) -> None:
    r, b, _rf = _ring_boot(fault)
    assert any(f"kvcxl: device link {says}" in line for line in b.console), b.console[-20:]
    _went_down_once_and_nothing_hung(r, b)


@pytest.mark.slow
@pytest.mark.qemu
def test_a_refused_ring_record_fails_one_access_and_the_link_stays_up(patched_host) -> None:
    r, b, _rf = _ring_boot("refusal")
    assert any("kvcxl: device refused a request on its ring" in line for line in b.console)
    assert not any("kvcxl: device link" in line for line in b.console)
    dp = guest_result(r, "datapath")
    assert 0 < dp["host_to_guest_bad"] <= 8
    assert r["host_check"]["guest_to_host_bad_bytes"] == 0
    assert r["qemu"]["exit_code"] == 0
    ring = r["firmware"]["mem_link"]["ring"]
    assert ring["statuses"]["refused"] == 1 and "unknown opcode" in ring["refusals"][0]
