"""The device: lossless data path under migration, poison, CXL.mem responses, timing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvcxl.cxl import mem
from kvcxl.cxl.hdm import GRANULE
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.timing import TierQueue
from kvcxl.emu.timing import TierParams

BASE = 1 << 36


def _device(**kw) -> Type3Device:
    d = Type3Device(GRANULE, **kw)
    d.hdm.program(0, base=BASE, size=GRANULE)
    d.hdm.commit(0)
    return d


def test_reads_return_last_write_while_the_policy_migrates(tmp_path):
    d = _device(page_bytes=4096, dram_pages=16, dram_file=tmp_path / "dram.img")
    rng = random.Random(1)
    shadow = bytearray(64 * 4096)
    for i in range(3000):
        a = rng.randrange(len(shadow) - 4096)
        if rng.random() < 0.5:
            data = rng.randbytes(rng.randint(1, 4096))
            assert d.write(BASE + a, data)
            shadow[a : a + len(data)] = data
        else:
            n = rng.randint(1, 4096)
            assert d.read(BASE + a, n).data == bytes(shadow[a : a + n])
        if i % 20 == 0:
            ids = np.array(rng.sample(range(64), 8))
            d.report(i // 100, ids, np.array([rng.random() for _ in ids]))
    assert d.counters["migrations_to_nvme"] > 50 and d.counters["bytes_migrated"] > 0
    assert d.check_placement()
    assert d.read(BASE, len(shadow)).data == bytes(shadow)
    assert len(d.dram) <= 16
    assert d.stats()["audit"]["wrong_victims"] == 0


def test_demoted_pages_leave_the_dram_file(tmp_path):
    path = tmp_path / "dram.img"
    d = _device(page_bytes=4096, dram_pages=1, dram_file=path)
    d.report(0, np.array([0]), np.array([1.0]))
    d.write(BASE, b"\xab" * 4096)
    d.report(1, np.array([1]), np.array([1.0]))  # page 0 must make room
    d.dram.map.flush()
    with open(path, "rb") as f:
        assert f.read(4096) == bytes(4096)  # no stale copy in DRAM
    assert d.read(BASE, 4096).data == b"\xab" * 4096  # served from NVMe


def test_cxl_mem_read_write_partial_and_unmapped():
    d = _device()
    line = BASE >> 6
    rsp = d.handle(mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR, 5, line, bytes(range(64))))
    assert rsp == mem.S2MNDR(mem.S2MNDROpcode.CMP, 5)
    d.handle(mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR_PTL, 6, line, b"\xff" * 64, byte_enable=0b101))
    rsp = d.handle(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, 7, line))
    assert rsp.opcode == mem.S2MDRSOpcode.MEM_DATA and rsp.tag == 7 and not rsp.poison
    assert rsp.data == b"\xff\x01\xff" + bytes(range(3, 64))
    nxm = d.handle(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, 8, 0))
    assert nxm.opcode == mem.S2MDRSOpcode.MEM_DATA_NXM and nxm.poison == 1
    assert d.handle(mem.M2SRwD(1, 9, 0, bytes(64))).opcode == mem.S2MNDROpcode.CMP
    assert d.counters["unmapped_writes"] == 1
    assert d.handle(mem.M2SReq(mem.M2SReqOpcode.MEM_SPEC_RD, 1, line)) is None
    assert d.handle(mem.M2SReq(mem.M2SReqOpcode.MEM_INV, 2, line)).opcode == 0
    with pytest.raises(ValueError, match="device-to-host"):
        d.handle(mem.S2MNDR(0, 0))


def test_partial_writes_of_any_byte_enables_equal_a_plain_merge():
    """MemWrPtl keeps the bytes its enables leave out: runs (what a patched QEMU sends,
    served without a per-byte loop) and scattered bytes, against a byte-by-byte merge."""
    d = _device()
    rng = random.Random(5)
    line = (BASE >> 6) + 9
    want = bytearray(rng.randbytes(64))
    d.handle(mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR, 0, line, bytes(want)))
    for i in range(300):
        if i % 2:
            n = rng.randrange(1, 65)
            be = ((1 << n) - 1) << rng.randrange(0, 65 - n)
        else:
            be = rng.randrange(1, 1 << 64)
        data = rng.randbytes(64)
        d.handle(mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR_PTL, 0, line, data, byte_enable=be))
        for b in range(64):
            if be >> b & 1:
                want[b] = data[b]
        assert d.handle(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, 0, line)).data == bytes(want)


def test_poison_is_per_line_and_full_line_writes_clear_it():
    d = _device()
    line = (BASE >> 6) + 3
    d.handle(mem.M2SRwD(1, 0, line, b"\x11" * 64, poison=1))
    assert d.handle(mem.M2SReq(1, 0, line)).poison == 1
    assert d.handle(mem.M2SReq(1, 0, line + 1)).poison == 0
    assert d.read(BASE + 3 * 64 + 10, 4).poisoned
    d.handle(mem.M2SRwD(2, 0, line, b"\x22" * 64, byte_enable=1))  # partial: stays poisoned
    assert d.handle(mem.M2SReq(1, 0, line)).poison == 1
    d.handle(mem.M2SRwD(1, 0, line, b"\x33" * 64))
    assert d.handle(mem.M2SReq(1, 0, line)).poison == 0


def test_interleaved_devices_reassemble_host_data():
    ways, gran = 4, 512
    devs = []
    for pos in range(ways):
        d = Type3Device(GRANULE, dram_pages=4)
        d.hdm.program(0, base=BASE, size=GRANULE * ways, ways=ways, granularity=gran, position=pos)
        d.hdm.commit(0)
        devs.append(d)
    data = random.Random(2).randbytes(10_000)
    for d in devs:
        assert not d.write(BASE + 300, data)  # each device drops the other ways' granules
    out = bytearray(len(data))
    for d in devs:
        r = d.read(BASE + 300, len(data))
        for i in range(len(data)):
            if ((300 + i) // gran) % ways == devs.index(d):
                out[i] = r.data[i]
    assert bytes(out) == data


def test_tier_queue_serialises_transfers_and_overlaps_latency():
    q = TierQueue(TierParams("t", latency_ns=100.0, bandwidth_gbps=1.0))
    assert q.serve(0.0, 64) == pytest.approx(164.0)
    assert q.serve(0.0, 64) == pytest.approx(228.0)  # waited for the first transfer
    assert q.serve(1000.0, 64) == pytest.approx(1164.0)  # idle tier: no wait
    s = q.summary()
    assert s["requests"] == 3 and s["latency_p50_ns"] == pytest.approx(164.0)


def test_nvme_reads_are_slower_than_dram_reads():
    d = _device(dram_pages=1)
    d.report(0, np.array([0]), np.array([1.0]))
    fast = d.read(BASE, 64).latency_ns
    slow = d.read(BASE + 4096, 64).latency_ns
    assert fast == pytest.approx(200 + 1)
    assert slow == pytest.approx(25_000 + 64 / 14.0)  # NVMe: 25 µs + 14 GB/s


def test_constructor_refuses_bad_values():
    with pytest.raises(ValueError, match="page_bytes"):
        Type3Device(GRANULE, page_bytes=100)
    with pytest.raises(ValueError, match="online policy"):
        Type3Device(GRANULE, policy="belady")
    with pytest.raises(ValueError, match="capacity"):
        Type3Device(1000)
    d = _device()
    with pytest.raises(ValueError, match="outside the device"):
        d.report(0, np.array([d.n_pages]), np.array([0.5]))
    with pytest.raises(ValueError, match="within"):
        d.report(0, np.array([1]), np.array([1.5]))


def test_queueing_term_reproduces_md1_waiting_time():
    """Poisson arrivals on one tier with fixed service: mean wait = rho*S / (2(1 - rho))."""
    from kvcxl.emu.device.bench import queueing_run

    r = queueing_run(0.8, 50_000, seed=1)
    service = 4096 / 14.0
    wait = r["latency_mean_ns"] - 25_000 - service
    assert wait == pytest.approx(0.8 * service / (2 * 0.2), rel=0.05)
    assert r["latency_p99_ns"] > r["latency_p95_ns"] > r["latency_p50_ns"] > 25_000 + service


def test_shared_dram_file_sees_writes_from_another_process(tmp_path):
    """The QEMU layout: all pages in DRAM, the file is the media (DPA = file offset)."""
    import os

    path = tmp_path / "media.img"
    d = _device(dram_file=path)  # dram_pages=None: no migration
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"from the guest", 3 * 4096 + 7)  # as QEMU would, through its mapping
        assert d.read(BASE + 3 * 4096 + 7, 14).data == b"from the guest"
        d.write(BASE + 5 * 4096, b"from the device")
        d.dram.map.flush()
        assert os.pread(fd, 15, 5 * 4096) == b"from the device"
    finally:
        os.close(fd)
        d.close()


def test_decision_methods_return_what_the_device_acted_on():
    """create_decisions / report_decisions return the firmware's Decisions; the device's
    residency and victim log follow them, and create / report answer as before."""
    a = Type3Device(256 << 20, page_bytes=1 << 20, dram_pages=4, entries="host",
                    record_victims=True)  # fmt: skip
    b = Type3Device(256 << 20, page_bytes=1 << 20, dram_pages=4, entries="host",
                    record_victims=True)  # fmt: skip
    rng = np.random.default_rng(3)
    ids = np.arange(12)
    a.describe(ids, 0, 0, 0, ids + 100, step=0)
    b.describe(ids, 0, 0, 0, ids + 100)
    d = a.create_decisions(0, ids[:6])
    assert b.create(0, ids[:6]) == d.admitted.size
    logged = list(d.victims)
    for step in range(1, 6):
        batch = rng.choice(12, 5, replace=False)
        w = rng.random(5)
        hit, d = a.report_decisions(step, batch, w)
        assert np.array_equal(hit, b.report(step, batch, w))
        assert d.tiers.size == d.victims.size
        logged += list(d.victims)
        # an admitted entry is resident unless it left again within the same batch
        left = np.isin(d.admitted, d.victims)
        assert a.cache.is_resident(d.admitted[~left]).all()
        assert isinstance(a.prefetch_candidates(batch, w, 8), np.ndarray)
        a.end_step(step)
    assert [v for _, v, _ in a.victims] == logged == [v for _, v, _ in b.victims]
    assert a.check_placement()
