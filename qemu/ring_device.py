"""The kvcxl device of the virtual host (patched QEMU): one process, one device.

The memory-path device that a patched QEMU's ``cxl-type3`` reaches over its socket
(the device of ``kvcxl device serve``: DRAM tier = the media file, the page-state
table shared with QEMU) also answers the command ring that lives in its memory: the
ring's firmware session is that device's (:meth:`Type3Device.open_kv`), and each
victim's pages move, in that device, to the tier placement chose.

No polling.  The ring's doorbell line is a trapped page, so the guest's doorbell
store reaches the device as a CXL.mem write; the device serves every command the
guest submitted before it completes that write, so the guest's next read of the
completion queue finds the answer.  A thread only bumps the heartbeat (and drains
the TCG plugin's stream); if a submission stays unserved for
``MISSED_DOORBELL_S`` (its doorbell never arrived), the ring's status becomes FAULT,
which the guest reports instead of waiting forever.

CXL.mem requests reach the device over its socket, or — with ``--mem-ring FILE``, which
the device creates and QEMU's ``kvcxl-ring=FILE`` names — through a request ring in
shared memory (:mod:`kvcxl.qemu.memring`); the socket then carries the mailbox only.

Run as ``python -m kvcxl.qemu.ring_device --socket S --media FILE --page-state FILE
--out STATS.json [--mem-ring FILE]``; SIGTERM stops it and writes the ring's statistics.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from kvcxl.common.sizes import dpa_range
from kvcxl.cxl import ring as L
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.service import Churn, Engine, Server
from kvcxl.firmware.config import PolicyConfig

from . import memring
from .service import HEARTBEAT_S, FirmwareService, _jsonable

MISSED_DOORBELL_S = 1.0  # a submission unserved this long: its doorbell never came


def build(
    media: str | Path,
    page_state: str | Path,
    *,
    policy: str = "ema",
    config: PolicyConfig | None = None,
    mode: str = "float",
    plugin_ring: str | Path | None = None,
    trap: tuple[tuple[int, int], ...] = (),
    health: tuple[str, ...] = (),
    sample_rate: float = 0.0,
) -> tuple[Engine, FirmwareService]:
    """The device over ``media`` (decoder 0 the identity: QEMU decodes HPA → DPA; a guest
    access to a page on NVMe brings it into DRAM), and the ring it answers on its
    doorbell.  ValueError for a bad trap range or health value."""
    dev = Type3Device(
        os.path.getsize(media), dram_file=media, page_state=page_state, policy=policy,
        config=config, mode=mode, fill_on_access=True,
    )  # fmt: skip
    try:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"--sample-rate {sample_rate} must be in [0, 1]")
        dev.sample_rate = sample_rate  # the KV cache's pages sampled per step (0: off)
        for spec in health:
            dev.set_health(spec)
        for dpa, n in trap:
            dev.trap(dpa, n)
        dev.hdm.program(0, base=0, size=dev.capacity)
        dev.hdm.commit(0)
        ring = FirmwareService(
            media, policy=policy, config=config, mode=mode, plugin_ring=plugin_ring,
            memory_device=dev,
        )  # fmt: skip
    except Exception:
        dev.close()
        raise
    engine = Engine(dev)
    engine.doorbell(L.RING_BASE + L.HOST_HDR, ring.doorbell)
    return engine, ring


class Heartbeat(threading.Thread):
    """Bumps the ring's heartbeat, drains the plugin's stream and turns a submission
    left unserved (a doorbell that never arrived) into status FAULT."""

    def __init__(self, engine: Engine, ring: FirmwareService) -> None:
        super().__init__(daemon=True, name="kvcxl-heartbeat")
        self.engine, self.ring = engine, ring
        self.halt = threading.Event()

    def run(self) -> None:
        since: float | None = None
        ring = self.ring
        while not self.halt.wait(HEARTBEAT_S):
            ring.beat()
            if not self._pending():
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since > MISSED_DOORBELL_S:
                with self.engine.lock:  # a doorbell being served holds it: look again
                    if self._pending():
                        ring.fault(f"submission {ring.sq_head} unserved: no doorbell came")
            if ring.plugin_path is not None:
                with self.engine.lock:
                    ring.drain_plugin()
            dev = self.engine.device
            if dev.page_state is not None and dev.page_state.aliasing:
                with self.engine.lock:
                    dev.settle_leaving()  # victims waiting for QEMU to unmap their pages
                    dev.check_alias()  # every page QEMU maps is in DRAM

    def _pending(self) -> bool:
        ring = self.ring
        tail, _ = L.HOST_HDR_FMT.unpack_from(ring.mm, L.RING_BASE + L.HOST_HDR)
        return tail != ring.sq_head & 0xFFFFFFFF and ring.status != L.DEV_FAULT


def area_traffic(dev: Type3Device) -> dict[str, dict]:
    """Per area of the device's memory (:func:`kvcxl.cxl.ring.areas`): the CXL.mem
    requests the device served there (trapped accesses), the accesses QEMU completed
    directly against the DRAM file (its per-page counts), and the pages QEMU maps as guest
    RAM (``--alias``; accesses through such a mapping reach neither count)."""
    ps = dev.media.page_state
    out: dict[str, dict] = {}
    for name, (dpa, n) in L.areas(dev.capacity).items():
        pages = dev.pages_of(dpa, n)
        span = slice(pages.start, pages.stop)
        out[name] = {
            "dpa": hex(dpa),
            "bytes": n,
            "pages": len(pages),
            "trapped_requests": int(dev.media.host_accesses[span].sum(dtype="u8")),
            "direct_accesses": None if ps is None else int(ps.count[span].sum(dtype="u8")),
            "pages_mapped": None if ps is None else int(ps.mapped[span].sum(dtype="u8")),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcxl.qemu.ring_device", description=__doc__)
    ap.add_argument("--socket", required=True, help="the Unix socket QEMU's kvcxl= names")
    ap.add_argument("--media", required=True, help="the device's DRAM file (QEMU's memdev)")
    ap.add_argument("--page-state", required=True, help="the table QEMU's kvcxl-state= names")
    ap.add_argument("--out", required=True, help="write the ring's statistics JSON here on exit")
    ap.add_argument("--policy", default="ema")
    ap.add_argument("--config", help="policy configuration TOML")
    ap.add_argument("--mode", choices=("float", "int"), default="float")
    ap.add_argument("--plugin-ring", help="shared-memory file the TCG plugin writes")
    ap.add_argument("--trap", action="append", default=[], type=dpa_range, metavar="DPA:LENGTH")
    ap.add_argument("--churn", action="append", default=[], type=dpa_range, metavar="DPA:LENGTH")
    ap.add_argument("--health", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument(
        "--sample-rate", type=float, default=0.0,
        help="share of the KV cache's DIRECT pages trapped each step to learn its reads "
        "when QEMU maps them as guest RAM (0: off)",
    )  # fmt: skip
    ap.add_argument(
        "--mem-ring", metavar="FILE",
        help="create this shared request ring and serve QEMU's CXL.mem requests there "
        "(QEMU's kvcxl-ring=FILE); without it they come over the socket",
    )  # fmt: skip
    args = ap.parse_args(argv)

    cfg = PolicyConfig.load(args.config) if args.config else PolicyConfig()
    engine, ring = build(
        args.media, args.page_state, policy=args.policy, config=cfg, mode=args.mode,
        plugin_ring=args.plugin_ring, trap=tuple(args.trap), health=tuple(args.health),
        sample_rate=args.sample_rate,
    )  # fmt: skip
    dev = engine.device
    churn = [p for dpa, n in args.churn for p in dev.pages_of(dpa, n)]

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # before the socket exists: a client may stop us
    mr = None
    if args.mem_ring:  # before the socket exists: QEMU maps the ring once it connects
        memring.create(args.mem_ring)
        mr = memring.MemRingServer(engine, args.mem_ring)
        mr.start()
    server = Server(args.socket, engine)
    beat = Heartbeat(engine, ring)
    beat.start()
    if churn:
        Churn(engine, churn).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        beat.halt.set()
        server.server_close()
        if mr is not None:
            mr.stop()
        with engine.lock:
            ring.stop()
            if ring.plugin_path is not None:
                ring.drain_plugin()
            stats = ring.stats()
            stats["doorbell_writes"] = engine.rung
            stats["areas"] = area_traffic(dev)
            stats["mem_link"] = "socket" if mr is None else {"ring": mr.stats()}
            dev.close()
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f, default=_jsonable)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
