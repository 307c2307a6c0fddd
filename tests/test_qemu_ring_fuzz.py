"""The ring fuzzer (kvcxl.qemu.ring_fuzz): every case a mutated command through the ring's
shared memory, every return code predicted by a model of the ring's rules; wrong return
codes, internal errors and bytes changed outside the command's own slots all count, and
each is seen when planted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcxl.cxl import ring as L
from kvcxl.qemu import ring_fuzz
from kvcxl.qemu import service as ring_service


@pytest.fixture
def media(tmp_path: Path) -> Path:
    p = tmp_path / "media.bin"
    with open(p, "wb") as f:
        f.truncate(256 << 20)  # the boot's default size (the memory-path device's minimum)
    return p


@pytest.mark.parametrize("firmware", ring_fuzz.FIRMWARES)
def test_every_mutated_command_gets_the_modelled_return_code(media, firmware: str) -> None:
    r = ring_fuzz.run(media, 600, seed=1, firmware=firmware)
    assert r["cases"] == 600 and r["unmodified_cases"] == 0 and r["firmware"] == firmware
    assert (r["crashes"], r["wrong_return_codes"], r["changed_bytes"]) == (0, 0, 0), r["examples"]
    assert set(r["mutations"]) == {"op", "count", "in_len", "step", "flip", "field", "arg"}
    for op in ("OPEN", "CREATE", "ATTN", "CTX_LEN", "END_STEP", "POISON"):
        rcs = {k.split(" -> ")[1] for k in r["coverage"] if k.startswith(op + " ")}
        assert {"Success", "Invalid Input"} <= rcs, (op, rcs)
    assert r["coverage"].get("unknown -> Unsupported"), r["coverage"]


def test_the_firmware_follows_the_boot() -> None:
    assert ring_fuzz.firmware_for("kvcxl", True) == "memory-device"
    assert ring_fuzz.firmware_for("stock", True) == "device"
    assert ring_fuzz.firmware_for("stock", False) == "ring-only"
    with pytest.raises(ValueError, match="needs --qemu stock"):
        ring_fuzz.firmware_for("kvcxl", False)


# --- each rule the model gained for the device-backed firmwares, seen when broken ----------
def _wrong(media, firmware: str, cases: int = 600, seed: int = 1) -> int:
    r = ring_fuzz.run(media, cases, seed=seed, firmware=firmware)
    assert r["crashes"] == 0, r["examples"]
    return r["wrong_return_codes"]


def test_weights_above_1_accepted_are_wrong_return_codes(media, monkeypatch) -> None:
    """The ring-only session as it was: weights above 1 accepted (the Attention Report's
    rule, which the device-backed firmwares kept, is the ring's for every firmware)."""
    real = ring_service.FirmwareService.op_attn

    def loose(self, step, layer, count, payload, arg0, arg1):
        if count * L.ATTN_REC.itemsize == len(payload):
            rec = np.frombuffer(payload, L.ATTN_REC, count=count).copy()
            rec["weight"] = np.minimum(rec["weight"], 1.0)  # > 1 read as 1: accepted
            payload = rec.tobytes()
        return real(self, step, layer, count, payload, arg0, arg1)

    monkeypatch.setattr(ring_service.FirmwareService, "op_attn", loose)
    assert _wrong(media, "ring-only") > 0


def test_an_open_of_nothing_accepted_is_a_wrong_return_code(media, monkeypatch) -> None:
    """An OPEN of 0 entries or capacity 0 answered Success (as the ring-only session did)."""
    real = ring_service.FirmwareService.op_open

    def loose(self, step, layer, count, payload, arg0, arg1):
        if len(payload) == L.OPEN_FMT.size:
            n, eb, cap, bt, base = L.OPEN_FMT.unpack(payload)
            payload = L.OPEN_FMT.pack(max(n, 1), eb, max(cap, 1), bt, base)
        return real(self, step, layer, count, payload, arg0, arg1)

    monkeypatch.setattr(ring_service.FirmwareService, "op_open", loose)
    assert _wrong(media, "ring-only") > 0


def test_an_entry_size_the_device_cannot_page_accepted_is_wrong(media, monkeypatch) -> None:
    """The device emulator's own rule: an OPEN's entry_bytes must be a power of two. A
    device that rounds it up instead answers Success where the model requires Invalid
    Input."""
    real = ring_service.FirmwareService._new_device

    def rounding(self, n, eb, cap, bt):
        return real(self, n, 1 << (eb - 1).bit_length(), cap, bt)

    monkeypatch.setattr(ring_service.FirmwareService, "_new_device", rounding)
    assert _wrong(media, "device") > 0


def test_a_refused_command_that_moves_the_step_is_caught(media, monkeypatch) -> None:
    """The service as it was: a command's step taken before the device refused it."""
    real = ring_service.FirmwareService._check_step

    def eager(self, step):
        real(self, step)
        self.step = step

    monkeypatch.setattr(ring_service.FirmwareService, "_check_step", eager)
    assert _wrong(media, "device") > 0


def test_a_refused_open_that_ends_the_session_is_caught(media, monkeypatch) -> None:
    """The service as it was: the open session ended before the next device was built, so
    an OPEN the device refused left no session open."""
    real = ring_service.FirmwareService._new_device

    def late(self, n, eb, cap, bt):
        self._archive()
        return real(self, n, eb, cap, bt)

    monkeypatch.setattr(ring_service.FirmwareService, "_new_device", late)
    # rare: an OPEN while a session is open, mutated into a size the device refuses
    assert _wrong(media, "device", cases=2000, seed=3) > 0


def test_a_doorbell_answered_late_is_a_crash(media, monkeypatch) -> None:
    """The memory-path device must answer before the doorbell's write completes."""
    monkeypatch.setattr(ring_service.FirmwareService, "doorbell", lambda self: None)
    r = ring_fuzz.run(media, 3, seed=1, firmware="memory-device")
    assert r["crashes"] == 3, r


def test_a_missing_bound_is_a_wrong_return_code(media, monkeypatch) -> None:
    """The ring-only session's layer and KV-head bounds removed: ids past them are accepted
    where the model requires Invalid Input.  (Only these two: without the context or block
    bounds a guest id can make the firmware allocate gigabytes, which is why they exist.)"""
    check = ring_service.FirmwareService._check_fields

    def loose(*limits):
        check(*[lim for lim in limits if lim[0] not in ("layer", "kv_head")])

    monkeypatch.setattr(ring_service.FirmwareService, "_check_fields", staticmethod(loose))
    r = ring_fuzz.run(media, 600, seed=1)
    assert r["wrong_return_codes"] > 0


def test_a_stray_write_is_counted(media, monkeypatch) -> None:
    """A NOP that also scribbles on the next slot's input: counted as changed bytes."""

    def nop(self, step, layer, count, payload, arg0, arg1):
        self.mm[L.slot_in_offset(self.sq_head + 1)] ^= 0xFF
        return b"", (0, 0, 0, 0, int(arg0))

    monkeypatch.setattr(ring_service.FirmwareService, "op_nop", nop)
    r = ring_fuzz.run(media, 300, seed=2)
    assert r["changed_bytes"] > 0
