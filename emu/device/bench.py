"""Benchmarks of the device emulator for ``kvcxl bench`` (all wall-clock figures Measured).

* ``device.cxl_mem`` — CXL.mem transactions/s: 64 B MemRd / MemWr, encoded to bytes,
  decoded, served and the response encoded (the service's per-transaction work),
  and the same without the byte encoding;
* ``device.mailbox`` — mailbox commands/s for a mix of generic commands, and
  attention reports/s (32 entries each, the policy engine's ingest path);
* ``device.byte_ranges`` — 4 KiB reads and writes through the decoders (MB/s);
* ``device.socket`` — round trips/s over the Unix-socket service (64 B READ frames);
* ``device.socket_load`` — 16 concurrent clients on a ``kvcxl device serve`` process,
  each writing and reading back its own range (count- and time-limited): throughput,
  p50/p99 round-trip latency, errors and mismatched bytes (:mod:`kvcxl.emu.device.load`);
* ``device.timing_model`` — Simulated latency percentiles of the tier model for a
  mixed DRAM/NVMe read stream at a fixed offered load (not a wall-clock figure).
"""

from __future__ import annotations

import random
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvcxl.cxl import mailbox as mb
from kvcxl.cxl import mem
from kvcxl.cxl.hdm import GRANULE

from ..timing import NVME
from .device import Type3Device
from .service import MEM, Client, Engine, serve_process, serving

BASE = 1 << 36


def _device(**kw) -> Type3Device:
    d = Type3Device(GRANULE, **kw)
    d.hdm.program(0, base=BASE, size=GRANULE)
    d.hdm.commit(0)
    return d


def _rate(n: int, fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def bench_cxl_mem(quick: bool) -> dict:
    n = 5_000 if quick else 50_000
    rng = random.Random(0)
    engine = Engine(_device(dram_pages=1024))
    lines = [(BASE >> 6) + rng.randrange(1 << 16) for _ in range(n)]
    wires = [
        mem.encode(
            mem.M2SReq(mem.M2SReqOpcode.MEM_RD, i & 0xFFFF, a)
            if i % 2
            else mem.M2SRwD(mem.M2SRwDOpcode.MEM_WR, i & 0xFFFF, a, rng.randbytes(64))
        )
        for i, a in enumerate(lines)
    ]
    msgs = [mem.decode(w) for w in wires]

    def encoded() -> None:
        for w in wires:
            engine.handle(MEM, w)

    def direct() -> None:
        h = engine.device.handle
        for m in msgs:
            h(m)

    return {
        "transactions": n,
        "encoded_transactions_per_s": round(_rate(n, encoded), 1),
        "direct_transactions_per_s": round(_rate(n, direct), 1),
        "mix": "50% MemRd, 50% MemWr, 64 B lines",
        "evidence": "Measured",
    }


def bench_mailbox(quick: bool) -> dict:
    n = 5_000 if quick else 50_000
    engine = Engine(_device(dram_pages=1024))
    box = engine.mailbox
    mix = [
        mb.request(mb.Opcode.GET_HEALTH_INFO),
        mb.request(mb.Opcode.GET_TIMESTAMP),
        mb.request(mb.Opcode.IDENTIFY_MEMORY_DEVICE),
        mb.request(mb.Opcode.GET_POISON_LIST, struct.pack("<QQ", 0, 1024)),
        mb.request(mb.Opcode.INJECT_POISON, struct.pack("<Q", 0x4000)),
        mb.request(mb.Opcode.VENDOR_GET_PARAM, b"alpha"),
    ]
    reqs = [mix[i % len(mix)] for i in range(n)]

    def generic() -> None:
        for r in reqs:
            box.execute(r)

    rng = np.random.default_rng(0)
    n_rep = n // 10
    reports = []
    for step in range(n_rep):
        ids = np.unique(rng.integers(0, 8192, 32))
        rec = np.empty(ids.size, dtype=mb.ATTENTION_RECORD)
        rec["entry"], rec["weight"] = ids, rng.random(ids.size)
        payload = struct.pack("<II", step // 4, ids.size) + rec.tobytes()
        reports.append(mb.request(mb.Opcode.VENDOR_ATTENTION_REPORT, payload))

    def ingest() -> None:
        for r in reports:
            box.execute(r)

    return {
        "commands": n,
        "mailbox_commands_per_s": round(_rate(n, generic), 1),
        "mix": "Get Health Info, Get Timestamp, Identify Memory Device, Get Poison List, "
        "Inject Poison, Get Policy Parameter",
        "attention_reports_per_s": round(_rate(n_rep, ingest), 1),
        "report_entries": 32,
        "report_dram_pages": 1024,
        "evidence": "Measured",
    }


def bench_byte_ranges(quick: bool) -> dict:
    n = 5_000 if quick else 50_000
    d = _device()
    rng = random.Random(1)
    addrs = [BASE + 4096 * rng.randrange(1 << 14) for _ in range(n)]
    blob = rng.randbytes(4096)

    def writes() -> None:
        for a in addrs:
            d.write(a, blob)

    def reads() -> None:
        for a in addrs:
            d.read(a, 4096)

    w = _rate(n, writes)
    r = _rate(n, reads)
    return {
        "ops": n,
        "write_4k_ops_per_s": round(w, 1),
        "read_4k_ops_per_s": round(r, 1),
        "write_MB_per_s": round(w * 4096 / 1e6, 1),
        "read_MB_per_s": round(r * 4096 / 1e6, 1),
        "evidence": "Measured",
    }


def bench_socket(quick: bool) -> dict:
    n = 2_000 if quick else 20_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.sock"
        with serving(Engine(_device()), path), Client(path) as c:
            t0 = time.perf_counter()
            for i in range(n):
                c.read(BASE + 64 * (i & 1023), 64)
            rate = n / (time.perf_counter() - t0)
    return {
        "round_trips": n,
        "round_trips_per_s": round(rate, 1),
        "frame": "READ 64 B",
        "evidence": "Measured",
    }


def bench_socket_load(quick: bool) -> dict:
    from .load import run_load

    clients, ops, seconds = 16, (100 if quick else 1000), (30.0 if quick else 120.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "load.sock"
        with serve_process(path, 256 << 20, BASE):
            res = run_load(path, BASE, clients=clients, ops=ops, seconds=seconds)
    res["server"] = "kvcxl device serve (its own process), Unix socket"
    return res


def queueing_run(rho: float, n: int, seed: int = 0, size: int = 4096) -> dict:
    """NVMe-resident ``size``-byte reads with Poisson arrivals at utilisation ``rho``.

    Returns the simulated latency percentiles and the M/D/1 mean the queueing term
    must reproduce: latency + S + rho·S / (2(1 − rho)), S = size / bandwidth.
    """
    d = _device(dram_pages=1)  # (almost) every page lives on NVMe
    t = d.queues["nvme"].timing
    service = size / t.bandwidth_gbps
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(service / rho, n))
    pages = rng.integers(1, 1 << 14, n)
    lat = np.empty(n)
    for i in range(n):
        lat[i] = d.read(BASE + int(pages[i]) * 4096, size, at=float(arrivals[i])).latency_ns
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    return {
        "utilisation": rho,
        "requests": n,
        "latency_mean_ns": round(float(lat.mean()), 1),
        "latency_p50_ns": round(float(p50), 1),
        "latency_p95_ns": round(float(p95), 1),
        "latency_p99_ns": round(float(p99), 1),
        "md1_mean_ns": round(t.latency_ns + service + rho * service / (2 * (1 - rho)), 1),
    }


def bench_timing_model(quick: bool) -> dict:
    n = 20_000 if quick else 200_000
    return {
        "size_bytes": 4096,
        "tier": f"nvme ({NVME.latency_ns / 1000:g} us + 4096 B / {NVME.bandwidth_gbps:g} GB/s)",
        "arrivals": "Poisson",
        "loads": [queueing_run(rho, n) for rho in (0.5, 0.8, 0.95)],
        "evidence": "Simulated (Analytical tier model inputs); md1_mean_ns is the "
        "Analytical model the simulation should match",
    }


def benches() -> dict[str, Callable[[bool], dict]]:
    return {
        "device.cxl_mem": bench_cxl_mem,
        "device.mailbox": bench_mailbox,
        "device.byte_ranges": bench_byte_ranges,
        "device.socket": bench_socket,
        "device.socket_load": bench_socket_load,
        "device.timing_model": bench_timing_model,
    }
