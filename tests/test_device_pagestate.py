"""The page-state table a patched QEMU shares with the device: the device marks a page
TRAP (and bumps its version) before its bytes leave the shared DRAM file or turn
poisoned, and DIRECT only when they are back and clean."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.pagestate import DIRECT, HEADER, MAGIC, TRAP, PageState, header_offsets

MIB = 1 << 20


def _dev(tmp_path, **kw) -> Type3Device:
    return Type3Device(
        256 * MIB, dram_file=tmp_path / "dram.bin", page_state=tmp_path / "ps.bin", **kw
    )


def test_the_header_is_what_the_c_side_reads(tmp_path) -> None:
    ps = PageState(tmp_path / "ps.bin", 10, 12)
    raw = (tmp_path / "ps.bin").read_bytes()
    fields = HEADER.unpack_from(raw)
    off = header_offsets()
    assert raw[off["magic"] : off["magic"] + 4] == MAGIC == fields[0]
    assert int.from_bytes(raw[off["pages"] : off["pages"] + 8], "little") == 10
    assert int.from_bytes(raw[off["page_shift"] : off["page_shift"] + 4], "little") == 12
    state_at = int.from_bytes(raw[off["state"] : off["state"] + 8], "little")
    assert list(raw[state_at : state_at + 10]) == [TRAP] * 10  # nothing direct yet
    ps.direct(3)
    assert (tmp_path / "ps.bin").read_bytes()[state_at + 3] == DIRECT
    ps.close()


def test_all_dram_pages_start_direct_and_poison_traps_them(tmp_path) -> None:
    dev = _dev(tmp_path)
    ps = dev.page_state
    assert (ps.state == DIRECT).all()
    v = int(ps.ver[5])
    dev.inject_poison(5 * 4096 + 128)
    assert ps.state[5] == TRAP and ps.ver[5] == v + 1
    dev.clear_poison(5 * 4096 + 128, bytes(64))
    assert ps.state[5] == DIRECT
    dev.trap(0x2000, 1)  # the firmware wants every access to page 2
    dev.inject_poison(0x2000)
    dev.clear_poison(0x2000, bytes(64))
    assert ps.state[2] == TRAP  # stays trapped after the poison is gone
    dev.close()


def test_migrations_trap_before_the_bytes_leave(tmp_path) -> None:
    dev = _dev(tmp_path, dram_pages=4)  # tiered: pages start on NVMe
    ps = dev.page_state
    assert (ps.state == TRAP).all()
    seen = []
    real_move = dev.migrations._move

    def move(p, src, dst, *a):
        seen.append((p, int(ps.state[p]), src is dev.dram))
        real_move(p, src, dst, *a)

    dev.migrations._move = move
    dev.report(0, np.arange(4), np.ones(4))  # fills the 4 DRAM pages
    assert (ps.state[:4] == DIRECT).all() and (ps.state[4:] == TRAP).all()
    dev.report(1, np.arange(4, 6), np.ones(2))  # two more: two demotions
    assert all(state == TRAP for _p, state, _from_dram in seen)  # trapped while moving
    in_dram = np.frombuffer(dev.in_dram, dtype=np.uint8) == 1
    assert np.array_equal(ps.state == DIRECT, in_dram)
    assert any(from_dram for *_x, from_dram in seen)  # some page did leave DRAM
    dev.close()


def test_trap_ranges_are_checked(tmp_path) -> None:
    dev = _dev(tmp_path)
    with pytest.raises(ValueError, match="outside the device"):
        dev.trap(256 * MIB - 10, 64)
    dev.close()


def test_a_fill_brings_the_page_in_and_the_access_waits_for_it(tmp_path) -> None:
    """With fill_on_access, a read that finds its page on NVMe pays the NVMe tier's time
    for the whole page (the modelled queue), then the page is DIRECT; the next read is a
    DRAM read."""
    dev = _dev(tmp_path, fill_on_access=True)
    dev.write(0x3000, b"x" * 64)  # decoder-free device: program the identity decoder
    assert dev.counters["unmapped_writes"] == 1
    dev.hdm.program(0, base=0, size=dev.capacity)
    dev.hdm.commit(0)
    dev.write(0x3000, b"kvcxl!" * 10)
    dev.move_page(3, to_dram=False)
    assert dev.page_state.state[3] == TRAP
    first = dev.read(0x3000, 60)
    second = dev.read(0x3000, 60)
    assert first.data == second.data == b"kvcxl!" * 10
    assert dev.counters["nvme_fills"] == 1 and dev.page_state.state[3] == DIRECT
    nvme_page_ns = dev.queues["nvme"].timing.access_ns(dev.page_bytes)  # a whole page
    assert first.latency_ns >= nvme_page_ns > second.latency_ns
    dev.close()
