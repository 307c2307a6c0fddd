"""The CXL Type-3 device: HDM decoders, media, poison, migrations and the firmware, composed.

Data path.  A host physical address (HPA) goes through the HDM decoders to a
device physical address (DPA); DPA page ``p`` (``page_bytes`` each) lives in
exactly one tier, device DRAM or NVMe, and reads and writes go to that tier.
Correctness never depends on placement: whatever the firmware moved, a read
returns the bytes last written (the LOSSLESS constraint, checked by the soak).

The device is its parts, each a module a reader can hold:

* :mod:`~kvcxl.emu.device.tiers` — the media: the two tiers' stores, the tier map, the
  page-state table a patched QEMU shares, the timing queues;
* :mod:`~kvcxl.emu.device.migration` — pages moving between the tiers, at once or in
  steps a reset may interrupt;
* :mod:`~kvcxl.emu.device.poison` — the poison list, one list with a source per line;
* :mod:`~kvcxl.emu.device.front` — the firmware front: describe, report, create, end
  step, and the moves the firmware's decisions make.  DRAM residency is exactly the
  policy cache's residency: a reported entry not in DRAM is a miss the firmware admits
  (NVMe → DRAM); when DRAM is over its page budget the policy's victims are demoted.

This module keeps what spans them: the HPA and CXL.mem data path, the firmware reset,
the statistics.  CXL.mem reads do not change placement (they are served from wherever
the page is, with that tier's timing); only the firmware's decisions move data.  With
``dram_pages=None`` the DRAM holds every page and nothing migrates (the layout to
use when QEMU shares the DRAM file as its media).

Errors.  Nothing here raises on host input: an access no decoder maps is
answered MemData-NXM (reads, poisoned) or Cmp with the data dropped (writes,
counted as ``unmapped_writes``); bad mailbox input is answered by return codes
(see :mod:`kvcxl.emu.device.cci`): the checks on a host's request raise
:class:`RequestError`, which the mailbox and the ring answer Invalid Input; any other
exception from here is a bug, answered Internal Error and counted (``internal_errors``).
Constructor arguments are validated with a ValueError naming the bad value.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import NamedTuple

from numpy.typing import NDArray

from kvcxl.cxl import mem
from kvcxl.cxl.hdm import HdmDecoderSet
from kvcxl.firmware.audit import EvictionAudit
from kvcxl.firmware.cache import PolicyCache
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.policies.base import Policy
from kvcxl.firmware.session import Decisions
from kvcxl.firmware.table import EntryTable

from ..timing import CXL_DRAM, NVME, TierParams
from .errors import RequestError
from .front import MAX_CONTEXTS, MAX_INDEX_CELLS, FirmwareFront, index_extents
from .media import zeros
from .migration import Migration, Migrations
from .poison import SOURCE_INJECTED, PoisonList
from .tiers import Media
from .timing import percentiles

__all__ = [
    "MAX_CONTEXTS", "MAX_INDEX_CELLS", "Migration", "ReadResult", "RequestError",
    "Type3Device", "index_extents",
]  # fmt: skip

LINE = mem.LINE_BYTES
COUNTERS = (
    "reads", "writes", "read_bytes", "write_bytes", "mem_requests", "spec_reads",
    "invalidates", "unmapped_reads", "unmapped_writes", "poisoned_reads",
    "migrations_to_dram", "migrations_to_nvme", "bytes_migrated", "nvme_accesses",
    "nvme_fills", "reports", "reported_entries", "media_errors", "internal_errors",
    "resets", "migrations_rolled_back", "demotions_deferred", "unmaps_awaited",
    "alias_checks", "alias_violations",
)  # fmt: skip


class ReadResult(NamedTuple):
    data: bytes
    poisoned: bool  # some byte lies in a poisoned line
    unmapped: bool  # some byte is not mapped to this device (read as zeros)
    latency_ns: float


def _of(part: str, name: str, doc: str = "") -> property:
    """One part's attribute under the device's name (the name its callers use)."""
    return property(
        lambda self: getattr(getattr(self, part), name),
        lambda self, value: setattr(getattr(self, part), name, value),
        doc=doc,
    )


class Type3Device:
    """One emulated memory expander."""

    def __init__(
        self,
        capacity: int = 1 << 30,
        *,
        page_bytes: int = 4096,
        dram_pages: int | None = None,
        policy: str = "ema",
        config: PolicyConfig | None = None,
        mode: str = "float",
        dram_file: str | Path | None = None,
        nvme_file: str | Path | None = None,
        tier_map_file: str | Path | None = None,
        dram_timing: TierParams = CXL_DRAM,
        nvme_timing: TierParams = NVME,
        decoders: int = 4,
        audit: bool = True,
        record_victims: bool = False,
        interval_ns: float | None = None,
        serial: int = 0x4B56_4358_4C00_0001,
        entries: str = "pages",
        block_tokens: int = 16,
        page_state: str | Path | None = None,
        fill_on_access: bool = False,
    ) -> None:
        # The geometry is a host's request too (the ring's OPEN asks for it): RequestError.
        if page_bytes < LINE or page_bytes & (page_bytes - 1) or page_bytes > 1 << 21:
            raise RequestError(
                f"page_bytes = {page_bytes} must be a power of two between 64 and 2 MiB"
            )
        self.hdm = HdmDecoderSet(capacity, decoders)  # validates capacity
        self.capacity = capacity
        self.page_bytes = page_bytes
        self.page_shift = page_bytes.bit_length() - 1
        self.n_pages = capacity // page_bytes
        if dram_pages is not None and not 0 < dram_pages:
            raise RequestError(f"dram_pages = {dram_pages} must be > 0 (or None: all pages)")
        self.tiering = dram_pages is not None and dram_pages < self.n_pages
        self.dram_pages = dram_pages if self.tiering else self.n_pages
        if policy not in POLICIES or not POLICIES[policy].online:
            online = sorted(n for n, c in POLICIES.items() if c.online)
            raise ValueError(f"policy = {policy!r} is not an online policy; choose from {online}")
        if entries not in ("pages", "host"):
            raise ValueError(f"entries = {entries!r} must be 'pages' or 'host'")
        if mode not in ("float", "int"):
            raise ValueError(f"mode = {mode!r} must be 'float' or 'int'")
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.poison = PoisonList()
        self.media = Media(
            capacity, page_bytes, tiering=self.tiering, poison=self.poison,
            dram_file=dram_file, nvme_file=nvme_file, tier_map_file=tier_map_file,
            page_state=page_state, dram_timing=dram_timing, nvme_timing=nvme_timing,
        )  # fmt: skip
        self.migrations = Migrations(self.media, self.counters, lambda: self.clock_ns)
        self.front = FirmwareFront(
            policy=policy, config=config or PolicyConfig(), mode=mode, entries=entries,
            n_pages=self.n_pages, dram_pages=self.dram_pages, tiering=self.tiering,
            block_tokens=block_tokens, audit=audit, record_victims=record_victims,
            migrations=self.migrations, poison=self.poison, counters=self.counters,
        )  # fmt: skip
        # What Get Health Info reports beside the counted errors: set by the host side (a
        # BMC's view: `kvcxl device serve --health life_used=7`), Spec Table 8-100 fields.
        self.health = {"health_status": 0, "media_status": 0, "life_used": 0,
                       "temperature": 0xFFFF, "dirty_shutdowns": 0}  # fmt: skip
        # A host access to a page on NVMe brings it into DRAM first (what a device whose
        # DRAM caches its NVMe does; a patched QEMU then goes direct again).  Off: host
        # accesses never move data, only the firmware's decisions do.
        self.fill_on_access = fill_on_access
        self._qd, self._qn = self.media.queues["dram"], self.media.queues["nvme"]
        self.latencies = array("d")
        self.clock_ns = 0.0
        self.interval_ns = interval_ns
        self.serial = serial
        self.timestamp_offset_ns: int | None = None  # host time − device clock, once set
        # Media from an earlier run (a tier map file found): where each page is comes back;
        # the policy's metadata does not (it is rebuilt empty), so the tiers are realigned.
        self.restart = None
        if self.media.tier_map.restored:
            self.restart = {
                "tier_map": "restored",
                "pages_moved": self.migrations.realign(self.tiering),
                "policy_metadata": "rebuilt: empty, as on a new device (scores start again)",
            }

    # --- the parts' state, under the names callers use --------------------------------------
    dram = _of("media", "dram")
    nvme = _of("media", "nvme")
    tier_map = _of("media", "tier_map")
    in_dram = _of("media", "in_dram", "1 = the page's bytes live in DRAM (the tier map)")
    page_state = _of("media", "page_state")
    trapped = _of("media", "trapped")
    queues = _of("media", "queues")
    host_accesses = _of("media", "host_accesses")
    inflight = _of("migrations", "inflight", "page → its migration in progress")
    leaving = _of("migrations", "leaving", "pages placed on NVMe waiting for QEMU to unmap")
    sample_rate = _of("front", "sample_rate", "open_kv's pages sampled per step (0: off)")
    sampler = _of("front", "sampler")
    fw = _of("front", "fw", "the firmware session (replaced by open_kv)")
    victims = _of("front", "victims", "(time, entry, priority) of each victim, when recording")
    kv = _of("front", "kv")
    kv_placed = _of("front", "kv_placed")
    kv_traffic = _of("front", "kv_traffic")
    n_entries = _of("front", "n_entries")
    entries = _of("front", "entries")
    policy_name = _of("front", "policy_name")
    config = _of("front", "config")
    mode = _of("front", "mode")
    record_victims = _of("front", "record_victims")

    @property
    def table(self) -> EntryTable:
        return self.front.fw.table

    @property
    def cache(self) -> PolicyCache:
        return self.front.fw.cache

    @property
    def policy(self) -> Policy:
        return self.front.fw.policy

    @property
    def audit(self) -> EvictionAudit | None:
        return self.front.fw.audit

    @property
    def time(self) -> int:
        return self.front.fw.time

    # --- the firmware (the front's calls) ---------------------------------------------------
    def reset(self) -> dict:
        """The firmware restarts (the mailbox's Reset Firmware): a migration in progress is
        completed when its new tier is recorded and rolled back when not; the firmware's
        volatile state (policy metadata, entry identities, context lengths, victim log,
        timestamp) starts again as on a new device and the pages move to where a new
        device keeps them.  Kept: every byte, the tier map, poison, HDM decoders, traps,
        policy parameters and the statistics."""
        completed, rolled_back = self.migrations.settle_all()
        self.timestamp_offset_ns = None
        self.front.restart()
        moved = self.migrations.realign(self.tiering)
        self.counters["resets"] += 1
        return {
            "migrations_completed": completed,
            "migrations_rolled_back": rolled_back,
            "pages_moved": moved,
        }

    def set_health(self, spec: str) -> None:
        """``FIELD=VALUE``: what Get Health Info reports for FIELD (a BMC's setting);
        a ValueError naming the spec and what is accepted otherwise."""
        key, _, value = spec.partition("=")
        limit = 0xFFFF if key == "temperature" else 0xFFFFFFFF if key == "dirty_shutdowns" else 0xFF
        if key not in self.health or not value.isdigit() or int(value) > limit:
            raise ValueError(
                f"--health {spec!r}: expected FIELD=VALUE with FIELD one of "
                f"{', '.join(self.health)} and VALUE an integer in [0, {limit}]"
            )
        self.health[key] = int(value)

    def set_config(self, config: PolicyConfig) -> None:
        """Apply new policy parameters, keeping every entry's metadata and residency."""
        self.front.set_config(config)

    def report(self, step: int, ids: NDArray, weights: NDArray) -> NDArray:
        """Ingest one attention batch; returns the hit mask (entry in DRAM at batch start).

        Raises RequestError for ids outside the device or weights outside [0, 1].
        """
        return self.report_decisions(step, ids, weights)[0]

    def report_decisions(
        self, step: int, ids: NDArray, weights: NDArray
    ) -> tuple[NDArray, Decisions]:
        """:meth:`report`, also returning the decisions the device acted on: what a host
        that asks for them (the QEMU ring) is answered (:meth:`FirmwareFront.report_decisions`)."""
        return self.front.report_decisions(step, ids, weights)

    def describe(
        self, ids: NDArray, ctx: NDArray, layer: NDArray, head: NDArray, block: NDArray,
        *, step: int | None = None,
    ) -> None:  # fmt: skip
        """Give entries their identity (:meth:`FirmwareFront.describe`)."""
        self.front.describe(ids, ctx, layer, head, block, step=step)

    def set_context_tokens(self, ctx: NDArray, tokens: NDArray, *, step: int | None = None) -> None:
        """Contexts are now this long in tokens (:meth:`FirmwareFront.set_context_tokens`)."""
        self.front.set_context_tokens(ctx, tokens, step=step)

    def create(self, step: int, ids: NDArray) -> int:
        """New entries written by the host: admit them to DRAM without a read (evicting
        the overflow), like the simulator's CREATE event.  Returns how many were admitted."""
        return int(self.create_decisions(step, ids).admitted.size)

    def create_decisions(self, step: int, ids: NDArray) -> Decisions:
        """:meth:`create`, returning the decisions the device acted on (entries admitted,
        victims with their tiers and priorities)."""
        return self.front.create_decisions(step, ids)

    def end_step(self, step: int) -> None:
        """The host closed ``step`` (the policy's step-boundary update)."""
        self.front.end_step(step)

    def prefetch_candidates(self, ids: NDArray, weights: NDArray, limit: int) -> NDArray:
        """Entries the firmware would fetch next (:meth:`FirmwareFront.prefetch_candidates`)."""
        return self.front.prefetch_candidates(ids, weights, limit)

    def open_kv(
        self, n_entries: int, entry_bytes: int, capacity: int, block_tokens: int, base: int,
        *, policy: str | None = None, config: PolicyConfig | None = None, mode: str | None = None,
    ) -> None:  # fmt: skip
        """A host's KV cache in this device's memory (:meth:`FirmwareFront.open_kv`)."""
        self.front.open_kv(
            n_entries, entry_bytes, capacity, block_tokens, base,
            policy=policy, config=config, mode=mode,
        )  # fmt: skip

    def check_placement(self) -> bool:
        """Invariant: pages in DRAM are exactly the policy cache's resident entries."""
        return self.front.check_placement()

    # --- pages: placement, traps, migrations (the media's and the migrations' calls) -------
    def move_page(self, p: int, to_dram: bool) -> None:
        """Page ``p`` to DRAM or to NVMe at once (:meth:`Migrations.move_page`)."""
        self.migrations.move_page(p, to_dram)

    def start_migration(self, p: int, to_dram: bool) -> bool:
        """Begin moving page ``p`` in steps (:meth:`Migrations.start`)."""
        return self.migrations.start(p, to_dram)

    def step_migration(self, p: int) -> bool:
        """The next step of page ``p``'s migration (:meth:`Migrations.step`)."""
        return self.migrations.step(p)

    def pages_of(self, dpa: int, n: int) -> range:
        """The DPA pages of ``[dpa, dpa + n)``; a RequestError if it is not inside the device."""
        return self.media.pages_of(dpa, n)

    def trap(self, dpa: int, n: int) -> None:
        """Every access to the pages of ``[dpa, dpa + n)`` comes to the device, even from
        a patched QEMU that could complete it against the shared DRAM file."""
        self.media.trap(self.media.pages_of(dpa, n))

    # --- DPA access -------------------------------------------------------------------
    def _arrival(self, at: float | None) -> float:
        return self.clock_ns if at is None else float(at)

    def _advance(self, t: float, done: float) -> None:
        self.latencies.append(done - t)
        self.clock_ns = done if self.interval_ns is None else t + self.interval_ns

    def _dpa_read(self, dpa: int, n: int, t: float) -> tuple[bytes, float]:
        shift, pb, in_dram = self.page_shift, self.page_bytes, self.media.in_dram
        p = dpa >> shift
        off = dpa & (pb - 1)
        if off + n <= pb:  # the common case: inside one page
            ready = t
            if not in_dram[p] and self.fill_on_access:
                ready = self.migrations.fill(p, t)
            if in_dram[p]:
                return self.media.dram.read(p, off, n), self._qd.serve(ready, n)
            self.counters["nvme_accesses"] += 1
            return self.media.nvme.read(p, off, n), self._qn.serve(t, n)
        out = []
        done = t
        while n > 0:
            p = dpa >> shift
            off = dpa & (pb - 1)
            m = min(n, pb - off)
            ready = t
            if not in_dram[p] and self.fill_on_access:
                ready = self.migrations.fill(p, t)
            if in_dram[p]:
                out.append(self.media.dram.read(p, off, m))
                d = self._qd.serve(ready, m)
            else:
                self.counters["nvme_accesses"] += 1
                out.append(self.media.nvme.read(p, off, m))
                d = self._qn.serve(t, m)
            if d > done:
                done = d
            dpa += m
            n -= m
        return b"".join(out), done

    def _dpa_write(self, dpa: int, data: bytes | memoryview, t: float) -> float:
        done = t
        shift, pb, in_dram = self.page_shift, self.page_bytes, self.media.in_dram
        i = 0
        n = len(data)
        while i < n:
            p = dpa >> shift
            off = dpa & (pb - 1)
            m = min(n - i, pb - off)
            ready = t
            if not in_dram[p] and self.fill_on_access:
                ready = self.migrations.fill(p, t)
            if in_dram[p]:
                self.media.dram.write(p, off, data[i : i + m])
                d = self._qd.serve(ready, m)
            else:
                self.counters["nvme_accesses"] += 1
                self.media.nvme.write(p, off, data[i : i + m])
                d = self._qn.serve(t, m)
            if self.migrations.inflight:
                self.migrations.mirror(p, off, data[i : i + m])
            if d > done:
                done = d
            dpa += m
            i += m
        return done

    def _update_poison(self, dpa: int, n: int, poison: bool) -> None:
        """A host's write of ``[dpa, dpa + n)``: with the poison bit its lines are poisoned
        (external); without, a write covering a whole line replaces its content and the
        line's poison is gone."""
        first, last = self.poison.lines_of(dpa, n)
        if poison:
            for p in range((first << 6) >> self.page_shift, ((last << 6) >> self.page_shift) + 1):
                self.media.trap_page(p)  # QEMU must see the poison: trap first
            self.poison.add(first, last)
        elif self.poison:
            lo = first if dpa & 63 == 0 else first + 1
            hi = last if (dpa + n) & 63 == 0 else last - 1
            for line in range(lo, hi + 1):
                self.poison.discard(line)
            for p in range(dpa >> self.page_shift, ((dpa + n - 1) >> self.page_shift) + 1):
                self.media.maybe_direct(p)

    # --- HPA byte ranges (the host's view; used by the service, soak and QEMU bridge) ---
    def read(self, hpa: int, n: int, at: float | None = None) -> ReadResult:
        """Read ``n`` bytes at ``hpa`` through the decoders."""
        t = self._arrival(at)
        parts = []
        done = t
        poisoned = unmapped = False
        if n < 0 or hpa < 0 or hpa + n > mem.HPA_LIMIT:
            raise RequestError(f"read of {n} bytes at {hpa:#x} is outside the 52-bit HPA space")
        for _h, dpa, k in self.hdm.chunks(hpa, n):
            if dpa is None:
                parts.append(zeros(k))
                unmapped = True
                continue
            data, d = self._dpa_read(dpa, k, t)
            parts.append(data)
            if d > done:
                done = d
            if self.poison and not poisoned:
                poisoned = self.poison.any_in(*self.poison.lines_of(dpa, k))
        c = self.counters
        c["reads"] += 1
        c["read_bytes"] += n
        c["unmapped_reads"] += unmapped
        c["poisoned_reads"] += poisoned
        self._advance(t, done)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return ReadResult(data, poisoned, unmapped, done - t)

    def write(
        self, hpa: int, data: bytes | memoryview, poison: bool = False, at: float | None = None
    ) -> bool:
        """Write ``data`` at ``hpa``; returns False when some byte was not mapped (dropped)."""
        t = self._arrival(at)
        done = t
        n = len(data)
        if hpa < 0 or hpa + n > mem.HPA_LIMIT:
            raise RequestError(f"write of {n} bytes at {hpa:#x} is outside the 52-bit HPA space")
        view = memoryview(data)
        mapped = True
        for h, dpa, k in self.hdm.chunks(hpa, n):
            if dpa is None:
                mapped = False
                continue
            i = h - hpa
            done = max(done, self._dpa_write(dpa, view[i : i + k], t))
            self._update_poison(dpa, k, poison)
        c = self.counters
        c["writes"] += 1
        c["write_bytes"] += n
        c["unmapped_writes"] += not mapped
        self._advance(t, done)
        return mapped

    # --- CXL.mem ----------------------------------------------------------------------
    def handle(self, msg: mem.Message, at: float | None = None) -> mem.Message | None:
        """Serve one M2S message; returns the S2M response (None for MemSpecRd).

        ``msg`` must be a validated M2S message (as :func:`mem.decode` returns);
        an S2M message is a host error and raises RequestError.
        """
        if isinstance(msg, mem.M2SReq):
            op = msg.opcode
            if op in (mem.M2SReqOpcode.MEM_INV, mem.M2SReqOpcode.MEM_SPEC_RD):
                self.counters["mem_requests"] += 1  # read_line / write_line count the rest
            if op == mem.M2SReqOpcode.MEM_INV:
                # Host-only coherent memory keeps no device-side copy to invalidate.
                self.counters["invalidates"] += 1
                return mem.S2MNDR(mem.S2MNDROpcode.CMP, msg.tag, ld_id=msg.ld_id)
            if op == mem.M2SReqOpcode.MEM_SPEC_RD:
                # A speculative read is a hint: no completion is returned for it.
                self.counters["spec_reads"] += 1
                return None
            data, status = self.read_line(msg.addr, at)
            op = mem.S2MDRSOpcode.MEM_DATA_NXM if status == 2 else mem.S2MDRSOpcode.MEM_DATA
            return mem.S2MDRS(op, msg.tag, data, poison=int(status > 0), ld_id=msg.ld_id)
        if isinstance(msg, mem.M2SRwD):
            self.write_line(msg.addr, msg.data, msg.byte_enable, bool(msg.poison), at)
            return mem.S2MNDR(mem.S2MNDROpcode.CMP, msg.tag, ld_id=msg.ld_id)
        self.counters["mem_requests"] += 1
        raise RequestError(f"{type(msg).__name__} is a device-to-host message, not a request")

    def read_line(self, addr: int, at: float | None = None) -> tuple[bytes, int]:
        """MemRd of the line at CXL.mem address ``addr`` (HPA >> 6): its 64 bytes and
        0 (data), 1 (poisoned) or 2 (no decoder maps it: zeros).  The request counts as
        one CXL.mem request; :meth:`handle` and the shared request ring both end here."""
        self.counters["mem_requests"] += 1
        dpa = self.hdm.translate(addr << 6)
        t = self._arrival(at)
        if dpa is None:
            self.counters["unmapped_reads"] += 1
            self._advance(t, t)
            return zeros(LINE), 2
        self._host_access(dpa >> self.page_shift)
        data, done = self._dpa_read(dpa, LINE, t)
        poisoned = (dpa >> 6) in self.poison
        c = self.counters
        c["reads"] += 1
        c["read_bytes"] += LINE
        c["poisoned_reads"] += poisoned
        self._advance(t, done)
        return data, int(poisoned)

    def write_line(
        self, addr: int, data: bytes, byte_enable: int, poison: bool = False,
        at: float | None = None,
    ) -> None:  # fmt: skip
        """MemWr (all bytes enabled) or MemWrPtl of the line at CXL.mem address ``addr``:
        the bytes of ``data`` under ``byte_enable`` land (``data`` is the whole line)."""
        self.counters["mem_requests"] += 1
        dpa = self.hdm.translate(addr << 6)
        t = self._arrival(at)
        if dpa is None:
            self.counters["unmapped_writes"] += 1
            self._advance(t, t)
            return
        self._host_access(dpa >> self.page_shift)
        be = byte_enable
        if be == mem.ALL_BYTES:
            done = self._dpa_write(dpa, data, t)
            self._update_poison(dpa, LINE, poison)
        else:
            old, _ = self._dpa_read(dpa, LINE, t)
            lo = (be & -be).bit_length() - 1
            n = be.bit_count()
            if n and be == ((1 << n) - 1) << lo:  # one run of bytes (every access QEMU sends)
                line = old[:lo] + bytes(data[lo : lo + n]) + old[lo + n :]
            else:
                buf = bytearray(old)
                for i in range(LINE):
                    if be >> i & 1:
                        buf[i] = data[i]
                line = bytes(buf)
            done = self._dpa_write(dpa, line, t)
            if poison:
                self.poison.add(dpa >> 6, dpa >> 6)
        self.counters["writes"] += 1
        self.counters["write_bytes"] += be.bit_count()
        self._advance(t, done)

    # --- poison (the mailbox's Inject / Clear Poison) ---------------------------------------
    def inject_poison(self, dpa: int) -> None:
        """The line at ``dpa`` is poisoned, its source the mailbox's injection."""
        self.media.trap_page(dpa >> self.page_shift)
        self.poison.add(dpa >> 6, dpa >> 6, SOURCE_INJECTED)

    def clear_poison(self, dpa: int, data: bytes) -> None:
        """The line at ``dpa`` holds ``data`` and is no longer poisoned."""
        self._dpa_write(dpa, data, self.clock_ns)
        self.poison.discard(dpa >> 6)
        self.media.maybe_direct(dpa >> self.page_shift)

    # --- statistics -------------------------------------------------------------------
    def _host_access(self, p: int) -> None:
        """A CXL.mem request to page ``p``: counted; a sampled page's first touch makes
        it DIRECT again."""
        self.media.host_accesses[p] += 1
        sampler = self.front.sampler
        if sampler is not None and sampler.touched(p):
            self.media.maybe_direct(p)

    def unmap(self, p: int) -> bool:
        """Page ``p`` trapped; True once QEMU no longer maps it as guest RAM
        (:meth:`Migrations.unmap`)."""
        return self.migrations.unmap(p)

    def settle_leaving(self) -> int:
        """The deferred demotions QEMU has unmapped, moved (:meth:`Migrations.settle_leaving`)."""
        return self.migrations.settle_leaving()

    def check_alias(self) -> int:
        """Mapped pages outside DRAM, counted (:meth:`Migrations.check_alias`)."""
        return self.migrations.check_alias()

    def stats(self) -> dict:
        m = self.media
        return {
            "capacity_bytes": self.capacity,
            "page_bytes": self.page_bytes,
            "dram_pages": self.dram_pages,
            "tiering": self.tiering,
            "policy": self.policy_name,
            "counters": dict(self.counters),
            "pages_in_dram": len(m.dram),
            "pages_in_nvme": len(m.nvme),
            "media": {**m.kinds(), "restart": self.restart},
            "poisoned_lines": len(self.poison),
            # accesses a patched QEMU completed directly against the shared DRAM file
            "direct_accesses": m.page_state.direct_accesses() if m.page_state else 0,
            # DIRECT pages QEMU maps into the guest as RAM (their accesses are not counted)
            "alias": m.page_state.alias_stats() if m.page_state else None,
            "kv_traffic": self.kv_traffic.stats() if self.kv_traffic is not None else None,
            "cache": self.cache.stats.as_dict(),
            "audit": self.audit.as_dict() if self.audit else {},
            "tiers": {k: q.summary() for k, q in self.queues.items()},
            "requests": percentiles(self.latencies),
            "clock_ns": round(self.clock_ns, 1),
            "evidence": "Simulated (timing from the Analytical tier model)",
        }

    def close(self) -> None:
        self.media.close()
