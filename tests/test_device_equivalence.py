"""Equivalence: a trace driven through the device (CXL.mem reads + vendor attention reports
over the mailbox) gives the same hits, misses and victim sequence as the firmware replay."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.cxl.hdm import GRANULE
from kvcxl.emu.device.cci import Mailbox
from kvcxl.emu.device.device import Type3Device
from kvcxl.firmware.replay import replay

BASE = 1 << 36


def _trace(seed: int, n_batches: int = 240, n_entries: int = 400, per_batch: int = 24):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_entries + 1) ** 1.1
    p /= p.sum()
    batches = [np.unique(rng.choice(n_entries, per_batch, p=p)) for _ in range(n_batches)]
    # f32 weights, as the Attention Report carries them
    weights = [
        rng.dirichlet(np.ones(b.size)).astype(np.float32).astype(np.float64) for b in batches
    ]
    steps = [t // 4 for t in range(n_batches)]  # four layers per decode step
    return batches, weights, steps


def _drive(policy: str, capacity: int, batches, weights, steps, mode: str = "float"):
    dev = Type3Device(
        GRANULE,
        page_bytes=4096,
        dram_pages=capacity,
        policy=policy,
        mode=mode,
        record_victims=True,
    )
    dev.hdm.program(0, base=BASE, size=GRANULE)
    dev.hdm.commit(0)
    box = Mailbox(dev)
    tag = 0
    for b, w, s in zip(batches, weights, steps, strict=True):
        for e in b.tolist():  # the host reads one line of every entry it attends to
            req = mem.encode(
                mem.M2SReq(mem.M2SReqOpcode.MEM_RD, tag & 0xFFFF, (BASE >> 6) + e * 64)
            )
            rsp = mem.decode(mem.encode(dev.handle(mem.decode(req))))
            assert rsp.opcode == mem.S2MDRSOpcode.MEM_DATA and rsp.tag == tag & 0xFFFF
            tag += 1
        payload = struct.pack("<II", s, b.size) + b"".join(
            struct.pack("<If", i, x) for i, x in zip(b.tolist(), w.tolist(), strict=True)
        )
        rsp = mb.CciMessage.decode(
            box.execute(mb.request(mb.Opcode.VENDOR_ATTENTION_REPORT, payload))
        )
        assert rsp.rc == mb.ReturnCode.SUCCESS
    victims = []
    while True:
        rsp = mb.CciMessage.decode(
            box.execute(
                mb.request(mb.Opcode.VENDOR_GET_VICTIMS, struct.pack("<II", len(victims), 4000))
            )
        )
        (total,) = struct.unpack_from("<I", rsp.payload)
        victims += np.frombuffer(rsp.payload[4:], mb.VICTIM_RECORD).tolist()
        if len(victims) >= total:
            break
    assert dev.check_placement()
    return dev, victims


@pytest.mark.parametrize("policy", ["ema", "lru", "h2o", "lfu"])
@pytest.mark.parametrize("seed", [0, 1])
def test_device_and_replay_agree(policy, seed):
    batches, weights, steps = _trace(seed)
    capacity = 60
    dev, victims = _drive(policy, capacity, batches, weights, steps)
    # The device runs the firmware's placement (managed tiers by default), so the replay does.
    ref = replay(
        policy, batches, capacity, weights=weights, steps=steps, record_victims=True,
        placement="policy",
    )  # fmt: skip
    assert (dev.cache.stats.hits, dev.cache.stats.misses) == (ref.hits, ref.misses)
    assert [(t, e) for t, e, _ in victims] == [(t, e) for t, e, _ in ref.victims]
    assert np.allclose([p for *_, p in victims], [p for *_, p in ref.victims], rtol=0, atol=0)
    assert ref.evictions > 100 and dev.audit.wrong == 0
    assert dev.counters["migrations_to_nvme"] == ref.evictions


def test_device_and_replay_agree_in_the_q16_integer_mode():
    batches, weights, steps = _trace(2)
    dev, victims = _drive("ema", 60, batches, weights, steps, mode="int")
    ref = replay(
        "ema", batches, 60, weights=weights, steps=steps, record_victims=True, mode="int",
        placement="policy",
    )  # fmt: skip
    assert (dev.cache.stats.hits, dev.cache.stats.misses) == (ref.hits, ref.misses)
    assert victims == [(t, e, p) for t, e, p in ref.victims]
