"""Mirror the ring's firmware calls into the device emulator of :mod:`kvcxl.emu.device`.

The firmware service answers the guest itself (its decisions must come back within
the ring's heartbeat budget), and in the same order sends every call to a running
``kvcxl device serve --entries host`` through its mailbox vendor commands (Describe
and Create Entries, Set Context Lengths, Attention Report).  At the end of the
session it reads back the device's statistics and victim log, so the report shows
the emulated device's own decisions and whether they equal the service's.

The device keeps its own DRAM tier (not QEMU's media file): its migrations move
bytes between its tiers, which would otherwise overwrite the guest's memory.
"""

from __future__ import annotations

import json

import numpy as np

from kvcxl.emu.cxl import mailbox as mb
from kvcxl.emu.cxl.mailbox import Opcode

_CMD = mb.COMMANDS


class DeviceBridge:
    def __init__(self, socket_path: str) -> None:
        from kvcxl.emu.device.service import Client

        self.client = Client(socket_path)
        self.errors = 0
        self.first_error: str | None = None
        self.calls = 0
        self.hit_mismatches = 0

    def _cci(self, opcode: int, payload: bytes) -> bytes:
        rsp = self.client.cci(opcode, payload)
        self.calls += 1
        if rsp.rc:
            raise RuntimeError(f"device mailbox 0x{opcode:04X} returned 0x{rsp.rc:04X}")
        return rsp.payload

    def guarded(self, fn, *args) -> object:
        """Run one mirror call; a failure is counted, never passed to the guest."""
        if self.first_error is not None:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            self.errors += 1
            self.first_error = f"{type(exc).__name__}: {exc}"
            return None

    def _send(self, op: Opcode, rec: np.ndarray, *head: int) -> bytes:
        """One vendor command: its fixed fields, the record count, the records.

        The ring's records are the mailbox's (kvcxl.qemu.layout takes them from the
        command table), so they are forwarded as they are."""
        req = _CMD[op].request
        body = np.ascontiguousarray(rec, dtype=req.records).tobytes()
        return self._cci(op, req.fixed.pack(*head, rec.size) + body)

    def create(self, step: int, rec: np.ndarray) -> None:
        self._send(Opcode.VENDOR_DESCRIBE_ENTRIES, rec)
        ids = np.zeros(rec.size, mb.ENTRY_RECORD)
        ids["entry"] = rec["entry"]
        self._send(Opcode.VENDOR_CREATE_ENTRIES, ids, step)

    def ctx_len(self, rec: np.ndarray) -> None:
        self._send(Opcode.VENDOR_SET_CONTEXT_LENGTHS, rec)

    def attn(self, step: int, rec: np.ndarray, hits: int) -> None:
        body = self._send(Opcode.VENDOR_ATTENTION_REPORT, rec, step)
        (dev_hits,) = _CMD[Opcode.VENDOR_ATTENTION_REPORT].response.fixed.unpack_from(body)
        self.hit_mismatches += int(dev_hits != hits)

    def finish(self, victims: list[int]) -> dict:
        """The device's statistics and victims, compared with the service's."""
        out: dict = {"mailbox_calls": self.calls, "errors": self.errors}
        if self.first_error:
            out["first_error"] = self.first_error
            return out
        try:
            stats = json.loads(self._cci(Opcode.VENDOR_GET_STATS, b"").decode())
            dev_victims: list[int] = []
            log = _CMD[Opcode.VENDOR_GET_VICTIMS]
            while True:
                req = log.request.fixed.pack(len(dev_victims), 4096)
                body = self._cci(Opcode.VENDOR_GET_VICTIMS, req)
                (total,) = log.response.fixed.unpack_from(body)
                rec = np.frombuffer(body, log.response.records, offset=log.response.fixed.size)
                dev_victims.extend(int(e) for e in rec["entry"])
                if rec.size == 0 or len(dev_victims) >= total:
                    break
        except Exception as exc:
            out["first_error"] = f"{type(exc).__name__}: {exc}"
            return out
        diff = next(
            (i for i, (a, b) in enumerate(zip(dev_victims, victims, strict=False)) if a != b),
            None if len(dev_victims) == len(victims) else min(len(dev_victims), len(victims)),
        )
        out.update(
            {
                "hit_mismatches": self.hit_mismatches,
                "victims": len(dev_victims),
                "victims_equal_service": dev_victims == victims,
                "first_different_victim": diff,
                "statistics": stats,
            }
        )
        return out

    def close(self) -> None:
        self.client.close()
