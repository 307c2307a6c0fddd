"""The device ring and the firmware service, without QEMU: a Python client speaks the
guest agent's protocol to the service over a media file."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kvcxl.cxl import ring as L
from kvcxl.cxl.guest_header import record_struct
from kvcxl.qemu.ring_client import DeviceError, RingClient, decisions, replay
from kvcxl.qemu.service import FirmwareService
from kvcxl.qemu.trace_image import default_trace, encode, simulate_victims

GUEST = Path(__file__).resolve().parent.parent / "qemu" / "guest"


@pytest.fixture
def media(tmp_path: Path) -> Path:
    p = tmp_path / "media.bin"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
    return p


@pytest.fixture
def dev(media: Path):
    svc = FirmwareService(media)
    cl = RingClient(media, heartbeat_timeout=0.3)
    cl.wait_ready(timeout=1)
    yield svc, cl
    cl.close()


@pytest.mark.parametrize(
    "policy", ["ema", "lru", "fifo", "lfu", "lrfu", "h2o", "sink-window", "random"]
)
def test_replay_through_ring_equals_simulator(media: Path, policy: str) -> None:
    svc = FirmwareService(media, policy=policy)
    cl = RingClient(media)
    cl.wait_ready(timeout=1)
    gt = default_trace(steps=12)
    got = replay(cl, gt, poll=svc.poll_once)
    want = simulate_victims(gt, policy)
    assert len(want) > 100
    assert got["victims"] == want
    assert got["residency_mismatches"] == 0
    sess = svc.stats()["sessions"][0]
    assert sess["audit"]["wrong_victims"] == 0
    assert sess["audit"]["audited_victims"] == len(want)


def _open(cl: RingClient, svc: FirmwareService, n: int = 8, cap: int = 2) -> None:
    c = cl.call(L.OP_OPEN, svc.poll_once, payload=L.OPEN_FMT.pack(n, 64, cap, 16, 0))
    assert c.status == L.RC_SUCCESS


def _create(cl: RingClient, svc: FirmwareService, ids: list[int]) -> None:
    rec = np.zeros(len(ids), L.CREATE_REC)
    rec["entry"] = ids
    rec["block"] = 100  # far from the anchor zone: nothing pinned
    c = cl.call(L.OP_CREATE, svc.poll_once, count=len(ids), payload=rec.tobytes())
    assert c.status == L.RC_SUCCESS


def _attn(cl, svc, ids, weights, step=0):
    rec = np.zeros(len(ids), L.ATTN_REC)
    rec["entry"], rec["weight"] = ids, weights
    return cl.call(L.OP_ATTN, svc.poll_once, step=step, count=len(ids), payload=rec.tobytes())


@pytest.mark.parametrize(
    ("what", "code"),
    [
        ("unknown opcode", L.RC_UNSUPPORTED),
        ("before open", L.RC_INVALID_INPUT),
        ("count vs length", L.RC_INVALID_PAYLOAD_LENGTH),
        ("too long", L.RC_INVALID_PAYLOAD_LENGTH),
        ("unknown entry", L.RC_INVALID_INPUT),
        ("nan weight", L.RC_INVALID_INPUT),
        ("negative weight", L.RC_INVALID_INPUT),
        ("weight above 1", L.RC_INVALID_INPUT),
        ("step backwards", L.RC_INVALID_INPUT),
        ("create not dense", L.RC_INVALID_INPUT),
        ("open too big", L.RC_INVALID_INPUT),
        ("open no entries", L.RC_INVALID_INPUT),
        ("open no capacity", L.RC_INVALID_INPUT),
        ("end_step wrong", L.RC_INVALID_INPUT),
        ("poison unaligned", L.RC_INVALID_INPUT),
    ],
)
def test_malformed_commands_get_error_completions(dev, what: str, code: int) -> None:
    svc, cl = dev
    if what == "unknown opcode":
        c = cl.call(0x1234, svc.poll_once)
    elif what == "before open":
        c = _attn(cl, svc, [0], [0.5])
    elif what == "open too big":
        c = cl.call(L.OP_OPEN, svc.poll_once, payload=L.OPEN_FMT.pack(1 << 30, 64, 2, 16, 0))
    elif what == "open no entries":
        c = cl.call(L.OP_OPEN, svc.poll_once, payload=L.OPEN_FMT.pack(0, 64, 2, 16, 0))
    elif what == "open no capacity":
        c = cl.call(L.OP_OPEN, svc.poll_once, payload=L.OPEN_FMT.pack(8, 64, 0, 16, 0))
    elif what == "poison unaligned":
        c = cl.call(L.OP_POISON, svc.poll_once, arg0=L.KV_BASE + 3, arg1=64)
    else:
        _open(cl, svc)
        _create(cl, svc, [0, 1, 2])
        assert _attn(cl, svc, [0, 1], [0.5, 0.1], step=3).status == L.RC_SUCCESS
        if what == "count vs length":
            c = cl.call(L.OP_ATTN, svc.poll_once, step=3, count=5, payload=bytes(16))
        elif what == "too long":
            c = cl.call(L.OP_ATTN, svc.poll_once, step=3, count=2000, payload=bytes(16000))
        elif what == "unknown entry":
            c = _attn(cl, svc, [0, 7], [0.5, 0.5], step=3)
        elif what == "nan weight":
            c = _attn(cl, svc, [0], [float("nan")], step=3)
        elif what == "negative weight":
            c = _attn(cl, svc, [0], [-0.5], step=3)
        elif what == "weight above 1":  # the Attention Report's rule, whichever firmware
            c = _attn(cl, svc, [0], [1.5], step=3)
        elif what == "step backwards":
            c = _attn(cl, svc, [0], [0.5], step=2)
        elif what == "create not dense":
            rec = np.zeros(1, L.CREATE_REC)
            rec["entry"] = 5
            c = cl.call(L.OP_CREATE, svc.poll_once, step=3, count=1, payload=rec.tobytes())
        elif what == "end_step wrong":
            c = cl.call(L.OP_END_STEP, svc.poll_once, step=4)
    assert c.status == code, svc.error_log
    # The ring keeps working after an error.
    assert cl.call(L.OP_NOP, svc.poll_once, arg0=7).status == L.RC_SUCCESS
    assert svc.errors == 1


def test_decisions_and_residency(dev) -> None:
    svc, cl = dev
    _open(cl, svc, n=8, cap=2)
    _create(cl, svc, [0, 1, 2])
    c = _attn(cl, svc, [0, 1, 2], [0.9, 0.0, 0.0], step=1)
    adm, vic, _hints = decisions(c)
    # capacity 2 after creating 3: one victim at creation, then the miss is re-admitted
    resident = svc.cache.is_resident(np.arange(3))
    assert int(resident.sum()) == 2
    assert set(vic["entry"].tolist()) <= {0, 1, 2}
    assert c.r[0] + len(adm) == 3  # every read is a hit or admitted


def test_heartbeat_stops_and_client_reports_device_error(media: Path) -> None:
    svc = FirmwareService(media)
    cl = RingClient(media, heartbeat_timeout=0.2)
    cl.wait_ready(timeout=1)
    cl.submit(L.OP_NOP)  # nobody polls: the service is "dead"
    with pytest.raises(DeviceError, match="no heartbeat"):
        cl.wait(0)
    assert svc.sq_head == 0


def test_trace_image_layout() -> None:
    gt = default_trace(steps=4)
    img = encode(gt, 256 << 20)
    hdr = L.TRACE_HDR_FMT.unpack_from(img)
    assert hdr[0] == L.TRACE_MAGIC and hdr[3] == gt.n_entries and hdr[5] == gt.entry_bytes
    with pytest.raises(ValueError, match="MiB device"):
        encode(gt, 17 << 20)
    # a weight the ring would refuse mid-boot is refused when the trace is encoded
    reads = np.flatnonzero(gt.stream.ev_kind == 1)
    gt.stream.w[int(gt.stream.ev_off[reads[2]])] = 1.5
    with pytest.raises(ValueError, match=r"weight of 1\.5"):
        encode(gt, 256 << 20)


def test_the_guest_header_is_the_generators_output() -> None:
    """qemu/guest/kvcxl_ring.h is render_guest_header()'s output, byte for byte (the tests
    below compile it and compare its numbers with the tables)."""
    from kvcxl.cxl.guest_header import WRITE_COMMAND, render_guest_header

    got, want = (GUEST / "kvcxl_ring.h").read_text(), render_guest_header()
    pairs = enumerate(zip(got.split("\n"), want.split("\n"), strict=False))
    first = next(
        (f"line {i + 1} is {g!r}, the tables give {w!r}" for i, (g, w) in pairs if g != w),
        "its length",
    )
    assert got == want, f"qemu/guest/kvcxl_ring.h differs ({first}); rewrite it: {WRITE_COMMAND}"


_C_PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include "kvcxl_pattern.h"
int main(void) {
    printf("%llu %llu %llu %llu %llu\n", KVCXL_TRACE_BASE, KVCXL_XFER_H2G, KVCXL_XFER_G2H,
           KVCXL_XFER_BYTES, KVCXL_KV_BASE);
    printf("%u %u %u %u %u %u %u\n", KVCXL_SQ, KVCXL_CQ, KVCXL_SLOTS, KVCXL_DEPTH,
           KVCXL_SLOT_IN, KVCXL_SLOT_OUT, KVCXL_RING_MAGIC);
    printf("%zu %zu %zu %zu %zu\n", offsetof(struct kvcxl_cqe, seq),
           offsetof(struct kvcxl_sqe, arg0), offsetof(struct kvcxl_dev_hdr, heartbeat),
           offsetof(struct kvcxl_acc_hdr, armed), offsetof(struct kvcxl_dev_hdr, tracing));
    printf("%u %u %u %u\n", KVCXL_RC_INVALID_INPUT, KVCXL_RC_UNSUPPORTED, KVCXL_RC_INTERNAL,
           KVCXL_RC_INVALID_PAYLOAD_LENGTH);
    for (int k = 0; k < 4; k++) printf("%016llx ", (unsigned long long)kvcxl_pattern(7, 99, k));
    printf("\n");
    printf("%llu %llu %u %llu %llu %llu\n", KVCXL_FUZZ_BASE, KVCXL_FUZZ_SIZE, KVCXL_FUZZ_MAGIC,
           KVCXL_WIDTHS_BASE, KVCXL_WIDTHS_BYTES, KVCXL_BENCH_BYTES);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_header_matches_python_layout(tmp_path: Path) -> None:
    src = tmp_path / "probe.c"
    src.write_text(_C_PROBE)
    exe = tmp_path / "probe"
    subprocess.run(["gcc", "-I", str(GUEST), "-o", str(exe), str(src)], check=True)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split(
        "\n"
    )
    assert [int(x) for x in lines[0].split()] == [
        L.TRACE_BASE,
        L.XFER_H2G,
        L.XFER_G2H,
        L.XFER_BYTES,
        L.KV_BASE,
    ]
    assert [int(x) for x in lines[1].split()] == [
        L.SQ,
        L.CQ,
        L.SLOTS,
        L.DEPTH,
        L.SLOT_IN,
        L.SLOT_OUT,
        L.RING_MAGIC,
    ]
    assert [int(x) for x in lines[2].split()] == [
        L.CQE_SEQ_OFFSET,
        24,
        24,
        L.ACC_ARMED_OFFSET,
        L.DEV_TRACING_OFFSET,
    ]
    assert [int(x) for x in lines[3].split()] == [
        L.RC_INVALID_INPUT,
        L.RC_UNSUPPORTED,
        L.RC_INTERNAL,
        L.RC_INVALID_PAYLOAD_LENGTH,
    ]
    words = [int(x, 16) for x in lines[4].split()]
    assert words == list(struct.unpack("<4Q", L.pattern(7, 99, 32)))
    assert [int(x) for x in lines[5].split()] == [
        L.FUZZ_BASE,
        L.FUZZ_SIZE,
        L.FUZZ_MAGIC,
        L.WIDTHS_BASE,
        L.WIDTHS_BYTES,
        L.BENCH_BYTES,
    ]


# Each record struct of the header and the Python dtype it must equal: every ring command's
# input records, then the others.
_C_RECORDS = {
    **{record_struct(c): c.records for c in L.RING_COMMANDS if c.records is not None},
    "kvcxl_victim": L.VICTIM_REC,
    "kvcxl_trace_batch": L.TRACE_BATCH,
    "kvcxl_acc_rec": L.ACC_REC,
    "kvcxl_fuzz_case": L.FUZZ_CASE,
    "kvcxl_fuzz_result": L.FUZZ_RESULT,
}


# Each header struct of the header, the struct format it must equal and its field names.
_C_FORMATS = {
    "kvcxl_dev_hdr": (L.DEV_HDR_FMT, L.DEV_HDR_FIELDS),
    "kvcxl_host_hdr": (L.HOST_HDR_FMT, L.HOST_HDR_FIELDS),
    "kvcxl_sqe": (L.SQE_FMT, L.SQE_FIELDS),
    "kvcxl_cqe": (L.CQE_FMT, L.CQE_FIELDS),
    "kvcxl_open": (L.OPEN_FMT, L.OPEN_FIELDS),
    "kvcxl_trace_hdr": (L.TRACE_HDR_FMT, L.TRACE_HDR_FIELDS),
    "kvcxl_fuzz_hdr": (L.FUZZ_HDR_FMT, L.FUZZ_HDR_FIELDS),
    "kvcxl_acc_hdr": (L.ACC_HDR_FMT, L.ACC_HDR_FIELDS),
}


def _format_layout(fmt: struct.Struct, names: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(name, offset, bytes) of a little-endian struct format's named items, by struct."""
    out, done, it = [], "<", iter(names)
    for count, code in re.findall(r"(\d*)(\w)", fmt.format[1:]):
        if code != "x":
            out.append((next(it), struct.calcsize(done), struct.calcsize("<" + code)))
        done += count + code
    assert next(it, None) is None and struct.calcsize(done) == fmt.size
    return out


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_header_matches_the_command_tables(tmp_path: Path) -> None:
    """kvcxl_ring.h's opcodes and record and header layouts are the ring table's (and so the
    mailbox's): every field's offset and size, every struct's size."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "kvcxl_ring.h"']
    lines.append("int main(void) {")
    for c in L.RING_COMMANDS:
        lines.append(f'    printf("op {c.name} %u\\n", (unsigned)KVCXL_OP_{c.name});')
    layouts = {
        st: [(f, dt.fields[f][1], dt[f].itemsize) for f in dt.names]
        for st, dt in _C_RECORDS.items()
    }
    sizes = {st: dt.itemsize for st, dt in _C_RECORDS.items()}
    for st, (fmt, names) in _C_FORMATS.items():
        layouts[st], sizes[st] = _format_layout(fmt, names), fmt.size
    for st, fields in layouts.items():
        lines.append(f'    printf("size {st} %zu\\n", sizeof(struct {st}));')
        for f, _, _ in fields:
            lines.append(
                f'    printf("field {st} {f} %zu %zu\\n", offsetof(struct {st}, {f}),'
                f" sizeof(((struct {st} *)0)->{f}));"
            )
    lines += ["    return 0;", "}"]
    src = tmp_path / "table_probe.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "table_probe"
    subprocess.run(["gcc", "-I", str(GUEST), "-o", str(exe), str(src)], check=True)
    got = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    want = [f"op {c.name} {c.opcode}" for c in L.RING_COMMANDS]
    for st, fields in layouts.items():
        want.append(f"size {st} {sizes[st]}")
        want += [f"field {st} {f} {off} {n}" for f, off, n in fields]
    assert got.split("\n")[:-1] == want


def test_ring_reuses_mailbox_opcodes_only_with_their_meaning() -> None:
    from kvcxl.cxl import mailbox as mb

    for c in L.RING_COMMANDS:
        if c.mailbox is None:  # ring-only: a command set the mailbox does not use
            assert c.opcode >> 8 == L.RING_SET
            assert all(op >> 8 != L.RING_SET for op in mb.COMMANDS)
        else:
            assert c.opcode == c.mailbox.opcode and c.records == c.mailbox.request.records
    assert len(L.OPCODES) == len(L.RING_COMMANDS)


@pytest.mark.parametrize("policy", ["ema", "lru", "h2o", "sink-window"])
def test_device_emulator_is_the_firmware(media: Path, policy: str) -> None:
    """With ``device=True`` the ring is answered by the device emulator's firmware: its
    victims (from the device's own log) are the simulator's, and the service holds no
    firmware session of its own."""
    from kvcxl.emu.device.device import Type3Device

    svc = FirmwareService(media, policy=policy, device=True)
    cl = RingClient(media)
    cl.wait_ready(timeout=1)
    gt = default_trace(steps=12)
    got = replay(cl, gt, poll=svc.poll_once)
    assert isinstance(svc.device, Type3Device) and svc.fw is svc.device.fw
    want = simulate_victims(gt, policy)
    assert len(want) > 100
    assert got["victims"] == want  # what the guest was answered
    assert [v for _, v, _ in svc.device.victims] == want  # what the device decided
    assert got["residency_mismatches"] == 0
    assert cl.call(L.OP_CLOSE, svc.poll_once).status == L.RC_SUCCESS
    assert svc.device is None
    st = svc.stats()
    assert st["firmware"] == "device emulator" and st["device_errors"] == 0 == st["errors"]
    sess = st["sessions"][0]
    assert sess["victims"] == want and sess["audit"]["wrong_victims"] == 0
    dev = sess["device"]
    assert dev["cache"]["hits"] + dev["cache"]["misses"] == gt.stream.n_reads
    assert dev["cache"]["evictions"] == len(want) == sess["victims_total"]
    # the device moved its own pages per decision (it keeps its own media, not QEMU's)
    assert dev["tiering"] and dev["counters"]["reports"] > 0


def test_device_error_is_the_rings_return_code(media: Path) -> None:
    """A call the device refuses is answered with the ring's return code, logged and
    counted; it is never swallowed, and the session goes on."""
    svc = FirmwareService(media, device=True)
    cl = RingClient(media)
    cl.wait_ready(timeout=1)
    _open(cl, svc, n=8, cap=2)
    _create(cl, svc, list(range(8)))
    bad = np.zeros(1, L.CTX_LEN_REC)
    bad["ctx"] = 1 << 20  # the device's bound on context ids (the device checks it)
    c = cl.call(L.OP_CTX_LEN, svc.poll_once, count=1, payload=bad.tobytes())
    assert c.status == L.RC_INVALID_INPUT
    st = svc.stats()
    assert st["device_errors"] == 1 and st["errors"] == 1
    assert any("device:" in m for m in st["error_log"])
    assert _attn(cl, svc, [0, 1], [0.5, 0.25]).status == L.RC_SUCCESS
    # an entry size the device cannot page (not a power of two) is refused at OPEN, and
    # the open session goes on (found by the ring fuzzer: the refused OPEN had ended it)
    c = cl.call(L.OP_OPEN, svc.poll_once, payload=L.OPEN_FMT.pack(8, 192, 2, 16, 0))
    assert c.status == L.RC_INVALID_INPUT and svc.stats()["device_errors"] == 2
    assert _attn(cl, svc, [2, 3], [0.5, 0.25]).status == L.RC_SUCCESS
    assert len(svc.stats()["sessions"]) == 1


@pytest.mark.parametrize("device", [False, True])
def test_a_refused_command_leaves_the_step_where_it_was(media: Path, device: bool) -> None:
    """Found by the ring fuzzer against the device emulator: a command of a later step that
    the device refused (a weight above 1, a context id past its bound) still moved the
    session's step on, so END_STEP of the step the firmware was in was refused after it.
    An error completion changes nothing (docs/qemu.md, "Return codes")."""
    svc = FirmwareService(media, device=device)
    cl = RingClient(media)
    cl.wait_ready(timeout=1)
    _open(cl, svc, n=8, cap=2)
    _create(cl, svc, list(range(8)))
    assert _attn(cl, svc, [0, 1], [0.5, 0.25], step=3).status == L.RC_SUCCESS
    bad_ctx = np.zeros(1, L.CTX_LEN_REC)
    bad_ctx["ctx"] = 1 << 20  # past MAX_CONTEXTS
    refused = [
        cl.call(L.OP_CTX_LEN, svc.poll_once, step=9, count=1, payload=bad_ctx.tobytes()),
        _attn(cl, svc, [0, 1], [float("nan"), 0.5], step=9),
    ]
    if device:  # the device takes weights within [0, 1] only
        refused.append(_attn(cl, svc, [0, 1], [0.5, 2.0], step=9))
    assert [c.status for c in refused] == [L.RC_INVALID_INPUT] * len(refused)
    assert cl.call(L.OP_END_STEP, svc.poll_once, step=3).status == L.RC_SUCCESS
    assert _attn(cl, svc, [2], [0.5], step=4).status == L.RC_SUCCESS
    cl.close()


@pytest.mark.parametrize("device", [False, True])
def test_integer_mode_reaches_the_firmware(media: Path, device: bool) -> None:
    """``mode="int"``: the ring's answers are the simulator's in integer mode, which on this
    trace are not the float mode's (so the mode did reach the firmware)."""
    svc = FirmwareService(media, device=device, mode="int")
    cl = RingClient(media)
    cl.wait_ready(timeout=1)
    gt = default_trace(steps=12)
    got = replay(cl, gt, poll=svc.poll_once)
    want = simulate_victims(gt, mode="int")
    assert got["victims"] == want and got["residency_mismatches"] == 0
    assert want != simulate_victims(gt, mode="float")


def test_each_ring_command_names_its_handler_on_its_row() -> None:
    """Dispatch is the table's: every row names a FirmwareService method, and every
    ``op_`` method is some row's (no handler left outside the table)."""
    from kvcxl.qemu.service import FirmwareService

    named = {c.handler for c in L.RING_COMMANDS}
    assert all(callable(getattr(FirmwareService, h, None)) for h in named)
    assert {m for m in vars(FirmwareService) if m.startswith("op_")} == named
    assert {op: c.limit for op, c in L.BY_OPCODE.items() if c.records is not None} == {
        L.OP_CREATE: L.CREATE_MAX,
        L.OP_ATTN: L.ATTN_MAX,
        L.OP_CTX_LEN: L.CTX_LEN_MAX,
    }
