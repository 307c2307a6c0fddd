"""The device's one poison list: what reads see and what Get Poison List reports agree,
each record with its source (CXL 2.0 §8.2.9.5.4.1: 1 external, 3 injected), checked
against a plain per-line model written from docs/device.md."""

from __future__ import annotations

import random
import struct

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl.hdm import GRANULE
from kvcxl.cxl.mailbox import Opcode
from kvcxl.cxl.mailbox import ReturnCode as RC
from kvcxl.emu.device.cci import Mailbox
from kvcxl.emu.device.device import Type3Device

BASE = 1 << 36
LINES = 64  # the lines the test uses: DPA 0 … 4 KiB


def _box() -> Mailbox:
    d = Type3Device(GRANULE, dram_pages=8)
    d.hdm.program(0, base=BASE, size=GRANULE)
    d.hdm.commit(0)
    return Mailbox(d)


def _call(box: Mailbox, op: int, payload: bytes) -> tuple[int, bytes]:
    rsp = mb.CciMessage.decode(box.execute(mb.request(op, payload, 1)))
    return rsp.rc, rsp.payload


def _listed(box: Mailbox) -> dict[int, int]:
    """Get Poison List over the test's lines, expanded to {line: source}."""
    req = mb.COMMANDS[Opcode.GET_POISON_LIST].request.fixed.pack(0, LINES)
    rc, out = _call(box, Opcode.GET_POISON_LIST, req)
    assert rc == RC.SUCCESS
    layout = mb.COMMANDS[Opcode.GET_POISON_LIST].response
    n = layout.fixed.unpack_from(out)[-1]
    got = {}
    for addr, lines, _ in struct.iter_unpack("<QII", out[layout.fixed.size :][: 16 * n]):
        for k in range(lines):
            got[(addr >> 6) + k] = addr & 7
    return got


def test_poison_list_matches_a_per_line_model() -> None:
    """Random host writes (poisoned or not, whole or partial lines), injections and clears;
    after each, the model's {line: source} is what the device lists and what reads see.
    Model (docs/device.md): a poisoned write marks its lines external unless already
    poisoned; Inject Poison marks the line injected; a whole-line write or Clear Poison
    removes the line's poison (and with it its source)."""
    rng = random.Random(7)
    box, model = _box(), {}
    for _ in range(600):
        k = rng.random()
        if k < 0.45:
            dpa = rng.randrange(LINES * 64 - 200)
            n = rng.choice([1, 32, 64, 100, 128, 192])
            poison = rng.random() < 0.4
            box.dev.write(BASE + dpa, bytes(n), poison=poison)
            first, last = dpa >> 6, (dpa + n - 1) >> 6
            if poison:
                for line in range(first, last + 1):
                    model.setdefault(line, 1)
            else:
                lo = first if dpa % 64 == 0 else first + 1
                hi = last if (dpa + n) % 64 == 0 else last - 1
                for line in range(lo, hi + 1):
                    model.pop(line, None)
        elif k < 0.8:
            line = rng.randrange(LINES)
            assert _call(box, Opcode.INJECT_POISON, struct.pack("<Q", line * 64))[0] == 0
            model[line] = 3
        else:
            line = rng.randrange(LINES)
            clear = struct.pack("<Q", line * 64) + bytes(64)
            assert _call(box, Opcode.CLEAR_POISON, clear)[0] == 0
            model.pop(line, None)
        assert _listed(box) == model
        line = rng.randrange(LINES)
        assert box.dev.read(BASE + line * 64, 64).poisoned == (line in model)


def test_overwritten_injection_leaves_no_stale_source_or_slot() -> None:
    """A line injected, overwritten whole (its poison gone), then poisoned by the host is
    external, not injected; and the overwrite frees its injection slot."""
    box = _box()
    assert _call(box, Opcode.INJECT_POISON, struct.pack("<Q", 0x40))[0] == 0
    box.dev.write(BASE + 0x40, bytes(64))
    box.dev.write(BASE + 0x40, bytes(64), poison=True)
    assert _listed(box) == {1: 1}
    for i in range(256):  # the limit counts live injected lines only
        assert _call(box, Opcode.INJECT_POISON, struct.pack("<Q", 0x10000 + 64 * i))[0] == 0
    over = struct.pack("<Q", 0x90000)
    assert _call(box, Opcode.INJECT_POISON, over)[0] == RC.INJECT_POISON_LIMIT
    box.dev.write(BASE + 0x10000, bytes(64))  # one injected line overwritten: a slot frees
    assert _call(box, Opcode.INJECT_POISON, over)[0] == 0
