"""DIRECT pages mapped into the guest as RAM (a patched QEMU's ``kvcxl-alias=on``): the
device keeps a page's bytes in the DRAM file until QEMU acknowledges that no vCPU maps
the page any more (``map_ack`` in the page-state table), so no guest access through an
old mapping sees a stale byte.  QEMU's side is played here by writing its header fields
as the patch does."""

from __future__ import annotations

import threading
import time

import numpy as np

from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.pagestate import DIRECT, TRAP, header_offsets
from kvcxl.emu.device.service import Churn, Engine

MIB = 1 << 20


class FakeQemu:
    """QEMU's end of the handshake: alias on, and acks on demand (or never)."""

    def __init__(self, dev: Type3Device) -> None:
        self.hdr = np.frombuffer(dev.page_state._map, dtype="<u4", count=16)
        self.off = {k: v // 4 for k, v in header_offsets().items()}
        self.hdr[self.off["alias"]] = 1
        self.ack()

    def ack(self) -> None:
        """Every trap so far has taken effect (QEMU's map follows the table)."""
        self.hdr[self.off["map_ack"]] = self.hdr[self.off["map_req"]]


def _dev(tmp_path) -> Type3Device:
    dev = Type3Device(
        256 * MIB, dram_file=tmp_path / "dram.bin", page_state=tmp_path / "ps.bin",
        fill_on_access=True,
    )  # fmt: skip
    dev.hdm.program(0, base=0, size=dev.capacity)  # HPA = DPA, as QEMU's decode gives it
    dev.hdm.commit(0)
    return dev


def test_a_demotion_waits_for_qemu_to_unmap_the_page(tmp_path) -> None:
    dev = _dev(tmp_path)
    qemu = FakeQemu(dev)
    ps, p = dev.page_state, 7
    assert ps.state[p] == DIRECT and ps.aliasing
    dev.write(p * 4096, b"A" * 4096)
    dev.move_page(p, to_dram=False)
    # trapped at once, but the bytes stay where the guest may still write them
    assert ps.state[p] == TRAP and dev.in_dram[p] and p in dev.leaving
    assert dev.counters["demotions_deferred"] == 1
    assert dev.settle_leaving() == 0
    # a write through the (not yet removed) mapping lands in the DRAM file ...
    dev.dram.write(p, 0, b"B" * 8)
    qemu.ack()
    assert dev.settle_leaving() == 1
    # ... and moves with the page: nothing lost
    assert not dev.in_dram[p] and not dev.leaving
    assert dev.read(p * 4096, 16).data == b"B" * 8 + b"A" * 8
    dev.close()


def test_a_promotion_before_the_ack_keeps_the_page_direct(tmp_path) -> None:
    dev = _dev(tmp_path)
    FakeQemu(dev)
    p = 3
    dev.move_page(p, to_dram=False)
    assert p in dev.leaving
    dev.move_page(p, to_dram=True)  # the firmware changed its mind
    assert not dev.leaving and dev.in_dram[p] and dev.page_state.state[p] == DIRECT
    dev.close()


def test_without_aliasing_a_demotion_moves_at_once(tmp_path) -> None:
    dev = _dev(tmp_path)  # no QEMU maps anything: alias = 0
    dev.move_page(5, to_dram=False)
    assert not dev.in_dram[5] and not dev.leaving
    dev.close()


def test_a_retrap_of_a_page_already_trapped_needs_no_new_ack(tmp_path) -> None:
    dev = _dev(tmp_path)
    qemu = FakeQemu(dev)
    ps = dev.page_state
    assert not dev.unmap(2)  # DIRECT -> TRAP: QEMU has to catch up
    qemu.ack()
    assert dev.unmap(2)
    assert dev.unmap(2)  # still TRAP since the acked trap: nothing new to wait for
    ps.direct(2)
    assert not dev.unmap(2)  # DIRECT again in between: a new trap, a new wait
    dev.close()


def test_the_churn_moves_a_page_out_only_after_the_ack(tmp_path) -> None:
    dev = _dev(tmp_path)
    qemu = FakeQemu(dev)
    engine = Engine(dev)
    churn = Churn(engine, [4])
    done = threading.Event()

    def flip() -> None:
        churn._flip(4)
        done.set()

    th = threading.Thread(target=flip)
    th.start()
    time.sleep(0.05)
    assert not done.is_set() and dev.in_dram[4] and 4 not in dev.inflight  # waiting
    assert dev.page_state.state[4] == TRAP
    qemu.ack()
    assert done.wait(5)
    th.join()
    assert not dev.in_dram[4]
    dev.close()


def test_the_engine_settles_deferred_demotions_on_the_next_request(tmp_path) -> None:
    dev = _dev(tmp_path)
    qemu = FakeQemu(dev)
    engine = Engine(dev)
    dev.move_page(9, to_dram=False)
    qemu.ack()
    engine.handle(0x05, b'{"op": "list"}')  # any frame
    assert not dev.in_dram[9] and not dev.leaving
    dev.close()


def test_the_device_checks_qemus_mapping_against_its_tiers(tmp_path) -> None:
    dev = _dev(tmp_path)
    qemu = FakeQemu(dev)
    ps = dev.page_state
    ps.mapped[:8] = 1  # QEMU maps pages 0-7
    assert dev.check_alias() == 0
    dev.move_page(6, to_dram=False)
    qemu.ack()  # a QEMU that acks without dropping its mapping: a broken protocol
    dev.settle_leaving()
    assert dev.counters["alias_violations"] == 1  # caught as the bytes left
    assert dev.check_alias() == 1  # and by the periodic check
    ps.mapped[6] = 0
    assert dev.check_alias() == 0
    assert dev.stats()["alias"] == {
        "on": True,
        "pages_mapped": 7,
        "map_req": ps.alias_stats()["map_req"],
        "map_ack": ps.alias_stats()["map_ack"],
    }
    dev.close()
