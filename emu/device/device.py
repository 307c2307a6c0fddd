"""The CXL Type-3 device: HDM decoders, two media tiers, poison, timing and the firmware.

Data path.  A host physical address (HPA) goes through the HDM decoders to a
device physical address (DPA); DPA page ``p`` (``page_bytes`` each) lives in
exactly one tier, device DRAM or NVMe, and reads and writes go to that tier.
Correctness never depends on placement: whatever the firmware moved, a read
returns the bytes last written (the LOSSLESS constraint, checked by the soak).

Firmware.  Each DPA page is one policy entry (entry id = page number); with
``entries="pages"`` every page is an entry from the start (replay's view), with
``entries="host"`` entries appear as the host describes, creates or reports them
(the simulator's view; see the vendor mailbox commands).  The host
reports attention batches through the vendor mailbox command (Attention Report);
each report is one batch of :meth:`kvcxl.firmware.cache.PolicyCache.access` —
the same call, with the same step/time ticks, that
:func:`kvcxl.firmware.replay.replay` makes — so DRAM residency is exactly the
policy cache's residency:

* a reported entry not in DRAM is a miss; the firmware admits it (NVMe → DRAM);
* when DRAM is over its page budget the policy picks victims, which are
  demoted (DRAM → NVMe), bytes and all.

CXL.mem reads do not change placement (they are served from wherever the page
is, with that tier's timing); only the firmware's decisions move data.  With
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
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from kvcxl.emu.cxl.hdm import HdmDecoderSet
from kvcxl.firmware.audit import EvictionAudit
from kvcxl.firmware.cache import PolicyCache
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.cxl import mailbox, mem
from kvcxl.firmware.formulas import TIER_CXL, TIER_NVME
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.policies.base import Policy
from kvcxl.firmware.session import Decisions, FirmwareSession
from kvcxl.firmware.table import EntryTable

from ..timing import CXL_DRAM, NVME, TierParams
from .kvtraffic import KvTraffic
from .media import DictStore, FileStore, MmapStore, TierMap, zeros
from .pagestate import DIRECT, PageState
from .sampling import PageSampler
from .timing import TierQueue, percentiles

LINE = mem.LINE_BYTES
_NO_ANCHOR_BLOCK = 1 << 20  # default entry row: far from any anchor zone (as replay does)
MAX_CONTEXTS = 1 << 20  # context ids the host may use (bounds the per-context arrays)
# The firmware's prefetch index is dense per context over layers × KV heads × blocks: the
# cells the host's ids make it span, summed over contexts, are bounded (8 M cells: a
# 64 MiB index; the largest 128 K-token context of scenario S1 spans 5.2 M).
MAX_INDEX_CELLS = 1 << 23


def index_extents(
    extents: dict[int, tuple[int, int, int]],
    total: int,
    ctx: NDArray,
    layer: NDArray,
    head: NDArray,
    block: NDArray,
) -> tuple[dict[int, tuple[int, int, int]], int]:
    """The contexts whose (layers, heads, blocks) extent these entries grow, with their new
    extents, and the cells every context's index spans afterwards."""
    grown: dict[int, tuple[int, int, int]] = {}
    if np.size(ctx) == 0:
        return grown, total
    for c in np.unique(ctx).tolist():
        m = ctx == c
        old = extents.get(c, (0, 0, 0))
        new = (
            max(old[0], int(layer[m].max()) + 1),
            max(old[1], int(head[m].max()) + 1),
            max(old[2], int(block[m].max()) + 1),
        )
        if new != old:
            grown[c] = new
            total += new[0] * new[1] * new[2] - old[0] * old[1] * old[2]
    return grown, total


class RequestError(ValueError):
    """A host's request the device refuses (an id, weight, length or range out of bounds):
    the protocol's Invalid Input.  Only this is answered so; a plain ValueError from the
    device is a bug and is counted as one."""


@dataclass
class Migration:
    """A migration the host can see in progress (the stepwise ones: `--churn`)."""

    to_dram: bool
    recorded: bool = False  # the tier map names the new tier (the copy is then the page)


class ReadResult(NamedTuple):
    data: bytes
    poisoned: bool  # some byte lies in a poisoned line
    unmapped: bool  # some byte is not mapped to this device (read as zeros)
    latency_ns: float


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
        self.n_entries = self.n_pages  # firmware entry ids: one per page, until open_kv
        self.kv: tuple[int, int] | None = None  # open_kv's (base DPA, entry bytes)
        self.kv_placed = {"dram": 0, "nvme": 0}  # pages moved by open_kv's placements
        self.kv_traffic: KvTraffic | None = None  # open_kv's reads, learned from traffic
        # > 0: with DIRECT pages mapped as guest RAM, open_kv's pages are sampled at this
        # rate per step to learn the reads (emu/device/sampling.py)
        self.sample_rate = 0.0
        self.sampler: PageSampler | None = None
        # CXL.mem requests per DPA page (a patched QEMU's trapped accesses; its direct ones
        # are counted in the page-state table)
        self.host_accesses = np.zeros(self.n_pages, dtype=np.uint32)
        if dram_pages is not None and not 0 < dram_pages:
            raise RequestError(f"dram_pages = {dram_pages} must be > 0 (or None: all pages)")
        self.tiering = dram_pages is not None and dram_pages < self.n_pages
        self.dram_pages = dram_pages if self.tiering else self.n_pages
        if policy not in POLICIES or not POLICIES[policy].online:
            online = sorted(n for n, c in POLICIES.items() if c.online)
            raise ValueError(f"policy = {policy!r} is not an online policy; choose from {online}")
        if entries not in ("pages", "host"):
            raise ValueError(f"entries = {entries!r} must be 'pages' or 'host'")
        self.entries = entries
        if mode not in ("float", "int"):
            raise ValueError(f"mode = {mode!r} must be 'float' or 'int'")
        self.policy_name = policy
        self.mode = mode
        self.config = config or PolicyConfig()
        self._block_tokens, self._audit = block_tokens, audit
        self._new_firmware()
        self.record_victims = record_victims
        self.victims: list[tuple[int, int, float]] = []

        self.dram = (
            MmapStore(dram_file, capacity, page_bytes) if dram_file else DictStore(page_bytes)
        )
        self.nvme = (
            FileStore(nvme_file, capacity, page_bytes) if nvme_file else DictStore(page_bytes)
        )
        # 1 = the page's bytes live in DRAM.  With an NVMe file, the map is a file beside
        # it: the bytes of both tiers and where each page is outlive the process.
        self.tier_map = TierMap(
            self.n_pages,
            0 if self.tiering else 1,
            path=tier_map_file or (f"{nvme_file}.tiers" if nvme_file else None),
        )
        self.in_dram = self.tier_map.bytes  # a bytearray, or the map file's mmap
        self.poison: set[int] = set()  # poisoned DPA line numbers
        # Shared with a patched QEMU: which pages it may access directly in the DRAM file
        # (only with a DRAM file to share; every page traps without one).
        # What Get Health Info reports beside the counted errors: set by the host side (a
        # BMC's view: `kvcxl device serve --health life_used=7`), Spec Table 8-100 fields.
        self.health = {"health_status": 0, "media_status": 0, "life_used": 0,
                       "temperature": 0xFFFF, "dirty_shutdowns": 0}  # fmt: skip
        self.page_state = None
        # A host access to a page on NVMe brings it into DRAM first (what a device whose
        # DRAM caches its NVMe does; a patched QEMU then goes direct again).  Off: host
        # accesses never move data, only the firmware's decisions do.
        self.fill_on_access = fill_on_access
        self.trapped: set[int] = set()  # pages the firmware always wants to see
        if page_state is not None:
            self.page_state = PageState(page_state, self.n_pages, self.page_shift)
            if dram_file:
                self.page_state.set_all(np.frombuffer(self.in_dram, dtype=np.uint8) == 1)
        self.queues = {"dram": TierQueue(dram_timing), "nvme": TierQueue(nvme_timing)}
        self._qd, self._qn = self.queues["dram"], self.queues["nvme"]
        self.latencies = array("d")
        self.clock_ns = 0.0
        self.interval_ns = interval_ns
        self.serial = serial
        self.timestamp_offset_ns: int | None = None  # host time − device clock, once set
        self.counters = dict.fromkeys(
            (
                "reads",
                "writes",
                "read_bytes",
                "write_bytes",
                "mem_requests",
                "spec_reads",
                "invalidates",
                "unmapped_reads",
                "unmapped_writes",
                "poisoned_reads",
                "migrations_to_dram",
                "migrations_to_nvme",
                "bytes_migrated",
                "nvme_accesses",
                "nvme_fills",
                "reports",
                "reported_entries",
                "media_errors",
                "internal_errors",
                "resets",
                "migrations_rolled_back",
                "demotions_deferred",
                "unmaps_awaited",
                "alias_checks",
                "alias_violations",
            ),
            0,
        )
        # Media from an earlier run (a tier map file found): where each page is comes back;
        # the policy's metadata does not (it is rebuilt empty), so the tiers are realigned.
        self.inflight: dict[int, Migration] = {}  # page → its migration in progress
        # DRAM pages placed on NVMe whose bytes wait in the DRAM file until QEMU no
        # longer maps them into the guest (PageState.unmapped); settle_leaving moves them
        self.leaving: dict[int, None] = {}
        self.restart = None
        if self.tier_map.restored:
            self.restart = {
                "tier_map": "restored",
                "pages_moved": self._realign(),
                "policy_metadata": "rebuilt: empty, as on a new device (scores start again)",
            }

    def reset(self) -> dict:
        """The firmware restarts (the mailbox's Reset Firmware): a migration in progress is
        completed when its new tier is recorded and rolled back when not; the firmware's
        volatile state (policy metadata, entry identities, context lengths, victim log,
        timestamp) starts again as on a new device and the pages move to where a new
        device keeps them.  Kept: every byte, the tier map, poison, HDM decoders, traps,
        policy parameters and the statistics."""
        completed = rolled_back = 0
        for p, m in list(self.inflight.items()):
            if m.recorded:
                self._finish(p)
                completed += 1
            else:
                self._roll_back(p)
                rolled_back += 1
        self.victims.clear()
        self.timestamp_offset_ns = None
        self._new_firmware()
        moved = self._realign()
        self.counters["resets"] += 1
        return {
            "migrations_completed": completed,
            "migrations_rolled_back": rolled_back,
            "pages_moved": moved,
        }

    # --- the firmware ---------------------------------------------------------------------
    def _new_firmware(self) -> None:
        """The firmware's volatile state as on a new device (also what a reset leaves)."""
        # The firmware session decides; the device moves the bytes it decides about.
        self.fw = FirmwareSession(
            self.policy_name, self.dram_pages, self.config, mode=self.mode,
            block_tokens=self._block_tokens, audit=self._audit,
        )  # fmt: skip
        # Layers × heads × blocks each context's prefetch index spans (see MAX_INDEX_CELLS).
        self._extents: dict[int, tuple[int, int, int]] = {}
        self._cells = 0
        if self.entries == "pages":
            self._extents[0] = (1, 1, _NO_ANCHOR_BLOCK + 1)
            self._cells = _NO_ANCHOR_BLOCK + 1
            # Every page is an entry from the start, as in replay: idle counters of
            # entries not read yet advance with the steps like everyone else's.
            self.fw.table.append(np.arange(self.n_pages), 0, 0, _NO_ANCHOR_BLOCK)
            # Context lengths start unknown (0): an entry's age in tokens is then 0, as
            # for replay's far-from-anchor rows, and a described context starts clean.
            self.fw.table.ctx_tokens[:] = 0
        # With entries="host", entries come into existence when the host describes,
        # creates or reports them (in id order), as in the simulator.
        self.fw.ensure(self.n_pages)

    @property
    def table(self) -> EntryTable:
        return self.fw.table

    @property
    def cache(self) -> PolicyCache:
        return self.fw.cache

    @property
    def policy(self) -> Policy:
        return self.fw.policy

    @property
    def audit(self) -> EvictionAudit | None:
        return self.fw.audit

    @property
    def time(self) -> int:
        return self.fw.time

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
        self.fw.set_config(config)
        self.config = config

    def report(self, step: int, ids: NDArray, weights: NDArray) -> NDArray:
        """Ingest one attention batch; returns the hit mask (entry in DRAM at batch start).

        Raises RequestError for ids outside the device or weights outside [0, 1].
        """
        return self.report_decisions(step, ids, weights)[0]

    def report_decisions(
        self, step: int, ids: NDArray, weights: NDArray
    ) -> tuple[NDArray, Decisions]:
        """:meth:`report`, also returning the decisions the device acted on (misses
        admitted, victims with their tiers and priorities): what a host that asks for
        them (the QEMU ring) is answered."""
        ids = np.asarray(ids, dtype=np.int64)
        w = np.asarray(weights, dtype=np.float64)
        if ids.shape != w.shape or ids.ndim != 1:
            raise RequestError(f"ids {ids.shape} and weights {w.shape} must be equal 1-D shapes")
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_entries):
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            raise RequestError(f"entry {bad} is outside the device's 0 … {self.n_entries - 1}")
        if not mailbox.attention_weights_valid(w):
            raise RequestError("attention weights must be finite and within [0, 1]")
        self.fw.at(step)
        if ids.size:
            self._grow_entries(int(ids.max()))
        time = self.fw.time
        hit, d = self.fw.read(step, ids, w)
        self._apply(d, time)
        if self.kv_traffic is not None:  # what the host must now read from device memory
            self.kv_traffic.expect(ids[~hit])
            self.kv_traffic.expect(d.admitted)
        self.counters["reports"] += 1
        self.counters["reported_entries"] += int(ids.size)
        return hit, d

    def _grow_entries(self, top: int) -> None:
        if self.table.n <= top:
            self.fw.describe(np.arange(self.table.n, top + 1), 0, 0, 0)

    def describe(
        self,
        ids: NDArray,
        ctx: NDArray,
        layer: NDArray,
        head: NDArray,
        block: NDArray,
        *,
        step: int | None = None,
    ) -> None:
        """Give entries their identity (context, layer, KV head, block), as the host knows it.

        Context lengths grow to cover each entry's first token, as the entry table
        does when entries are appended.  With ``step``, the host is at that step first
        (a later step closes the open one before the new entries reach the policy).
        Raises RequestError for out-of-range values (and then changes nothing).
        """
        cols = [np.asarray(x, dtype=np.int64) for x in (ids, ctx, layer, head, block)]
        ids, ctx, layer, head, block = np.broadcast_arrays(*cols)
        if ids.ndim != 1:
            raise RequestError("entry descriptions must be 1-D")
        limits = (
            ("entry", ids, self.n_entries - 1),
            ("context", ctx, MAX_CONTEXTS - 1),
            ("layer", layer, 0x7FFF),
            ("kv_head", head, 0x7FFF),
            ("block", block, 0x7FFFFFFF // self.table.block_tokens),
        )
        for name, v, hi in limits:
            if v.size and (v.min() < 0 or v.max() > hi):
                bad = int(v.min() if v.min() < 0 else v.max())
                raise RequestError(f"{name} {bad} is out of range 0 … {hi}")
        grown, cells = index_extents(self._extents, self._cells, ctx, layer, head, block)
        if cells > MAX_INDEX_CELLS:
            raise RequestError(
                f"these entries would make the prefetch index span {cells} layer × head × block "
                f"cells (at most {MAX_INDEX_CELLS}, summed over contexts)"
            )
        self._extents.update(grown)
        self._cells = cells
        if step is not None:
            self.fw.at(step)
        if ids.size == 0:
            return
        t = self.table
        if t.n <= int(ids.max()):
            if np.array_equal(ids, np.arange(t.n, t.n + ids.size)):
                self.fw.describe(ctx, layer, head, block)  # new entries, in creation order
                return
            self._grow_entries(int(ids.max()))
        self.fw.identify(ids, ctx, layer, head, block)

    def set_context_tokens(self, ctx: NDArray, tokens: NDArray, *, step: int | None = None) -> None:
        """Contexts are now this long in tokens (recency-by-position policies); a shorter
        report than the firmware knows leaves the length as it is (a context never shrinks).
        With ``step``, the host is at that step first (as :meth:`describe`)."""
        ctx = np.asarray(ctx, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        if ctx.shape != tokens.shape or ctx.ndim != 1:
            raise RequestError("contexts and lengths must be equal 1-D shapes")
        if ctx.size and (ctx.min() < 0 or ctx.max() >= MAX_CONTEXTS):
            raise RequestError(f"context ids must be 0 … {MAX_CONTEXTS - 1}")
        if tokens.size and (tokens.min() < 0 or tokens.max() > 1 << 40):
            raise RequestError("context lengths must be 0 … 2^40 tokens")
        if step is not None:
            self.fw.at(step)
        self.fw.lengths(ctx, tokens)

    def create(self, step: int, ids: NDArray) -> int:
        """New entries written by the host: admit them to DRAM without a read (evicting
        the overflow), like the simulator's CREATE event.  Returns how many were admitted."""
        return int(self.create_decisions(step, ids).admitted.size)

    def create_decisions(self, step: int, ids: NDArray) -> Decisions:
        """:meth:`create`, returning the decisions the device acted on (entries admitted,
        victims with their tiers and priorities)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1:
            raise RequestError("entry ids must be 1-D")
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_entries):
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            raise RequestError(f"entry {bad} is outside the device's 0 … {self.n_entries - 1}")
        self.fw.at(step)
        if ids.size:
            self._grow_entries(int(ids.max()))
        time = self.fw.time - 1 if self.fw.offline else max(self.fw.time - 1, 0)
        d = self.fw.write(step, ids)
        self._apply(d, time)
        if self.kv_traffic is not None:
            self.kv_traffic.expect(d.admitted)  # the host copies them in
        return d

    def end_step(self, step: int) -> None:
        """The host closed ``step`` (the policy's step-boundary update)."""
        self.fw.at(step)
        self.fw.end_step()
        if self.kv_traffic is not None:  # the step's reads, from the traffic itself
            self.kv_traffic.step_end(step, self._accesses(), self._poisoned_entries())
        if self.sampler is not None:
            self.sampler.arm(self.page_state)

    def prefetch_candidates(self, ids: NDArray, weights: NDArray, limit: int) -> NDArray:
        """Entries the firmware would fetch next after this attention batch, best first
        (at most ``limit``); they are hints: nothing moves until the host creates or
        reports them."""
        return self.fw.prefetch_candidates(ids, weights, limit)

    def open_kv(
        self,
        n_entries: int,
        entry_bytes: int,
        capacity: int,
        block_tokens: int,
        base: int,
        *,
        policy: str | None = None,
        config: PolicyConfig | None = None,
        mode: str | None = None,
    ) -> None:
        """A host's KV cache in this device's memory: entry ``i`` is the bytes at DPA
        ``base + i·entry_bytes``, the firmware's cache is the host's own memory (its HBM)
        of ``capacity`` entries, and a new firmware session with host entries replaces
        the current one.  From now on each victim's pages move, in this device, to the
        tier placement chose (CXL DRAM or NVMe); admitted entries stay where they are
        (the host copies them).  Raises RequestError when the entries do not fit."""
        if n_entries < 1 or entry_bytes < 1 or capacity < 1 or block_tokens < 1:
            raise RequestError(
                f"entries {n_entries}, entry bytes {entry_bytes}, capacity {capacity}, "
                f"block tokens {block_tokens}: each must be >= 1"
            )
        if base < 0 or base + n_entries * entry_bytes > self.capacity:
            raise RequestError(
                f"{n_entries} entries of {entry_bytes} B at DPA {base:#x} do not fit the "
                f"device's {self.capacity} bytes"
            )
        self.policy_name = policy or self.policy_name
        self.config = config or self.config
        self.mode = mode or self.mode
        self.fw = FirmwareSession(
            self.policy_name, capacity, self.config, mode=self.mode,
            block_tokens=block_tokens, audit=True,
        )  # fmt: skip
        self.fw.ensure(n_entries)
        self.entries = "host"
        self.n_entries = n_entries
        self._extents, self._cells = {}, 0
        self.kv = (base, entry_bytes)
        self.record_victims = True
        self.victims = []
        self.kv_placed = {"dram": 0, "nvme": 0}
        self.kv_traffic = KvTraffic(base, entry_bytes, n_entries, self.page_shift, self._accesses())
        self.sampler = None
        if self.sample_rate > 0 and self.page_state is not None:
            kt = self.kv_traffic
            self.sampler = PageSampler(kt.first_page, kt.last_page, self.sample_rate)
            kt.sampler = self.sampler
            self.sampler.arm(self.page_state)

    def _host_access(self, p: int) -> None:
        """A CXL.mem request to page ``p``: counted; a sampled page's first touch makes
        it DIRECT again."""
        self.host_accesses[p] += 1
        if self.sampler is not None and self.sampler.touched(p):
            self._maybe_direct(p)

    def _accesses(self) -> NDArray:
        """Host accesses per DPA page so far: trapped (here) plus direct (QEMU's counts)."""
        acc = self.host_accesses.astype(np.int64)
        if self.page_state is not None:
            acc += self.page_state.count
        return acc

    def _poisoned_entries(self) -> set[int]:
        base, eb = self.kv
        return {
            (line * LINE - base) // eb
            for line in self.poison
            if 0 <= line * LINE - base < self.n_entries * eb
        }

    def _place_kv(self, victims: NDArray, tiers: NDArray) -> None:
        """Each victim's pages to the tier placement chose (open_kv's cache)."""
        base, eb = self.kv
        for tier, to_dram in ((TIER_NVME, False), (TIER_CXL, True)):
            sel = victims[tiers == tier].astype(np.int64)
            if not sel.size:
                continue
            first = (base + sel * eb) >> self.page_shift
            last = (base + (sel + 1) * eb - 1) >> self.page_shift
            pages = sorted({p for a, b in zip(first, last, strict=True) for p in range(a, b + 1)})
            for p in pages:
                self.move_page(p, to_dram)
            self.kv_placed["dram" if to_dram else "nvme"] += len(pages)

    def _apply(self, d: Decisions, time: int) -> None:
        """Move the bytes the firmware decided about: victims out of DRAM first (as they
        left during the call), then the admitted entries in."""
        if self.record_victims and d.victims.size:
            prio = d.priority if d.priority is not None else np.zeros(d.victims.size)
            self.victims.extend(
                zip([time] * d.victims.size, d.victims.tolist(), prio.tolist(), strict=True)
            )
        if self.kv is not None:
            if d.victims.size:
                self._place_kv(d.victims, d.tiers)
            return
        if not self.tiering:
            return
        for p in d.victims.tolist():
            self._demote(p)
        if d.admitted.size:
            for p in d.admitted[self.cache.is_resident(d.admitted)].tolist():
                self._promote(p)

    def _move(
        self, p: int, src, dst, src_q: str, dst_q: str, to_dram: int, src_charged: bool = False
    ) -> None:
        # Copy, record the new tier, then drop the old copy: a process killed anywhere in
        # between leaves the page whole in the tier the map names.
        data = src.peek(p)
        if data is not None:
            dst.put(p, data)
        self.in_dram[p] = to_dram
        if data is not None:
            src.drop(p)
            self._charge(src_q, dst_q, src_charged)

    def _charge(self, src_q: str, dst_q: str, src_charged: bool = False) -> None:
        t = self.clock_ns
        if not src_charged:  # (a fill charged its read to the access that caused it)
            self.queues[src_q].serve(t, self.page_bytes, record=False)
        self.queues[dst_q].serve(t, self.page_bytes, record=False)
        self.counters["bytes_migrated"] += self.page_bytes

    def unmap(self, p: int) -> bool:
        """Take page ``p`` off DIRECT (a trap); True once no guest access can reach its
        bytes in the DRAM file unseen, so that they may leave it.  False while a patched
        QEMU still maps the page into the guest as RAM: ask again later."""
        ps = self.page_state
        if ps is None:
            return True
        was_direct = ps.state[p] == DIRECT
        ps.trap(p)  # before the bytes leave the shared file
        if ps.unmapped(p):
            return True
        if was_direct:
            self.counters["unmaps_awaited"] += 1  # QEMU had it mapped as guest RAM
        return False

    def _demote(self, p: int) -> None:
        if self.inflight:
            self._settle(p)
        if self.in_dram[p]:
            if not self.unmap(p):
                # QEMU still maps it: the page stays in the DRAM file (accesses trap and
                # are served from there) until settle_leaving finds it unmapped
                if p not in self.leaving:
                    self.counters["demotions_deferred"] += 1
                self.leaving[p] = None
                return
            self.leaving.pop(p, None)
            self._leaves_dram(p)
            self._move(p, self.dram, self.nvme, "dram", "nvme", 0)
            self.counters["migrations_to_nvme"] += 1

    def _leaves_dram(self, p: int) -> None:
        """Page ``p``'s bytes are about to leave the DRAM file: QEMU must not map it."""
        ps = self.page_state
        if ps is not None and ps.aliasing:
            self.counters["alias_checks"] += 1
            if ps.mapped[p]:
                self.counters["alias_violations"] += 1

    def check_alias(self) -> int:
        """Every page QEMU maps into the guest as RAM is in the DRAM tier (a check of the
        protocol, run periodically under the engine's lock); returns the pages that are
        not, also counted in ``alias_violations``."""
        ps = self.page_state
        if ps is None or not ps.aliasing:
            return 0
        bad = int(np.count_nonzero(ps.mapped & (np.frombuffer(self.in_dram, np.uint8) == 0)))
        self.counters["alias_checks"] += 1
        self.counters["alias_violations"] += bad
        return bad

    def settle_leaving(self) -> int:
        """Move the deferred demotions whose pages QEMU no longer maps; returns how many."""
        moved = 0
        for p in list(self.leaving):
            if self.page_state is None or self.page_state.unmapped(p):
                del self.leaving[p]
                self._demote(p)
                moved += 1
        return moved

    def _promote(self, p: int, src_charged: bool = False) -> None:
        if self.inflight:
            self._settle(p)
        if p in self.leaving:  # placed on NVMe, never left: it stays, direct again
            del self.leaving[p]
            self._maybe_direct(p)
        if not self.in_dram[p]:
            self._move(p, self.nvme, self.dram, "nvme", "dram", 1, src_charged)
            self.counters["migrations_to_dram"] += 1
            self._maybe_direct(p)

    # --- migrations in steps (a reset may find one half done) -----------------------------
    def _ends(self, to_dram: bool) -> tuple:
        """(source store, destination store) of a migration to DRAM or to NVMe."""
        return (self.nvme, self.dram) if to_dram else (self.dram, self.nvme)

    def start_migration(self, p: int, to_dram: bool) -> bool:
        """Begin moving page ``p`` in steps that other requests may come between: copy it
        now (the host's writes then go to both copies), record its new tier and drop the
        old copy in :meth:`step_migration`.  False when the page is already there."""
        if self.inflight:
            self._settle(p)
        if bool(self.in_dram[p]) == to_dram:
            return False
        src, dst = self._ends(to_dram)
        if not to_dram and not self.unmap(p):
            raise RuntimeError(
                f"page {p} is still mapped into the guest as RAM: its bytes cannot leave "
                "the DRAM file yet (wait until Type3Device.unmap is True)"
            )
        if not to_dram:
            self._leaves_dram(p)
        data = src.peek(p)
        if data is not None:
            dst.put(p, data)
        self.inflight[p] = Migration(to_dram)
        return True

    def step_migration(self, p: int) -> bool:
        """The next step of page ``p``'s migration: record the new tier, then (the next
        call) drop the old copy.  True when the migration is done."""
        m = self.inflight[p]
        if not m.recorded:
            self.in_dram[p] = int(m.to_dram)
            m.recorded = True
            return False
        self._finish(p)
        return True

    def _mirror(self, p: int, off: int, data: bytes | memoryview) -> None:
        """A write to a page being copied goes to the copy too (until the new tier is
        recorded the old copy is the page; after, the copy is): neither may go stale."""
        m = self.inflight.get(p)
        if m is not None and not m.recorded:
            self._ends(m.to_dram)[1].write(p, off, data)

    def _finish(self, p: int) -> None:
        m = self.inflight.pop(p)
        src, _ = self._ends(m.to_dram)
        src.drop(p)
        self._charge(*(("nvme", "dram") if m.to_dram else ("dram", "nvme")))
        self.counters["migrations_to_dram" if m.to_dram else "migrations_to_nvme"] += 1
        if m.to_dram:
            self._maybe_direct(p)

    def _roll_back(self, p: int) -> None:
        """Undo a migration whose new tier is not recorded: the old copy is the page (the
        host's writes went to it), the new one is dropped."""
        m = self.inflight.pop(p)
        _, dst = self._ends(m.to_dram)
        dst.drop(p)
        self.counters["migrations_rolled_back"] += 1
        if not m.to_dram:
            self._maybe_direct(p)

    def _settle(self, p: int) -> None:
        """Complete page ``p``'s migration in progress, if any (before another move)."""
        m = self.inflight.get(p)
        if m is not None:
            if not m.recorded:
                self.step_migration(p)
            self._finish(p)

    def _fill(self, p: int, t: float) -> float:
        """A host access arriving at ``t`` found page ``p`` on NVMe: the page comes into
        DRAM (counted) and the access waits for it; returns when the page is in DRAM."""
        self.counters["nvme_fills"] += 1
        ready = self._qn.serve(t, self.page_bytes)  # the page read off NVMe, charged here
        self._promote(p, src_charged=True)
        return ready

    def move_page(self, p: int, to_dram: bool) -> None:
        """Page ``p`` to DRAM or to NVMe at once, bytes and all: a PLACE frame's pages, or
        the pages of victims the firmware placed (the churn moves pages in steps instead:
        :meth:`start_migration`)."""
        if to_dram:
            self._promote(p)
        else:
            self._demote(p)

    def pages_of(self, dpa: int, n: int) -> range:
        """The DPA pages of ``[dpa, dpa + n)``; a RequestError if it is not inside the device."""
        if n < 1 or dpa < 0 or dpa + n > self.capacity:
            raise RequestError(
                f"{n} B at DPA {dpa:#x} is outside the device's {self.capacity} bytes"
            )
        return range(dpa >> self.page_shift, ((dpa + n - 1) >> self.page_shift) + 1)

    def trap(self, dpa: int, n: int) -> None:
        """Every access to the pages of ``[dpa, dpa + n)`` comes to the device, even from
        a patched QEMU that could complete it against the shared DRAM file."""
        for p in self.pages_of(dpa, n):
            self.trapped.add(p)
            if self.page_state is not None:
                self.page_state.trap(p)

    def _maybe_direct(self, p: int) -> None:
        """QEMU may access page ``p`` directly again: it is in the shared DRAM file and
        none of its lines is poisoned."""
        ps = self.page_state
        if ps is None or not isinstance(self.dram, MmapStore) or not self.in_dram[p]:
            return
        if p in self.trapped:
            return
        lines = self.page_bytes >> 6
        if self.poison and any(line in self.poison for line in range(p * lines, (p + 1) * lines)):
            return
        ps.direct(p)

    def _realign(self) -> int:
        """After a restart on persistent media: the tier map is restored, the policy's
        metadata is not (it starts empty, as on a new device).  Move every page to where a
        new device keeps it (tiered: NVMe; otherwise DRAM) so that the firmware's view and
        the bytes agree again.  Nothing is lost: each move copies before it drops.  Returns
        the pages moved."""
        want = 0 if self.tiering else 1
        moved = 0
        for p in np.flatnonzero(np.frombuffer(self.in_dram, np.uint8) != want).tolist():
            if want:
                self._move(p, self.nvme, self.dram, "nvme", "dram", 1)
                self._maybe_direct(p)
            elif not self.unmap(p):  # mapped into a guest: its bytes leave once unmapped
                self.leaving[p] = None
            else:
                self._leaves_dram(p)
                self._move(p, self.dram, self.nvme, "dram", "nvme", 0)
            moved += 1
        return moved

    # --- DPA access -------------------------------------------------------------------
    def _arrival(self, at: float | None) -> float:
        return self.clock_ns if at is None else float(at)

    def _advance(self, t: float, done: float) -> None:
        self.latencies.append(done - t)
        self.clock_ns = done if self.interval_ns is None else t + self.interval_ns

    def _dpa_read(self, dpa: int, n: int, t: float) -> tuple[bytes, float]:
        shift, pb = self.page_shift, self.page_bytes
        p = dpa >> shift
        off = dpa & (pb - 1)
        if off + n <= pb:  # the common case: inside one page
            ready = t
            if not self.in_dram[p] and self.fill_on_access:
                ready = self._fill(p, t)
            if self.in_dram[p]:
                return self.dram.read(p, off, n), self._qd.serve(ready, n)
            self.counters["nvme_accesses"] += 1
            return self.nvme.read(p, off, n), self._qn.serve(t, n)
        out = []
        done = t
        while n > 0:
            p = dpa >> shift
            off = dpa & (pb - 1)
            m = min(n, pb - off)
            ready = t
            if not self.in_dram[p] and self.fill_on_access:
                ready = self._fill(p, t)
            if self.in_dram[p]:
                out.append(self.dram.read(p, off, m))
                d = self._qd.serve(ready, m)
            else:
                self.counters["nvme_accesses"] += 1
                out.append(self.nvme.read(p, off, m))
                d = self._qn.serve(t, m)
            if d > done:
                done = d
            dpa += m
            n -= m
        return b"".join(out), done

    def _dpa_write(self, dpa: int, data: bytes | memoryview, t: float) -> float:
        done = t
        shift, pb = self.page_shift, self.page_bytes
        i = 0
        n = len(data)
        while i < n:
            p = dpa >> shift
            off = dpa & (pb - 1)
            m = min(n - i, pb - off)
            ready = t
            if not self.in_dram[p] and self.fill_on_access:
                ready = self._fill(p, t)
            if self.in_dram[p]:
                self.dram.write(p, off, data[i : i + m])
                d = self._qd.serve(ready, m)
            else:
                self.counters["nvme_accesses"] += 1
                self.nvme.write(p, off, data[i : i + m])
                d = self._qn.serve(t, m)
            if self.inflight:
                self._mirror(p, off, data[i : i + m])
            if d > done:
                done = d
            dpa += m
            i += m
        return done

    def _poisoned(self, dpa: int, n: int) -> bool:
        if not self.poison:
            return False
        return any(line in self.poison for line in range(dpa >> 6, (dpa + n - 1 >> 6) + 1))

    def _update_poison(self, dpa: int, n: int, poison: bool) -> None:
        first, last = dpa >> 6, (dpa + n - 1) >> 6
        if poison:
            if self.page_state is not None:
                for p in range(
                    (first << 6) >> self.page_shift, ((last << 6) >> self.page_shift) + 1
                ):
                    self.page_state.trap(p)  # QEMU must see the poison: trap first
            self.poison.update(range(first, last + 1))
        elif self.poison:
            # A write covering a whole line replaces its content: the poison is gone.
            lo = first if dpa & 63 == 0 else first + 1
            hi = last if (dpa + n) & 63 == 0 else last - 1
            for line in range(lo, hi + 1):
                self.poison.discard(line)
            for p in range(dpa >> self.page_shift, ((dpa + n - 1) >> self.page_shift) + 1):
                self._maybe_direct(p)

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
                poisoned = self._poisoned(dpa, k)
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
        self.counters["mem_requests"] += 1
        if isinstance(msg, mem.M2SReq):
            op = msg.opcode
            if op == mem.M2SReqOpcode.MEM_INV:
                # Host-only coherent memory keeps no device-side copy to invalidate.
                self.counters["invalidates"] += 1
                return mem.S2MNDR(mem.S2MNDROpcode.CMP, msg.tag, ld_id=msg.ld_id)
            if op == mem.M2SReqOpcode.MEM_SPEC_RD:
                # A speculative read is a hint: no completion is returned for it.
                self.counters["spec_reads"] += 1
                return None
            dpa = self.hdm.translate(msg.addr << 6)
            t = self._arrival(at)
            if dpa is None:
                self.counters["unmapped_reads"] += 1
                self._advance(t, t)
                return mem.S2MDRS(
                    mem.S2MDRSOpcode.MEM_DATA_NXM, msg.tag, zeros(LINE), poison=1, ld_id=msg.ld_id
                )
            self._host_access(dpa >> self.page_shift)
            data, done = self._dpa_read(dpa, LINE, t)
            poisoned = (dpa >> 6) in self.poison
            self.counters["reads"] += 1
            self.counters["read_bytes"] += LINE
            self.counters["poisoned_reads"] += poisoned
            self._advance(t, done)
            return mem.S2MDRS(
                mem.S2MDRSOpcode.MEM_DATA, msg.tag, data, poison=int(poisoned), ld_id=msg.ld_id
            )
        if isinstance(msg, mem.M2SRwD):
            dpa = self.hdm.translate(msg.addr << 6)
            t = self._arrival(at)
            if dpa is None:
                self.counters["unmapped_writes"] += 1
                self._advance(t, t)
            else:
                self._host_access(dpa >> self.page_shift)
                be = msg.byte_enable
                if be == mem.ALL_BYTES:
                    done = self._dpa_write(dpa, msg.data, t)
                    self._update_poison(dpa, LINE, bool(msg.poison))
                else:
                    old, _ = self._dpa_read(dpa, LINE, t)
                    line = bytearray(old)
                    for i in range(LINE):
                        if be >> i & 1:
                            line[i] = msg.data[i]
                    done = self._dpa_write(dpa, bytes(line), t)
                    if msg.poison:
                        self.poison.add(dpa >> 6)
                self.counters["writes"] += 1
                self.counters["write_bytes"] += be.bit_count()
                self._advance(t, done)
            return mem.S2MNDR(mem.S2MNDROpcode.CMP, msg.tag, ld_id=msg.ld_id)
        raise RequestError(f"{type(msg).__name__} is a device-to-host message, not a request")

    # --- poison (mailbox) -------------------------------------------------------------
    def inject_poison(self, dpa: int) -> None:
        if self.page_state is not None:
            self.page_state.trap(dpa >> self.page_shift)
        self.poison.add(dpa >> 6)

    def clear_poison(self, dpa: int, data: bytes) -> None:
        self._dpa_write(dpa, data, self.clock_ns)
        self.poison.discard(dpa >> 6)
        self._maybe_direct(dpa >> self.page_shift)

    # --- statistics -------------------------------------------------------------------
    def check_placement(self) -> bool:
        """Invariant: pages in DRAM are exactly the policy cache's resident entries."""
        if not self.tiering:
            return True
        res = self.cache.is_resident(np.arange(self.n_pages))
        return bool(np.array_equal(res, np.frombuffer(self.in_dram, dtype=np.uint8) == 1))

    def stats(self) -> dict:
        return {
            "capacity_bytes": self.capacity,
            "page_bytes": self.page_bytes,
            "dram_pages": self.dram_pages,
            "tiering": self.tiering,
            "policy": self.policy_name,
            "counters": dict(self.counters),
            "pages_in_dram": len(self.dram),
            "pages_in_nvme": len(self.nvme),
            "media": {
                "dram": "file" if isinstance(self.dram, MmapStore) else "memory",
                "nvme": "file" if isinstance(self.nvme, FileStore) else "memory",
                "tier_map": "file" if self.tier_map.path else "memory",
                "restart": self.restart,
            },
            "poisoned_lines": len(self.poison),
            # accesses a patched QEMU completed directly against the shared DRAM file
            "direct_accesses": self.page_state.direct_accesses() if self.page_state else 0,
            # DIRECT pages QEMU maps into the guest as RAM (their accesses are not counted)
            "alias": self.page_state.alias_stats() if self.page_state else None,
            "kv_traffic": self.kv_traffic.stats() if self.kv_traffic is not None else None,
            "cache": self.cache.stats.as_dict(),
            "audit": self.audit.as_dict() if self.audit else {},
            "tiers": {k: q.summary() for k, q in self.queues.items()},
            "requests": percentiles(self.latencies),
            "clock_ns": round(self.clock_ns, 1),
            "evidence": "Simulated (timing from the Analytical tier model)",
        }

    def close(self) -> None:
        self.dram.close()
        self.nvme.close()
        if self.page_state is not None:
            self.page_state.close()
        self.tier_map.close()
