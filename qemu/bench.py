"""``kvcxl bench`` figures of the virtual host (all Measured on this machine).

* ``qemu_ring_host``: the polling firmware service's turnaround seen by a host process
  on the same media file (no QEMU): NOP round trip and attention records/s.
* ``qemu_ring_host_doorbell``: the same through the one device of the patched QEMU's
  host side (``kvcxl.qemu.ring_device``): the doorbell is a CXL.mem write over the
  device's socket, served before it completes (no polling).
* ``qemu_boot`` (stock QEMU) and ``qemu_boot_kvcxl`` (the patched one), side by side: a
  boot without the TCG plugin: boot to /init and to region ready, guest-measured ring
  round trip (stock: the polling service; patched: the doorbell), attention records/s
  through the ring during the replay, guest memcpy to and from CXL memory beside plain guest RAM.
* ``qemu_boot_kvcxl`` sends the patched QEMU's CXL.mem requests over the device's socket,
  ``qemu_boot_kvcxl_ring`` through the shared-memory request ring (qemu/memring.py), in
  the same run: trapped 8-byte loads and the doorbell, socket against ring.
* ``qemu_boot_kvcxl_alias``: the patched QEMU with ``--alias`` (DRAM-tier pages mapped
  into the guest as RAM), in the same run: the guest's copies over those pages against
  guest RAM in the same boot (``memcpy_*_cxl_over_ram``, the figure tests/test_qemu_alias.py
  leaves to this bench), with the device's counts for the copied block showing the copies
  went through the mapping (``bench_block_traffic``); ``qemu_boot_kvcxl_alias_kvm``: the same under
  KVM (``--accel kvm``; skipped with the reason where KVM is not usable), so that
  ``--only qemu_boot_kvcxl_alias`` gives both side by side.
* ``qemu_boot_plugin``: the same with the plugin streaming every CXL-window access
  (skipped with --quick, and when the plugin was not built).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from typing import Any

from kvcxl.cxl import ring as L
from kvcxl.emu.device.service import Client, serving

from .accel import accel_unusable
from .boot import BootOptions, boot, why_no_result
from .ring_client import RingClient, mem_doorbell, replay
from .ring_device import build
from .service import FirmwareService
from .setup import SetupError, load_host
from .trace_image import default_trace


def _ring_host(quick: bool) -> dict[str, Any]:
    """The polled ring: the firmware service in a thread polls the media file."""
    with tempfile.TemporaryDirectory(dir=_shm()) as d:
        media = os.path.join(d, "media.bin")
        with open(media, "wb") as f:
            f.truncate(64 << 20)
        svc = FirmwareService(media)
        stop = threading.Event()
        t = threading.Thread(target=svc.run, args=(stop.is_set,), daemon=True)
        t.start()
        try:
            out = _ring_figures(RingClient(media), quick)
        finally:
            stop.set()
            t.join(timeout=5)
    what = "host process <-> polling firmware service over the media file (threads, no QEMU)"
    return {"evidence": "Measured", "what": what, **out}


def _ring_host_doorbell(quick: bool) -> dict[str, Any]:
    """The doorbell ring: the one device (qemu/ring_device.py) serves each command when
    the doorbell's CXL.mem write reaches it over its socket, as from a patched QEMU."""
    with tempfile.TemporaryDirectory(dir=_shm()) as d:
        media = os.path.join(d, "media.bin")
        with open(media, "wb") as f:
            f.truncate(256 << 20)
        engine, _ring = build(media, os.path.join(d, "page-state.bin"))
        sock = os.path.join(d, "device.sock")
        try:
            with serving(engine, sock), Client(sock) as c:
                out = _ring_figures(RingClient(media, doorbell=mem_doorbell(c)), quick)
        finally:
            engine.device.close()
    what = (
        "host process -> device socket (doorbell as a CXL.mem write, served before it "
        "completes; no polling), answers read from the media file"
    )
    return {"evidence": "Measured", "what": what, **out}


def _ring_figures(cl: RingClient, quick: bool) -> dict[str, Any]:
    """NOP round trips and a replay's attention records/s through ``cl``'s ring."""
    cl.wait_ready()
    n = 300 if quick else 3000
    rtt = []
    for i in range(n):
        t0 = time.perf_counter()
        cl.call(L.OP_NOP, arg0=i)
        rtt.append(time.perf_counter() - t0)
    gt = default_trace(steps=8 if quick else 24)
    t0 = time.perf_counter()
    res = replay(cl, gt)
    dt = time.perf_counter() - t0
    cl.close()
    rtt.sort()
    return {
        "nop_rtt_us_p50": round(statistics.median(rtt) * 1e6, 1),
        "nop_rtt_us_p99": round(rtt[int(0.99 * len(rtt))] * 1e6, 1),
        "attn_records_per_s": round(gt.stream.n_reads / dt, 1),
        "victims": len(res["victims"]),
    }


def _shm() -> str | None:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def _boot(
    plugin: bool,
    qemu: str = "stock",
    alias: bool = False,
    mem_link: str = "ring",
    accel: str = "tcg",
) -> dict[str, Any]:
    try:
        host = load_host()
    except SetupError as exc:
        return {"skipped": str(exc)}
    if plugin and not host.plugin_available:
        return {"skipped": f"ring-only mode: {host.plugin_error}"}
    binary = host.qemu_kvcxl if qemu == "kvcxl" else host.qemu
    why = accel_unusable(accel, str(binary)) if binary else None  # boot() names a missing one
    if why is not None:
        return {"skipped": why}
    # On the patched QEMU the widths area is trapped: the guest's timed loads there are the
    # slow path (a CXL.mem request answered by the device), its end block's the direct one.
    trap = ((L.WIDTHS_BASE, L.WIDTHS_BYTES),) if qemu == "kvcxl" else ()
    r, _b = boot(
        BootOptions(
            qemu=qemu, jobs=("replay", "bench"), plugin=plugin, trap=trap, alias=alias,
            mem_link=mem_link, accel=accel, timeout=600,
        )
    )  # fmt: skip
    g = r["guest"]
    out: dict[str, Any] = {
        "evidence": "Measured",
        "qemu": qemu,
        "plugin": "on" if plugin else "off",
        "alias": "on" if alias else "off",
        "mem_link": mem_link if qemu == "kvcxl" else None,
        "accel": accel,
        "qemu_exit_code": r["qemu"]["exit_code"],
        "guest_failures": r["guest_failures"],
        "load_average_1min": os.getloadavg()[0],
    }
    if "kvm_internal_error" in r:
        out["kvm_internal_error"] = r["kvm_internal_error"]
    if "console_tail" in r:
        out["console_tail"] = r["console_tail"][-10:]
    out.update(r["timings"])
    if "replay" in g:
        out["replay_attn_records_per_s"] = g["replay"]["attn_records_per_s"]
        out["replay_ring_commands_per_s"] = g["replay"]["ring_commands_per_s"]
        out["replay_s"] = g["replay"]["replay_s"]
    if "bench" in g:
        for k, v in g["bench"].items():
            if k not in ("event", "t", "uptime"):
                out[k] = v
        ram = g["bench"].get("memcpy_ram_MBps")
        if ram:  # device memory against guest RAM, copied in the same boot
            for way in ("to", "from"):
                mbps = g["bench"][f"memcpy_{way}_cxl_MBps"]
                out[f"memcpy_{way}_cxl_over_ram"] = round(mbps / ram, 4)
    for job in r.get("missing_results", []):  # what the guest, QEMU and the device said
        out.setdefault("no_result", {})[job] = why_no_result(r, job)
    dev = r.get("kvcxl_device") or {}
    if (dev.get("areas") or {}).get("bench_block"):
        # how the copies reached the block: CXL.mem requests the device served, accesses
        # QEMU completed against the DRAM file, pages mapped as guest RAM (--alias)
        out["bench_block_traffic"] = dev["areas"]["bench_block"]
    if dev.get("alias"):
        out["alias_state"] = dev["alias"]
        out["alias_violations"] = dev.get("alias_violations")
    out["wall_s"] = r["wall_s"]
    return out


def benches() -> dict:
    return {
        # the polled ring and the doorbell ring side by side
        "qemu_ring_host": _ring_host,
        "qemu_ring_host_doorbell": _ring_host_doorbell,
        # stock and patched QEMU side by side in one run (docs/qemu.md, "Measured timings")
        "qemu_boot": lambda quick: _boot(False),
        # the patched QEMU's CXL.mem requests over the device's socket, then through the
        # shared-memory request ring (the default), in the same run
        "qemu_boot_kvcxl": lambda quick: _boot(False, "kvcxl", mem_link="socket"),
        "qemu_boot_kvcxl_ring": lambda quick: _boot(False, "kvcxl", mem_link="ring"),
        # the patched QEMU with its DRAM-tier pages mapped into the guest as RAM
        "qemu_boot_kvcxl_alias": lambda quick: _boot(False, "kvcxl", alias=True),
        # the same under KVM: DIRECT pages at the host's RAM speed, trapped loads as exits
        "qemu_boot_kvcxl_alias_kvm": lambda quick: _boot(False, "kvcxl", alias=True, accel="kvm"),
        "qemu_boot_plugin": lambda quick: {"skipped": "--quick"} if quick else _boot(True),
    }
