"""The integrity soak: random reads and writes through interleave sets while data migrates.

For each interleave set-up (ways × granularity) the soak builds that many devices,
programs one decoder on each (same HPA window, its own position), and drives a
random mix of operations against the window, checking every read against a
shadow copy of what was written:

* byte-range reads and writes, 1 B … 4 KiB (log-uniform), at unaligned addresses,
  split by the host at granule boundaries onto the owning device — as a host
  bridge does;
* single-line CXL.mem MemRd / MemWr / MemWrPtl transactions, encoded to bytes and
  decoded by the device like any other;
* every ``report_every`` operations, an attention report (vendor mailbox command)
  to every device naming a skewed random set of its pages, so the policy admits
  pages to DRAM and evicts others to NVMe under pressure (DRAM holds a fraction
  of the pages touched).

At the end the whole window is read back once more.  ``mismatched_bytes`` must be 0.
"""

from __future__ import annotations

import math
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.cxl.hdm import GRANULE

from .cci import Mailbox
from .device import Type3Device

BASE = 1 << 40
_REPORT = mb.ATTENTION_RECORD
SETUPS: tuple[tuple[int, int], ...] = ((1, 4096), (2, 256), (4, 1024), (8, 16384), (16, 256))


@dataclass
class SoakConfig:
    ops: int = 1_000_000
    setups: tuple[tuple[int, int], ...] = SETUPS
    span: int = 4 << 20  # bytes of HPA window exercised per set-up
    page_bytes: int = 4096
    dram_fraction: float = 0.125  # DRAM pages / pages touched per device
    max_size: int = 4096
    mem_fraction: float = 0.05  # share of ops that are single-line CXL.mem transactions
    report_every: int = 64
    report_entries: int = 32
    poison_every: int = 997  # ops between poison rounds (inject, read back, clear)
    policy: str = "ema"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.ops < 1:
            raise ValueError(f"ops = {self.ops} must be >= 1")
        if not 1 <= self.max_size <= self.span // 2:
            raise ValueError(f"max_size = {self.max_size} must be 1 … span/2")
        if not 0 < self.dram_fraction <= 1:
            raise ValueError(f"dram_fraction = {self.dram_fraction} must be in (0, 1]")
        if not 0 <= self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction = {self.mem_fraction} must be in [0, 1]")
        for ways, gran in self.setups:
            if self.span % (ways * gran):
                raise ValueError(f"span = {self.span} must be a multiple of {ways} × {gran}")


class _Set:
    """One interleave set: ``ways`` devices behind one HPA window."""

    def __init__(self, ways: int, gran: int, cfg: SoakConfig) -> None:
        self.ways, self.gran = ways, gran
        per_dev_pages = cfg.span // ways // cfg.page_bytes or 1
        self.pages = per_dev_pages
        dram = max(1, int(per_dev_pages * cfg.dram_fraction))
        self.devices = []
        for pos in range(ways):
            d = Type3Device(GRANULE, page_bytes=cfg.page_bytes, dram_pages=dram, policy=cfg.policy)
            d.hdm.program(
                0, base=BASE, size=GRANULE * ways, ways=ways, granularity=gran, position=pos
            )
            d.hdm.commit(0)
            self.devices.append(d)
        self.boxes = [Mailbox(d) for d in self.devices]

    def owner(self, hpa: int) -> Type3Device:
        return self.devices[((hpa - BASE) // self.gran) % self.ways]

    def pieces(self, hpa: int, n: int):
        g = self.gran
        end = hpa + n
        while hpa < end:
            k = min(end - hpa, g - (hpa - BASE) % g)
            yield hpa, k, self.owner(hpa)
            hpa += k


def run(cfg: SoakConfig, progress: Callable[[int], None] | None = None) -> dict:
    """Run the soak; returns the JSON report."""
    rng = random.Random(cfg.seed)
    log_max = math.log(cfg.max_size)
    out_setups = []
    totals = dict.fromkeys(
        (
            "ops",
            "reads",
            "writes",
            "mem_transactions",
            "bytes_written",
            "bytes_checked",
            "mismatched_bytes",
            "reports",
            "migrations",
            "bytes_migrated",
            "wrong_victims",
            "audited_victims",
            "unmapped",
            "poison_checks",
            "poison_errors",
        ),
        0,
    )
    t_start = time.perf_counter()
    per_setup = [cfg.ops // len(cfg.setups)] * len(cfg.setups)
    per_setup[0] += cfg.ops - sum(per_setup)
    done_ops = 0
    for (ways, gran), n_ops in zip(cfg.setups, per_setup, strict=True):
        s = _Set(ways, gran, cfg)
        shadow = bytearray(cfg.span)
        c = dict.fromkeys(totals, 0)
        # Skewed page popularity so the policy has something to learn.
        zipf = np.arange(1, s.pages + 1, dtype=np.float64) ** -1.1
        zipf /= zipf.sum()
        nprng = np.random.default_rng(cfg.seed + ways * 100_003 + gran)
        t0 = time.perf_counter()
        for i in range(n_ops):
            r = rng.random()
            if r < cfg.mem_fraction:
                _mem_op(s, shadow, rng, c)
            else:
                n = min(cfg.max_size, int(math.exp(rng.random() * log_max)))
                a = rng.randrange(cfg.span - n + 1)
                if rng.random() < 0.5:
                    data = rng.randbytes(n)
                    for h, k, dev in s.pieces(BASE + a, n):
                        o = h - BASE - a
                        c["unmapped"] += not dev.write(h, data[o : o + k])
                    shadow[a : a + n] = data
                    c["writes"] += 1
                    c["bytes_written"] += n
                else:
                    got = b"".join(dev.read(h, k).data for h, k, dev in s.pieces(BASE + a, n))
                    c["mismatched_bytes"] += _diff(got, shadow, a)
                    c["reads"] += 1
                    c["bytes_checked"] += n
            c["ops"] += 1
            if i % cfg.report_every == cfg.report_every - 1:
                # One device per report, round robin: every device sees the same
                # report rate whatever the number of ways.
                k = i // cfg.report_every
                box = s.boxes[k % ways]
                ids = np.unique(nprng.choice(s.pages, cfg.report_entries, p=zipf))
                rec = np.empty(ids.size, dtype=_REPORT)
                rec["entry"], rec["weight"] = ids, nprng.random(ids.size)
                payload = struct.pack("<II", k // (4 * ways), ids.size) + rec.tobytes()
                rc, _ = box.call(mb.Opcode.VENDOR_ATTENTION_REPORT, payload)
                if rc != mb.ReturnCode.SUCCESS:
                    raise RuntimeError(f"attention report refused: {rc!r} {box.last_error}")
                c["reports"] += 1
            if i % cfg.poison_every == cfg.poison_every - 1:
                _poison_round(s, shadow, rng, c)
            if progress is not None and (i & 1023) == 1023:
                progress(1024)
                done_ops += 1024
        # Final sweep: every byte of the window once more.
        got = b"".join(dev.read(h, k).data for h, k, dev in s.pieces(BASE, cfg.span))
        c["mismatched_bytes"] += _diff(got, shadow, 0)
        c["bytes_checked"] += cfg.span
        wall = time.perf_counter() - t0
        for d in s.devices:
            st = d.stats()
            c["migrations"] += st["counters"]["migrations_to_dram"]
            c["migrations"] += st["counters"]["migrations_to_nvme"]
            c["bytes_migrated"] += st["counters"]["bytes_migrated"]
            c["wrong_victims"] += st["audit"].get("wrong_victims", 0)
            c["audited_victims"] += st["audit"].get("audited_victims", 0)
            if not d.check_placement():
                raise RuntimeError("DRAM contents diverged from the policy cache's residency")
        lat = s.devices[0].stats()["requests"]
        out_setups.append(
            {
                "ways": ways,
                "granularity": gran,
                "devices": ways,
                "pages_per_device": s.pages,
                "dram_pages_per_device": s.devices[0].dram_pages,
                **c,
                "wall_s": round(wall, 2),
                "device0_request_latency": lat,
            }
        )
        for k in totals:
            totals[k] += c[k]
        for d in s.devices:
            d.close()
    if progress is not None:
        progress(cfg.ops - done_ops)
    wall = time.perf_counter() - t_start
    return {
        **totals,
        "setups": out_setups,
        "wall_s": round(wall, 2),
        "ops_per_s": round(cfg.ops / wall, 1),
        "policy": cfg.policy,
        "seed": cfg.seed,
        "evidence": "Measured (integrity, wall time); latencies Simulated from the tier model",
    }


def _diff(got: bytes, shadow: bytearray, a: int) -> int:
    want = shadow[a : a + len(got)]
    if got == want:
        return 0
    return int(np.count_nonzero(np.frombuffer(got, np.uint8) != np.frombuffer(want, np.uint8)))


def _mem_op(s: _Set, shadow: bytearray, rng: random.Random, c: dict) -> None:
    """One single-line CXL.mem transaction through the byte encoding."""
    line = rng.randrange(len(shadow) // 64)
    hpa = BASE + line * 64
    dev = s.owner(hpa)
    tag = rng.randrange(1 << 16)
    kind = rng.random()
    if kind < 0.5:
        rsp = mem.decode(
            mem.encode(
                dev.handle(
                    mem.decode(mem.encode(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, tag, hpa >> 6)))
                )
            )
        )
        if rsp.tag != tag or rsp.opcode != mem.S2MDRSOpcode.MEM_DATA:
            raise RuntimeError(f"bad response {rsp!r} to MemRd tag {tag}")
        c["mismatched_bytes"] += _diff(rsp.data, shadow, line * 64)
        c["bytes_checked"] += 64
        c["reads"] += 1
    else:
        data = rng.randbytes(64)
        if kind < 0.75:
            msg = mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR, tag, hpa >> 6, data)
            shadow[line * 64 : line * 64 + 64] = data
            c["bytes_written"] += 64
        else:
            be = rng.getrandbits(64)
            msg = mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR_PTL, tag, hpa >> 6, data, byte_enable=be)
            for j in range(64):
                if be >> j & 1:
                    shadow[line * 64 + j] = data[j]
            c["bytes_written"] += be.bit_count()
        rsp = mem.decode(mem.encode(dev.handle(mem.decode(mem.encode(msg)))))
        if rsp.tag != tag or rsp.opcode != mem.S2MNDROpcode.CMP:
            raise RuntimeError(f"bad response {rsp!r} to write tag {tag}")
        c["writes"] += 1
    c["mem_transactions"] += 1


def _poison_round(s: _Set, shadow: bytearray, rng: random.Random, c: dict) -> None:
    """Inject poison on one line over the mailbox, check reads flag exactly that line
    (whatever tier it lives in), then clear it with the line's current contents."""
    line = rng.randrange(len(shadow) // 64)
    hpa = BASE + line * 64
    dev = s.owner(hpa)
    box = s.boxes[s.devices.index(dev)]
    dpa = dev.hdm.translate(hpa)
    rc, _ = box.call(mb.Opcode.INJECT_POISON, struct.pack("<Q", dpa))
    if rc != mb.ReturnCode.SUCCESS:
        raise RuntimeError(f"Inject Poison refused: {rc!r} {box.last_error}")
    good = bytes(shadow[line * 64 : line * 64 + 64])
    inside = dev.read(hpa + 5, 10)
    rsp = dev.handle(mem.M2SReq(mem.M2SReqOpcode.MEM_RD, 1, hpa >> 6))
    neighbour = line + 1 if line + 1 < len(shadow) // 64 else line - 1
    other = s.owner(BASE + neighbour * 64).read(BASE + neighbour * 64, 64)
    c["poison_errors"] += (not inside.poisoned) + (rsp.poison != 1) + other.poisoned
    c["mismatched_bytes"] += _diff(inside.data, shadow, line * 64 + 5)
    c["mismatched_bytes"] += _diff(rsp.data, shadow, line * 64)
    rc, _ = box.call(mb.Opcode.CLEAR_POISON, struct.pack("<Q", dpa) + good)
    if rc != mb.ReturnCode.SUCCESS:
        raise RuntimeError(f"Clear Poison refused: {rc!r} {box.last_error}")
    after = dev.read(hpa, 64)
    c["poison_errors"] += after.poisoned
    c["mismatched_bytes"] += _diff(after.data, shadow, line * 64)
    c["poison_checks"] += 1
