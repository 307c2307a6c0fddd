"""The ring fuzzed from inside a guest (kvcxl.qemu.guest_fuzz and the agent's fuzz job).

Fast: the fuzz area the host writes is read back case by case the way the agent reads it
and submitted to each firmware a boot can run behind the ring, in process; every
completion is the model's prediction, and :func:`check` counts each kind of failure when
one is planted.  Slow: boots whose agent sends the cases from inside the guest (Debian's
QEMU with the ring-only service; the patched QEMU with its memory-path device)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cxl import ring as L
from kvcxl.qemu import guest_fuzz
from kvcxl.qemu.boot import guest_result
from kvcxl.qemu.ring_client import RingClient
from kvcxl.qemu.ring_fuzz import FIRMWARES, RingFuzzer
from kvcxl.qemu.service import FirmwareService

SIZE = 256 << 20  # the boot's default (the memory-path device's minimum)


def _as_the_agent(area: bytearray, media: Path, firmware: str = "ring-only") -> None:
    """What the agent's fuzz job does with the area (qemu/guest/agent.c), on a media file
    whose ring ``firmware`` answers in this process; results written back into ``area``."""
    fuzzer = RingFuzzer(media, firmware=firmware)  # its firmware, rung as a boot rings it
    svc, cl = fuzzer.fw, fuzzer.cl
    magic, n, hdr, results = L.FUZZ_HDR_FMT.unpack_from(area)
    assert magic == L.FUZZ_MAGIC
    cases = np.frombuffer(area, L.FUZZ_CASE, count=n, offset=hdr)
    for k, c in enumerate(cases):
        i = cl.sq_tail
        body = bytes(area[c["offset"] : c["offset"] + c["length"]])
        o = L.slot_in_offset(i)
        cl.mm[o : o + len(body)] = body
        sqe = L.SQE_FMT.pack(int(c["op"]), 0, cl.cid, int(c["step"]), 0, int(c["count"]),
                             int(c["in_len"]), int(c["arg0"]), int(c["arg1"]))  # fmt: skip
        cl.mm[L.sq_offset(i) : L.sq_offset(i) + L.ENTRY] = sqe
        cl.cid += 1
        cl.sq_tail = (i + 1) & 0xFFFFFFFF
        if cl.doorbell is not None:  # the memory-path device answers on the doorbell
            cl.doorbell(cl.sq_tail)
            done = cl.wait(i)
        else:
            struct.pack_into("<I", cl.mm, L.RING_BASE + L.HOST_HDR, cl.sq_tail)
            done = cl.wait(i, svc.poll_once)
        rec = np.array([(done.status, 1, done.out_len, 0, 0)], L.FUZZ_RESULT).tobytes()
        off = results + k * L.FUZZ_RESULT.itemsize
        area[off : off + len(rec)] = rec
    fuzzer.close()


def _results(area: bytearray, expect: dict) -> bytes:
    dpa, n = guest_fuzz.results_span(expect)
    return bytes(area[dpa - L.FUZZ_BASE : dpa - L.FUZZ_BASE + n])


def _media(tmp_path: Path) -> Path:
    p = tmp_path / "media.bin"
    with open(p, "wb") as f:
        f.truncate(SIZE)
    return p


@pytest.mark.parametrize("firmware", FIRMWARES)
def test_the_fuzz_area_carries_mutated_cases_the_model_predicts(
    tmp_path: Path, firmware: str
) -> None:
    img, expect = guest_fuzz.image(400, 3, SIZE, firmware)
    assert len(img) <= L.FUZZ_SIZE and len(expect["want"]) == 400
    area = bytearray(img)
    _as_the_agent(area, _media(tmp_path), firmware)
    r = guest_fuzz.check(_results(area, expect), expect)
    assert r["firmware"] == firmware
    assert r["completed"] == 400 and r["unmodified_cases"] == 0
    assert (r["crashes"], r["wrong_return_codes"], r["changed_bytes"]) == (0, 0, 0), r
    assert len(r["coverage"]) >= 15 and set(r["mutations"]) >= {"op", "count", "flip", "field"}


def test_check_counts_each_failure() -> None:
    img, expect = guest_fuzz.image(50, 0, SIZE)
    area = bytearray(img)
    res = np.frombuffer(area, L.FUZZ_RESULT, count=50, offset=expect["results"])
    res["done"][:48] = 1  # the last two never completed: crashes
    res["status"][:48] = expect["want"][:48]
    res["status"][3] = L.RC_INTERNAL  # a crash
    wrong = next(k for k in range(4, 48) if expect["want"][k] != L.RC_SUCCESS)
    res["status"][wrong] = L.RC_SUCCESS  # a wrong return code
    res["stray"][7] = 5  # bytes changed outside the command's own
    r = guest_fuzz.check(_results(area, expect), expect)
    assert (r["crashes"], r["wrong_return_codes"], r["changed_bytes"]) == (3, 1, 5), r
    assert r["completed"] == 48


def test_the_area_has_room_for_its_limit_and_refuses_more() -> None:
    img, _ = guest_fuzz.image(guest_fuzz.CASES_MAX, 1, SIZE)
    assert len(img) <= L.FUZZ_SIZE
    with pytest.raises(ValueError, match="fuzz cases"):
        guest_fuzz.image(guest_fuzz.CASES_MAX + 1, 1, SIZE)


@pytest.mark.slow
@pytest.mark.qemu
def test_the_guest_agent_fuzzes_the_ring_from_inside_the_guest() -> None:
    from kvcxl.cli.qemu import boot_ok
    from kvcxl.qemu.boot import BootOptions, boot

    opts = BootOptions(jobs=("fuzz",), fuzz_cases=300, device_emulator=False, qemu="stock")
    report, _ = boot(opts)
    assert boot_ok(report), report.get("console_tail")
    r = report["guest_fuzz"]
    assert r["completed"] == 300, r
    assert (r["crashes"], r["wrong_return_codes"], r["changed_bytes"]) == (0, 0, 0), r
    assert len(r["coverage"]) >= 15, r["coverage"]
    assert guest_result(report, "fuzz")["cases"] == 300


@pytest.mark.slow
@pytest.mark.qemu
def test_the_guest_agent_fuzzes_the_one_devices_ring() -> None:
    """The boot users run by default: the patched QEMU, whose memory-path device answers
    the ring on its doorbell; the model predicts that device's answers."""
    from kvcxl.cli.qemu import boot_ok
    from kvcxl.qemu.boot import BootOptions, boot

    report, _ = boot(BootOptions(jobs=("fuzz",), fuzz_cases=300, qemu="kvcxl"))
    assert boot_ok(report), report.get("console_tail")
    r = report["guest_fuzz"]
    assert r["firmware"] == "memory-device" and r["completed"] == 300, r
    assert (r["crashes"], r["wrong_return_codes"], r["changed_bytes"]) == (0, 0, 0), r
    assert len(r["coverage"]) >= 15, r["coverage"]
    assert report["firmware"]["firmware"] == "memory-path device"
    assert report["firmware"]["doorbells"] >= 300


@pytest.mark.parametrize("base", [L.WINDOW_BASE, (1 << 63) + 0x1000, (1 << 64) - 2 * SIZE])
def test_an_open_with_any_window_base_leaves_the_plugin_stream_readable(
    tmp_path: Path, base: int
) -> None:
    """Found by the guest fuzzer: an OPEN whose window base had its top bit flipped made the
    service's reading of the TCG plugin's access stream overflow, and the service died."""
    media, ring = _media(tmp_path), tmp_path / "plugin-ring.bin"
    cap = 8
    recs = np.zeros(cap, L.ACC_REC)
    recs["gpa"] = [base + L.KV_BASE, base, 0, (1 << 64) - 1, base + SIZE, 5, 6, 7]
    hdr = L.ACC_HDR_FMT.pack(L.ACC_MAGIC, cap, cap, 0, 0, 0, 2)
    ring.write_bytes(hdr + recs.tobytes())
    svc = FirmwareService(media, plugin_ring=ring)
    cl = RingClient(media)
    cl.wait_ready(timeout=5)
    open_ = L.OPEN_FMT.pack(8, 64, 2, 16, base)
    assert cl.call(L.OP_OPEN, svc.poll_once, payload=open_).status == L.RC_SUCCESS
    svc.drain_plugin()
    assert svc.plugin_records == cap
    assert svc.plugin_reads == 2 and svc.plugin_outside == cap - 2  # base and base + KV_BASE
    cl.close()
