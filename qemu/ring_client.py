"""A host-side client of the device ring: the guest agent's protocol in Python.

Used by the tests (the service checked without booting QEMU) and by the benchmark of
the service's own turnaround.  It speaks exactly what ``guest/agent.c`` speaks.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcxl.cxl import mem
from kvcxl.cxl import ring as L
from kvcxl.emu.device.service import Client

from .trace_image import events


class DeviceError(RuntimeError):
    """The firmware stopped answering (no heartbeat) or reported a fault."""


@dataclass
class Completion:
    cid: int
    status: int
    opcode: int
    out_len: int
    r: tuple[int, int, int, int, int]
    out: bytes


class RingClient:
    """``doorbell(tail)`` writes the doorbell; default: a store into the mapped ring (what
    the polling service sees).  :func:`mem_doorbell` makes it the CXL.mem write a patched
    QEMU sends for the guest's store (the doorbell page is trapped)."""

    def __init__(
        self,
        media: str | Path,
        heartbeat_timeout: float = 3.0,
        doorbell: Callable[[int], object] | None = None,
    ) -> None:
        self.doorbell = doorbell
        self.fd = os.open(media, os.O_RDWR)
        self.mm = mmap.mmap(self.fd, os.fstat(self.fd).st_size, mmap.MAP_SHARED)
        self.timeout = heartbeat_timeout
        self.cid = 1
        self.sq_tail, self.cq_head = L.HOST_HDR_FMT.unpack_from(self.mm, L.RING_BASE + L.HOST_HDR)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)

    def wait_ready(self, timeout: float = 10.0) -> None:
        t0 = time.monotonic()
        while True:
            magic, ver, depth, *_rest = L.DEV_HDR_FMT.unpack_from(self.mm, L.RING_BASE)
            status = _rest[2]  # after slot_in, slot_out
            if magic == L.RING_MAGIC and status == L.DEV_READY:
                if ver != L.RING_VERSION or depth != L.DEPTH:
                    raise DeviceError(f"ring version {ver} depth {depth}")
                return
            if time.monotonic() - t0 > timeout:
                raise DeviceError("ring not ready")
            time.sleep(0.001)

    def submit(
        self,
        op: int,
        *,
        step: int = 0,
        layer: int = 0,
        count: int = 0,
        payload: bytes = b"",
        arg0: int = 0,
        arg1: int = 0,
    ) -> int:
        i = self.sq_tail
        if payload:
            o = L.slot_in_offset(i)
            self.mm[o : o + len(payload)] = payload
        sqe = L.SQE_FMT.pack(
            op, 0, self.cid, step, layer & 0xFFFFFFFF, count, len(payload), arg0, arg1
        )
        self.cid += 1
        o = L.sq_offset(i)
        self.mm[o : o + L.ENTRY] = sqe
        self.sq_tail = (i + 1) & 0xFFFFFFFF
        if self.doorbell is not None:
            self.doorbell(self.sq_tail)
        else:
            struct.pack_into("<I", self.mm, L.RING_BASE + L.HOST_HDR, self.sq_tail)
        return i

    def done(self, i: int) -> bool:
        """Completion ``i`` is written (its sequence number, the CQE's last field, is set)."""
        seq = struct.unpack_from("<I", self.mm, L.cq_offset(i) + L.CQE_SEQ_OFFSET)[0]
        return seq == (i + 1) & 0xFFFFFFFF

    def wait(self, i: int, poll: Callable[[], object] | None = None) -> Completion:
        """Wait for completion ``i``; ``poll`` (the service, in-process) is run meanwhile."""
        c = L.cq_offset(i)
        hb = self._heartbeat()
        t_hb = time.monotonic()
        while not self.done(i):
            if poll is not None:
                poll()
                continue
            h = self._heartbeat()
            now = time.monotonic()
            if h != hb:
                hb, t_hb = h, now
            elif now - t_hb > self.timeout:
                raise DeviceError(f"no heartbeat for {now - t_hb:.1f} s (command {i} pending)")
            time.sleep(2e-5)
        cid, status, op, _sqh, out_len, r0, r1, r2, r3, r4, _seq = L.CQE_FMT.unpack_from(self.mm, c)
        o = L.slot_out_offset(i)
        out = bytes(self.mm[o : o + out_len])
        self.cq_head = (i + 1) & 0xFFFFFFFF
        struct.pack_into("<I", self.mm, L.RING_BASE + L.HOST_HDR + 4, self.cq_head)
        return Completion(cid, status, op, out_len, (r0, r1, r2, r3, r4), out)

    def call(self, op: int, poll: Callable[[], object] | None = None, **kw) -> Completion:
        return self.wait(self.submit(op, **kw), poll)

    def _heartbeat(self) -> int:
        return struct.unpack_from("<Q", self.mm, L.RING_BASE + L.DEV_HDR + 24)[0]


def mem_doorbell(device: Client) -> Callable[[int], object]:
    """The doorbell store as the patched QEMU forwards it: a MemWrPtl of the doorbell line
    with the byte enables of ``sq_tail``, sent to the device (decoder 0: HPA = DPA)."""
    line = (L.RING_BASE + L.HOST_HDR) >> 6
    off = (L.RING_BASE + L.HOST_HDR) & 63  # sq_tail is the line's first field

    def ring(tail: int) -> object:
        data = bytearray(64)
        struct.pack_into("<I", data, off, tail)
        return device.mem(
            mem.M2SRwD(
                opcode=mem.M2SRwDOpcode.MEM_WR_PTL, snp_type=mem.SnpType.NO_OP,
                meta_field=mem.MetaField.NO_OP, meta_value=0, tag=tail & 0xFFFF, addr=line,
                poison=0, byte_enable=0xF << off, data=bytes(data),
            )
        )  # fmt: skip

    return ring


def decisions(c: Completion) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(admitted ids, victim records, prefetch hints) of an ATTN or CREATE completion."""
    _r0, na, nv, nh, _r4 = c.r
    adm = np.frombuffer(c.out, "<u4", count=na)
    vic = np.frombuffer(c.out, L.VICTIM_REC, count=nv, offset=4 * na)
    hints = np.frombuffer(c.out, "<u4", count=nh, offset=4 * na + 8 * nv)
    return adm, vic, hints


def replay(
    client: RingClient,
    gt,
    poll: Callable[[], object] | None = None,
    read: Callable[[int], object] | None = None,
) -> dict:
    """Send a guest trace's events through the ring as the agent does; victims in order.
    ``read(entry)``, if given, is called where the agent reads an entry from device
    memory: each miss before its ATTN, each admitted entry (copied in) after."""
    op_of = {L.EV_CREATE: L.OP_CREATE, L.EV_READ: L.OP_ATTN, L.EV_CTX_LEN: L.OP_CTX_LEN}
    opened = client.call(
        L.OP_OPEN,
        poll,
        payload=L.OPEN_FMT.pack(
            gt.n_entries, gt.entry_bytes, gt.capacity, gt.stream.shape.block_tokens, 0
        ),
    )
    if opened.status:
        raise DeviceError(f"OPEN failed with status 0x{opened.status:04x}")
    evs = events(gt)
    victims: list[int] = []
    tiers: list[int] = []  # the tier placement chose for each victim
    resident: set[int] = set()
    hits = mismatches = 0
    for k, (kind, step, layer, rec) in enumerate(evs):
        if read is not None and kind == L.EV_READ:
            for e in rec["entry"].tolist():
                if e not in resident:
                    read(e)
        c = client.call(
            op_of[kind], poll, step=step, layer=layer, count=rec.size, payload=rec.tobytes()
        )
        if c.status:
            raise DeviceError(f"event {k}: status 0x{c.status:04x}")
        if kind == L.EV_READ:
            local = sum(int(e) in resident for e in rec["entry"])
            hits += c.r[0]
            mismatches += local != c.r[0]
        if kind in (L.EV_READ, L.EV_CREATE):
            adm, vic, _h = decisions(c)
            resident.update(int(x) for x in adm)
            if read is not None:
                for e in adm.tolist():
                    read(e)
            for v in vic["entry"]:
                resident.discard(int(v))
                victims.append(int(v))
            tiers.extend(int(t) for t in vic["tier"])
        if k + 1 == len(evs) or evs[k + 1][1] != step:
            e = client.call(L.OP_END_STEP, poll, step=step)
            if e.status:
                raise DeviceError(f"END_STEP {step}: status 0x{e.status:04x}")
    return {
        "victims": victims, "victim_tiers": tiers, "hits": hits,
        "residency_mismatches": mismatches,
    }  # fmt: skip
