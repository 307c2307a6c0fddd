"""Mailbox: framing, generic and memory-device commands, vendor policy commands, return codes."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl.hdm import GRANULE
from kvcxl.cxl.mailbox import Opcode
from kvcxl.cxl.mailbox import ReturnCode as RC
from kvcxl.emu.device.cci import Mailbox
from kvcxl.emu.device.device import Type3Device


@pytest.fixture
def box() -> Mailbox:
    d = Type3Device(GRANULE, dram_pages=8, record_victims=True)
    d.hdm.program(0, base=1 << 36, size=GRANULE)
    d.hdm.commit(0)
    return Mailbox(d)


def _run(box: Mailbox, opcode: int, payload: bytes = b"", tag: int = 9):
    rsp = mb.CciMessage.decode(box.execute(mb.request(opcode, payload, tag)))
    assert rsp.category == mb.CAT_RESPONSE and rsp.tag == tag and rsp.opcode == opcode
    return RC(rsp.rc), rsp.payload


def test_return_codes_match_the_spec_numbers():
    assert RC.INVALID_INPUT == 2 and RC.UNSUPPORTED == 3 and RC.INVALID_PHYSICAL_ADDRESS == 0xF
    assert RC.INJECT_POISON_LIMIT == 0x10 and RC.INVALID_PAYLOAD_LENGTH == 0x16
    assert Opcode.IDENTIFY_MEMORY_DEVICE == 0x4000 and Opcode.GET_POISON_LIST == 0x4300


def test_identify_memory_device_layout(box):
    rc, out = _run(box, Opcode.IDENTIFY_MEMORY_DEVICE)
    assert rc == RC.SUCCESS and len(out) == 0x45
    total, volatile, persistent = struct.unpack_from("<QQQ", out, 16)
    assert total == volatile == 1 and persistent == 0
    rc, out = _run(box, Opcode.IDENTIFY)
    assert len(out) == 18 and out[-1] == 3 and out[-2] == 16


def test_health_timestamp_and_cel(box):
    assert _run(box, Opcode.GET_HEALTH_INFO)[1].__len__() == 18
    assert _run(box, Opcode.GET_TIMESTAMP)[1] == bytes(8)  # never set
    assert _run(box, Opcode.SET_TIMESTAMP, struct.pack("<Q", 10**18))[0] == RC.SUCCESS
    (ts,) = struct.unpack("<Q", _run(box, Opcode.GET_TIMESTAMP)[1])
    assert 10**18 <= ts < 10**18 + 10**10
    _rc, logs = _run(box, Opcode.GET_SUPPORTED_LOGS)
    n, uuid, size = struct.unpack("<H6x16sI", logs)
    assert n == 1 and uuid == mb.CEL_UUID and size == 4 * len(mb.COMMANDS)
    _rc, cel = _run(box, Opcode.GET_LOG, struct.pack("<16sII", uuid, 0, size))
    ops = [struct.unpack_from("<HH", cel, i)[0] for i in range(0, size, 4)]
    assert sorted(ops) == sorted(int(o) for o in mb.COMMANDS)
    assert _run(box, Opcode.GET_LOG, struct.pack("<16sII", bytes(16), 0, 4))[0] == RC.INVALID_LOG
    assert _run(box, Opcode.GET_LOG, struct.pack("<16sII", uuid, 4, size))[0] == RC.INVALID_INPUT


def test_poison_inject_list_clear(box):
    dev = box.dev
    assert _run(box, Opcode.INJECT_POISON, struct.pack("<Q", 0x1000))[0] == RC.SUCCESS
    assert _run(box, Opcode.INJECT_POISON, struct.pack("<Q", 0x1040))[0] == RC.SUCCESS
    assert dev.read((1 << 36) + 0x1000, 1).poisoned
    rc, out = _run(box, Opcode.GET_POISON_LIST, struct.pack("<QQ", 0, GRANULE // 64))
    _flags, _, _, count = struct.unpack_from("<BBQH", out)
    assert rc == RC.SUCCESS and count == 1 and len(out) == 32 + 16
    addr, length, _ = struct.unpack_from("<QII", out, 32)
    assert addr == 0x1000 | 0x3 and length == 2  # merged, source "injected"
    clear = struct.pack("<Q", 0x1000) + b"\x5a" * 64
    assert _run(box, Opcode.CLEAR_POISON, clear)[0] == RC.SUCCESS
    r = dev.read((1 << 36) + 0x1000, 64)
    assert not r.poisoned and r.data == b"\x5a" * 64
    assert _run(box, Opcode.INJECT_POISON, struct.pack("<Q", 0x1001))[0] == RC.INVALID_INPUT
    bad = struct.pack("<Q", GRANULE)
    assert _run(box, Opcode.INJECT_POISON, bad)[0] == RC.INVALID_PHYSICAL_ADDRESS
    for i in range(255):
        assert _run(box, Opcode.INJECT_POISON, struct.pack("<Q", 0x10000 + 64 * i))[0] == 0
    assert _run(box, Opcode.INJECT_POISON, struct.pack("<Q", 0x90000))[0] == RC.INJECT_POISON_LIMIT


def test_vendor_policy_parameters_are_validated_by_the_config(box):
    _rc, out = _run(box, Opcode.VENDOR_GET_PARAM, b"alpha")
    assert json.loads(out) == {"alpha": 0.2}
    assert _run(box, Opcode.VENDOR_SET_PARAM, b'{"alpha": 0.05}')[0] == RC.SUCCESS
    assert json.loads(_run(box, Opcode.VENDOR_GET_PARAM, b"alpha")[1]) == {"alpha": 0.05}
    assert box.dev.policy.config.alpha == 0.05
    assert _run(box, Opcode.VENDOR_SET_PARAM, b'{"alpha": 7}')[0] == RC.INVALID_INPUT
    assert "alpha" in box.last_error
    assert _run(box, Opcode.VENDOR_SET_PARAM, b'{"nope": 1}')[0] == RC.INVALID_INPUT
    assert _run(box, Opcode.VENDOR_SET_PARAM, b"{")[0] == RC.INVALID_INPUT
    assert _run(box, Opcode.VENDOR_SET_PARAM, b"")[0] == RC.INVALID_PAYLOAD_LENGTH
    assert _run(box, Opcode.VENDOR_GET_PARAM, b"nope")[0] == RC.INVALID_INPUT
    assert len(json.loads(_run(box, Opcode.VENDOR_GET_PARAM)[1])) > 10
    # a policy's own parameter, by its effective value (here the declared default)
    assert json.loads(_run(box, Opcode.VENDOR_GET_PARAM, b"sink_tokens")[1]) == {"sink_tokens": 4}


def _report(step: int, ids, weights) -> bytes:
    return struct.pack("<II", step, len(ids)) + b"".join(
        struct.pack("<If", i, w) for i, w in zip(ids, weights, strict=True)
    )


def test_attention_report_hits_and_errors(box):
    rc, out = _run(box, Opcode.VENDOR_ATTENTION_REPORT, _report(0, [1, 2, 3], [0.5, 0.2, 0.1]))
    assert rc == RC.SUCCESS and struct.unpack_from("<I", out)[0] == 0
    rc, out = _run(box, Opcode.VENDOR_ATTENTION_REPORT, _report(1, [1, 4], [0.5, 0.2]))
    assert struct.unpack_from("<I", out)[0] == 1 and out[4] == 0b01
    assert _run(box, Opcode.VENDOR_ATTENTION_REPORT, b"\0" * 7)[0] == RC.INVALID_PAYLOAD_LENGTH
    short = _report(2, [1, 2], [0.1, 0.1])[:-1]
    assert _run(box, Opcode.VENDOR_ATTENTION_REPORT, short)[0] == RC.INVALID_PAYLOAD_LENGTH
    far = _report(2, [box.dev.n_pages], [0.1])
    assert _run(box, Opcode.VENDOR_ATTENTION_REPORT, far)[0] == RC.INVALID_INPUT
    nan = _report(2, [1], [float("nan")])
    assert _run(box, Opcode.VENDOR_ATTENTION_REPORT, nan)[0] == RC.INVALID_INPUT
    stats = json.loads(_run(box, Opcode.VENDOR_GET_STATS)[1])
    assert stats["cache"]["hits"] == 1 and stats["counters"]["reports"] == 2


def test_framing_errors_get_return_codes(box):
    assert _run(box, 0x7777)[0] == RC.UNSUPPORTED
    assert _run(box, Opcode.GET_TIMESTAMP, b"x")[0] == RC.INVALID_PAYLOAD_LENGTH
    raw = bytearray(mb.request(Opcode.GET_TIMESTAMP))
    raw[5] = 4  # says 4 payload bytes, carries none
    rsp = mb.CciMessage.decode(box.execute(bytes(raw)))
    assert rsp.rc == RC.INVALID_PAYLOAD_LENGTH
    assert mb.CciMessage.decode(box.execute(b"\0\1")).rc == RC.INVALID_PAYLOAD_LENGTH
    resp_cat = mb.CciMessage(mb.CAT_RESPONSE, 0, Opcode.GET_TIMESTAMP, b"").encode()
    assert mb.CciMessage.decode(box.execute(resp_cat)).rc == RC.INVALID_INPUT


def test_victim_log_through_the_mailbox(box):
    ids = list(range(12))
    _run(box, Opcode.VENDOR_ATTENTION_REPORT, _report(0, ids, [0.01 * i for i in ids]))
    rc, out = _run(box, Opcode.VENDOR_GET_VICTIMS, struct.pack("<II", 0, 100))
    (total,) = struct.unpack_from("<I", out)
    assert rc == RC.SUCCESS and total == 4 == (len(out) - 4) // 16
    assert np.all(np.frombuffer(out[4:], dtype="<u4").reshape(-1, 4)[:, 0] == 0)


def test_entry_description_commands_validate_their_input(box):
    rec = struct.pack("<IIHHI", 5, 7, 1, 0, 3)
    assert _run(box, Opcode.VENDOR_DESCRIBE_ENTRIES, struct.pack("<I", 1) + rec)[0] == 0
    t = box.dev.table
    assert (t.ctx[5], t.layer[5], t.block[5], t.ctx_tokens[7]) == (7, 1, 3, 3 * 16 + 1)
    short = struct.pack("<I", 2) + rec
    assert _run(box, Opcode.VENDOR_DESCRIBE_ENTRIES, short)[0] == RC.INVALID_PAYLOAD_LENGTH
    huge_ctx = struct.pack("<I", 1) + struct.pack("<IIHHI", 5, 1 << 30, 1, 0, 3)
    assert _run(box, Opcode.VENDOR_DESCRIBE_ENTRIES, huge_ctx)[0] == RC.INVALID_INPUT
    lengths = struct.pack("<I", 1) + struct.pack("<IQ", 7, 500)
    assert _run(box, Opcode.VENDOR_SET_CONTEXT_LENGTHS, lengths)[0] == 0
    assert box.dev.table.ctx_tokens[7] == 500
    rc, out = _run(box, Opcode.VENDOR_CREATE_ENTRIES, struct.pack("<III", 0, 1, 5))
    assert rc == 0 and struct.unpack("<I", out)[0] == 1 and box.dev.cache.is_resident([5])[0]
    far = struct.pack("<III", 0, 1, box.dev.n_pages)
    assert _run(box, Opcode.VENDOR_CREATE_ENTRIES, far)[0] == RC.INVALID_INPUT


def test_command_table_is_the_one_source():
    """Each row names a handler that exists; docs/device.md shows the table itself."""
    from pathlib import Path

    for c in mb.COMMANDS.values():
        assert callable(getattr(Mailbox, c.handler))
    doc = (Path(__file__).resolve().parent.parent / "docs" / "device.md").read_text()
    assert mb.markdown_table() in doc
