"""One device: the memory-path device answers the ring on its doorbell (no QEMU).

A host client speaks the guest agent's protocol; its doorbell store is sent to the
device as the CXL.mem write a patched QEMU makes of it (the doorbell page is trapped).
Nothing polls: the answer must be in the completion queue when that write completes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcxl.cxl import mem
from kvcxl.cxl import ring as L
from kvcxl.emu.device import pagestate
from kvcxl.emu.device.service import Client, serving
from kvcxl.firmware.formulas import TIER_NVME
from kvcxl.qemu.ring_client import RingClient, mem_doorbell, replay
from kvcxl.qemu.ring_device import Heartbeat, build
from kvcxl.qemu.trace_image import default_trace, simulate_victims


@pytest.fixture
def device(tmp_path: Path):
    media = tmp_path / "media.bin"
    with open(media, "wb") as f:
        f.truncate(256 << 20)
    engine, ring = build(media, tmp_path / "page-state.bin")
    with serving(engine, tmp_path / "d.sock"), Client(tmp_path / "d.sock") as c:
        cl = RingClient(media, doorbell=mem_doorbell(c))
        cl.wait_ready(timeout=1)
        yield engine, ring, cl
        cl.close()
    engine.device.close()


def test_the_doorbell_write_completes_after_the_answer(device) -> None:
    engine, ring, cl = device
    dev = engine.device
    # the doorbell's page is trapped for good: a patched QEMU sends its writes here
    assert dev.page_state.state[(L.RING_BASE + L.HOST_HDR) >> dev.page_shift] == pagestate.TRAP
    for k in range(20):
        i = cl.submit(L.OP_NOP, arg0=1000 + k)
        assert cl.done(i), "the doorbell write completed before its command was answered"
        c = cl.wait(i)
        assert c.status == L.RC_SUCCESS and c.r[4] == 1000 + k
    st = ring.stats()
    assert st["served_on"] == "doorbell" and st["doorbells"] == engine.rung == 20
    assert st["commands"]["NOP"] == 20


def test_a_batch_on_one_doorbell_is_answered_in_order_every_field_written(device) -> None:
    """Pipelined: DEPTH commands, one doorbell (as the agent's bench job rings), three laps
    of the ring.  Nothing is answered before the doorbell, everything before its write
    completes; completion i carries submission i's cid, opcode, index and argument."""
    engine, ring, cl = device
    bell, silent = cl.doorbell, lambda tail: None
    for lap in range(3):  # from the second lap on, each CQE holds the previous lap's answer
        cl.doorbell = silent  # enqueue only
        cid0 = cl.cid
        idx = [cl.submit(L.OP_NOP, arg0=(lap << 32) + k) for k in range(L.DEPTH)]
        assert not any(cl.done(i) for i in idx)
        cl.doorbell = bell
        bell(cl.sq_tail)
        assert all(cl.done(i) for i in idx)
        for k, i in enumerate(idx):
            cid, st, op, sq_head, out_len, *r, seq = L.CQE_FMT.unpack_from(cl.mm, L.cq_offset(i))
            assert (cid, st, op, sq_head, out_len, seq) == (
                cid0 + k,
                L.RC_SUCCESS,
                L.OP_NOP,
                i + 1,
                0,
                i + 1,
            )
            assert r == [0, 0, 0, 0, (lap << 32) + k]
            cl.wait(i)  # consumed: cq_head moves on
    st = ring.stats()
    assert st["doorbells"] == engine.rung == 3 and ring.sq_head == 3 * L.DEPTH
    assert st["commands"] == {"NOP": 3 * L.DEPTH} and st["completions"] == {"Success": 96}


def test_the_memory_path_device_is_the_rings_firmware(device) -> None:
    """The victims the ring answers are the simulator's, decided by the memory-path
    device's own firmware session; each victim's page moved, in that device, to the tier
    the firmware's map names (NVMe-placed blocks are on NVMe until the guest reads them)."""
    engine, ring, cl = device
    dev = engine.device
    gt = default_trace(steps=12)
    assert gt.entry_bytes == 4096 == dev.page_bytes  # one device page per entry
    got = replay(cl, gt)
    want = simulate_victims(gt)
    assert len(want) > 100 and got["victims"] == want
    assert got["residency_mismatches"] == 0
    assert ring.device is dev and ring.fw is dev.fw  # one device, one firmware session
    assert [v for _, v, _ in dev.victims] == want
    st = ring.stats()
    assert st["firmware"] == "memory-path device" and st["errors"] == 0
    # Managed tiers (the default): every victim lands in DRAM, and step boundaries sink
    # some of them to NVMe later, so the pages placed are the victims plus those sinks.
    placed = st["memory_path_pages_placed"]
    assert got["victim_tiers"].count(TIER_NVME) == 0 and placed["dram"] == len(want)
    assert placed["nvme"] > 0
    # each entry's page is in the tier the firmware's map names (never placed: DRAM)
    pages = (L.KV_BASE >> dev.page_shift) + np.arange(gt.n_entries)
    tier = np.zeros(gt.n_entries, np.uint8)  # firmware entry e is trace entry e
    known = min(gt.n_entries, dev.fw.lower.tier.size)  # (the map grows as entries arrive)
    tier[:known] = dev.fw.lower.tier[:known]
    want_dram = tier != TIER_NVME
    assert np.count_nonzero(~want_dram) > 0
    assert np.array_equal(np.frombuffer(dev.in_dram, np.uint8)[pages] == 1, want_dram)
    # and QEMU may go direct exactly to the DRAM-tier ones
    assert np.array_equal(dev.page_state.state[pages] == pagestate.DIRECT, want_dram)


def _guest_reads(dev, client: Client, unreported_at: int | None = None):
    """``read(entry)`` as the guest's loads reach the device through a patched QEMU: a
    DIRECT page is counted in the page-state table (QEMU's fast path), any other is a
    CXL.mem read (which fills it from NVMe).  At read number ``unreported_at`` the guest
    also reads an entry it holds in its own memory (a read no report explains)."""
    n, extra = [0], []

    def load(e: int) -> None:
        dpa = L.KV_BASE + e * 4096
        p = dpa >> dev.page_shift
        if dev.page_state.state[p] == pagestate.DIRECT:
            dev.page_state.count[p] += 1
        else:
            msg = mem.M2SReq(
                opcode=mem.M2SReqOpcode.MEM_RD, snp_type=mem.SnpType.NO_OP,
                meta_field=mem.MetaField.NO_OP, meta_value=0, tag=0, addr=dpa >> 6,
            )  # fmt: skip
            assert client.mem(msg).poison == 0

    def read(e: int) -> None:
        n[0] += 1
        load(e)
        if n[0] == unreported_at:
            held = np.flatnonzero(dev.cache.is_resident(np.arange(dev.n_entries)))
            x = next(int(h) for h in held if int(h) not in dev.kv_traffic.expected)
            extra.append(x)
            load(x)

    read.extra = extra
    return read


@pytest.mark.parametrize("unreported", [False, True])
def test_the_device_learns_the_reads_from_the_traffic(device, tmp_path, unreported) -> None:
    """Each step's end, the device maps the step's per-page access counts (direct, in the
    page-state table, and trapped) to entries: exactly the misses and admissions the
    guest had to read; a read no report explains is caught."""
    engine, _ring, cl = device
    dev = engine.device
    gt = default_trace(steps=8)
    with Client(tmp_path / "d.sock") as c:
        read = _guest_reads(dev, c, 1200 if unreported else None)
        got = replay(cl, gt, read=read)
    assert got["victims"] == simulate_victims(gt)  # the reads change no decision
    kt = dev.stats()["kv_traffic"]
    assert kt["steps"] == 8 and kt["entries_expected"] > 1000
    assert dev.counters["nvme_fills"] > 0  # some reads were trapped (NVMe pages)
    if not unreported:
        assert kt["disagreeing_steps"] == 0, kt["first_disagreement"]
        assert kt["entries_read"] == kt["entries_expected"]
        assert sum(kt["entries_read_per_step"]) == kt["entries_read"]
    else:
        assert kt["disagreeing_steps"] == 1, (read.extra, kt)
        assert kt["first_disagreement"]["read_not_expected"] == read.extra
        assert kt["entries_read"] == kt["entries_expected"] + 1


def test_a_missed_doorbell_is_a_fault_not_a_hang(device, monkeypatch) -> None:
    """A submission whose doorbell never reaches the device (the guest's store went
    straight to memory) turns the ring's status to FAULT within the bound."""
    from kvcxl.qemu import ring_device

    engine, ring, cl = device
    monkeypatch.setattr(ring_device, "MISSED_DOORBELL_S", 0.05)
    cl.doorbell = None  # a plain store into the ring: no CXL.mem write
    beat = Heartbeat(engine, ring)
    beat.start()
    try:
        i = cl.submit(L.OP_NOP)
        for _ in range(200):
            if ring.status == L.DEV_FAULT:
                break
            beat.halt.wait(0.01)
    finally:
        beat.halt.set()
        beat.join()
    assert ring.status == L.DEV_FAULT and not cl.done(i)
    assert any("no doorbell" in m for m in ring.error_log)
