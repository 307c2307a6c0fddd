"""Equivalence with the simulator: a compiled workload driven through the device — Describe
and Create Entries for new KV, Set Context Lengths, a CXL.mem read of every attended entry and
an Attention Report per layer, all over the mailbox — gives the simulator's hits, misses and
victim sequence, for every online policy the registry holds."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.cxl.hdm import GRANULE
from kvcxl.emu.device.cci import Mailbox
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.emu.workloads.stream import CREATE
from kvcxl.firmware.policies import POLICIES

BASE = 1 << 36
Op = mb.Opcode
# Every policy the device can run (it refuses the offline ones), from the registry: a new
# policy is checked the day it registers.
ONLINE = sorted(name for name, cls in POLICIES.items() if cls.online)
# The policies docs/device.md says the device reproduces: one that leaves the registry, or
# stops being online, fails here instead of dropping out of the parametrisation unseen.
NAMED_IN_DOCS = ("ema", "lru", "h2o", "sink-window")


def _call(box: Mailbox, opcode: int, payload: bytes) -> bytes:
    rsp = mb.CciMessage.decode(box.execute(mb.request(opcode, payload)))
    assert rsp.rc == mb.ReturnCode.SUCCESS, (hex(opcode), box.last_error)
    return rsp.payload


def _drive(stream, policy: str, capacity: int):
    dev = Type3Device(
        GRANULE, dram_pages=capacity, policy=policy, record_victims=True, entries="host"
    )
    dev.hdm.program(0, base=BASE, size=GRANULE)
    dev.hdm.commit(0)
    box = Mailbox(dev)
    assert stream.n_entries <= dev.n_pages
    off, lo = stream.ev_off, stream.len_off
    for ev in range(stream.n_events):
        step = int(stream.ev_step[ev])
        a, z = int(lo[ev]), int(lo[ev + 1])
        if z > a:
            rec = np.empty(z - a, mb.LENGTH_RECORD)
            rec["ctx"], rec["tokens"] = stream.len_ctx[a:z], stream.len_tokens[a:z]
            _call(box, Op.VENDOR_SET_CONTEXT_LENGTHS, struct.pack("<I", rec.size) + rec.tobytes())
        ids = stream.ids[off[ev] : off[ev + 1]]
        if stream.ev_kind[ev] == CREATE:
            if ids.size:
                rec = np.empty(ids.size, mb.DESCRIBE_RECORD)
                rec["entry"], rec["ctx"] = ids, stream.e_ctx[ids]
                rec["layer"], rec["head"] = stream.e_layer[ids], stream.e_head[ids]
                rec["block"] = stream.e_block[ids]
                _call(box, Op.VENDOR_DESCRIBE_ENTRIES, struct.pack("<I", ids.size) + rec.tobytes())
                body = struct.pack("<II", step, ids.size) + ids.astype("<u4").tobytes()
                _call(box, Op.VENDOR_CREATE_ENTRIES, body)
            continue
        for e in ids.tolist():  # the host reads a line of every entry it attends to
            dev.handle(mem.decode(mem.encode(mem.M2SReq(1, e & 0xFFFF, (BASE >> 6) + e * 64))))
        w = stream.w[off[ev] : off[ev + 1]]
        rec = np.empty(ids.size, mb.ATTENTION_RECORD)
        rec["entry"], rec["weight"] = ids, w
        _call(box, Op.VENDOR_ATTENTION_REPORT, struct.pack("<II", step, ids.size) + rec.tobytes())
    victims: list = []
    while True:  # the log comes in pages of at most one payload
        out = _call(box, Op.VENDOR_GET_VICTIMS, struct.pack("<II", len(victims), 1 << 20))
        (total,) = struct.unpack_from("<I", out)
        victims += np.frombuffer(out[4:], mb.VICTIM_RECORD).tolist()
        if len(victims) >= total:
            return dev, victims


def test_the_policies_the_docs_name_are_registered_online():
    missing = [p for p in NAMED_IN_DOCS if p not in ONLINE]
    assert not missing, (
        f"docs/device.md says the device reproduces the simulator for {missing}, but the "
        f"policy registry (kvcxl.firmware.policies.POLICIES) holds no online policy of that "
        f"name; online: {ONLINE}"
    )


@pytest.mark.parametrize("workload", ["cyclic", "zipf-sessions", "multi-turn"])
@pytest.mark.parametrize("policy", ONLINE)
def test_device_reproduces_the_simulator(workload, policy):
    shape = PRESETS["ci"]
    stream = compile_workload(make_workload(workload, shape, seed=3), steps=12)
    capacity = max(8, stream.n_entries // 4)
    # The numpy engine: the reference the fast engine is tested equal to (tests/test_sim_fast.py),
    # with no compilation per policy.  Its own audit is not what this compares: the device's
    # is checked below.
    sim = simulate(
        stream,
        SimOptions(
            policy=policy, budget_bytes=capacity * shape.entry_bytes, record_victims=True,
            engine="numpy",
        ),
    )  # fmt: skip
    dev, victims = _drive(stream, policy, capacity)
    assert dev.cache.stats.hits == sim["cache"]["hits"]
    assert dev.cache.stats.misses == sim["cache"]["misses"]
    ref = [
        (int(e), float(p))
        for ids, prio, _ in sim["_victims"]
        for e, p in zip(ids, prio, strict=True)
    ]
    assert [(e, p) for _, e, p in victims] == ref
    assert sim["cache"]["evictions"] > 0
    # the device's audit checked every victim it made, and found none wrong
    assert dev.audit.checked == len(victims) and dev.audit.wrong == 0
