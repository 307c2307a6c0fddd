"""The ring fuzzer (kvcxl.qemu.ring_fuzz): every case a mutated command through the ring's
shared memory, every return code predicted by a model of the ring's rules; wrong return
codes, internal errors and bytes changed outside the command's own slots all count, and
each is seen when planted."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcxl.qemu import ring_fuzz
from kvcxl.qemu import service as ring_service


@pytest.fixture
def media(tmp_path: Path) -> Path:
    p = tmp_path / "media.bin"
    with open(p, "wb") as f:
        f.truncate(64 << 20)
    return p


def test_every_mutated_command_gets_the_modelled_return_code(media) -> None:
    r = ring_fuzz.run(media, 600, seed=1)
    assert r["cases"] == 600 and r["unmodified_cases"] == 0
    assert (r["crashes"], r["wrong_return_codes"], r["changed_bytes"]) == (0, 0, 0), r["examples"]
    assert set(r["mutations"]) == {"op", "count", "in_len", "step", "flip", "field", "arg"}
    for op in ("OPEN", "CREATE", "ATTN", "CTX_LEN", "END_STEP", "POISON"):
        rcs = {k.split(" -> ")[1] for k in r["coverage"] if k.startswith(op + " ")}
        assert "Success" in rcs and len(rcs) >= 2, (op, rcs)


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
    from kvcxl.qemu import layout as L

    def nop(self, step, layer, count, payload, arg0, arg1):
        self.mm[L.slot_in_offset(self.sq_head + 1)] ^= 0xFF
        return b"", (0, 0, 0, 0, int(arg0))

    monkeypatch.setitem(ring_service.FirmwareService._handlers, L.OP_NOP, nop)
    r = ring_fuzz.run(media, 300, seed=2)
    assert r["changed_bytes"] > 0
