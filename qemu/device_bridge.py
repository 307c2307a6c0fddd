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
import struct

import numpy as np

from . import layout as L

DESCRIBE = 0xC005
SET_CONTEXT_LENGTHS = 0xC006
CREATE = 0xC007
ATTENTION = 0xC002
STATISTICS = 0xC003
VICTIMS = 0xC004
VICTIM_REC = np.dtype([("time", "<u4"), ("entry", "<u4"), ("priority", "<f8")])


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

    def create(self, step: int, rec: np.ndarray) -> None:
        n = struct.pack("<I", rec.size)
        self._cci(DESCRIBE, n + rec.astype(L.CREATE_REC).tobytes())
        self._cci(CREATE, struct.pack("<II", step, rec.size) + rec["entry"].astype("<u4").tobytes())

    def ctx_len(self, rec: np.ndarray) -> None:
        out = np.zeros(rec.size, [("ctx", "<u4"), ("tokens", "<u8")])
        out["ctx"], out["tokens"] = rec["ctx"], rec["tokens"]
        self._cci(SET_CONTEXT_LENGTHS, struct.pack("<I", rec.size) + out.tobytes())

    def attn(self, step: int, rec: np.ndarray, hits: int) -> None:
        out = np.zeros(rec.size, [("entry", "<u4"), ("weight", "<f8")])
        out["entry"], out["weight"] = rec["entry"], rec["weight"]
        body = self._cci(ATTENTION, struct.pack("<II", step, rec.size) + out.tobytes())
        (dev_hits,) = struct.unpack_from("<I", body)
        self.hit_mismatches += int(dev_hits != hits)

    def finish(self, victims: list[int]) -> dict:
        """The device's statistics and victims, compared with the service's."""
        out: dict = {"mailbox_calls": self.calls, "errors": self.errors}
        if self.first_error:
            out["first_error"] = self.first_error
            return out
        try:
            stats = json.loads(self._cci(STATISTICS, b"").decode())
            dev_victims: list[int] = []
            while True:
                body = self._cci(VICTIMS, struct.pack("<II", len(dev_victims), 4096))
                (total,) = struct.unpack_from("<I", body)
                rec = np.frombuffer(body, VICTIM_REC, offset=4)
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
