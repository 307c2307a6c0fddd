"""The device's firmware front: what the host tells the firmware and what the device does
about the firmware's decisions.

Each DPA page is one policy entry (entry id = page number); with ``entries="pages"``
every page is an entry from the start (replay's view), with ``entries="host"`` entries
appear as the host describes, creates or reports them (the simulator's view; see the
vendor mailbox commands).  Each call here checks the host's values (a
:class:`~kvcxl.emu.device.errors.RequestError` for anything out of bounds, before any
change), makes one call into the :class:`~kvcxl.firmware.session.FirmwareSession` — the
session the simulator and replay drive, with the same step/time ticks — and moves the
bytes of the decisions it hands back: victims out of DRAM, admitted entries in
(:mod:`kvcxl.emu.device.migration`), or, for a host's KV cache opened in the device
(:meth:`FirmwareFront.open_kv`), each victim's pages to the tier placement chose.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kvcxl.cxl import mailbox
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import TIER_CXL, TIER_NVME
from kvcxl.firmware.session import Decisions, FirmwareSession

from .errors import RequestError
from .kvtraffic import KvTraffic
from .migration import Migrations
from .poison import PoisonList
from .sampling import PageSampler

_NO_ANCHOR_BLOCK = 1 << 20  # default entry row: far from any anchor zone (as replay does)
MAX_CONTEXTS = 1 << 20  # context ids the host may use (bounds the per-context arrays)
# The firmware's prefetch index is dense per context over layers × KV heads × blocks: the
# cells the host's ids make it span, summed over contexts, are bounded (8 M cells: a
# 64 MiB index; the largest 128 K-token context of scenario S1 spans 5.2 M).
MAX_INDEX_CELLS = 1 << 23
LINE = 64


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


def _check_ids(ids: NDArray, n_entries: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= n_entries):
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise RequestError(f"entry {bad} is outside the device's 0 … {n_entries - 1}")


class FirmwareFront:
    """The firmware of one device, as its host and its pages see it."""

    def __init__(
        self,
        *,
        policy: str,
        config: PolicyConfig,
        mode: str,
        entries: str,
        n_pages: int,
        dram_pages: int,
        tiering: bool,
        block_tokens: int,
        audit: bool,
        record_victims: bool,
        migrations: Migrations,
        poison: PoisonList,
        counters: dict[str, int],
    ) -> None:
        self.policy_name, self.config, self.mode = policy, config, mode
        self.entries = entries
        self.n_pages, self.dram_pages, self.tiering = n_pages, dram_pages, tiering
        self.n_entries = n_pages  # firmware entry ids: one per page, until open_kv
        self._block_tokens, self._audit = block_tokens, audit
        self.migrations, self.media = migrations, migrations.media
        self.poison, self.counters = poison, counters
        self.record_victims = record_victims
        self.victims: list[tuple[int, int, float]] = []
        self.kv: tuple[int, int] | None = None  # open_kv's (base DPA, entry bytes)
        self.kv_placed = {"dram": 0, "nvme": 0}  # pages moved by open_kv's placements
        self.kv_traffic: KvTraffic | None = None  # open_kv's reads, learned from traffic
        # > 0: with DIRECT pages mapped as guest RAM, open_kv's pages are sampled at this
        # rate per step to learn the reads (emu/device/sampling.py)
        self.sample_rate = 0.0
        self.sampler: PageSampler | None = None
        self.restart()

    def restart(self) -> None:
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
        self.victims.clear()

    def set_config(self, config: PolicyConfig) -> None:
        """Apply new policy parameters, keeping every entry's metadata and residency."""
        self.fw.set_config(config)
        self.config = config

    # --- what the host tells the firmware ----------------------------------------------------
    def report_decisions(
        self, step: int, ids: NDArray, weights: NDArray
    ) -> tuple[NDArray, Decisions]:
        """One attention batch: the hit mask (entry in DRAM at batch start) and the
        decisions the device acted on (misses admitted, victims with tiers and priorities).
        Raises RequestError for ids outside the device or weights outside [0, 1]."""
        ids = np.asarray(ids, dtype=np.int64)
        w = np.asarray(weights, dtype=np.float64)
        if ids.shape != w.shape or ids.ndim != 1:
            raise RequestError(f"ids {ids.shape} and weights {w.shape} must be equal 1-D shapes")
        _check_ids(ids, self.n_entries)
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
        if self.fw.table.n <= top:
            self.fw.describe(np.arange(self.fw.table.n, top + 1), 0, 0, 0)

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
        t = self.fw.table
        limits = (
            ("entry", ids, self.n_entries - 1),
            ("context", ctx, MAX_CONTEXTS - 1),
            ("layer", layer, 0x7FFF),
            ("kv_head", head, 0x7FFF),
            ("block", block, 0x7FFFFFFF // t.block_tokens),
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

    def create_decisions(self, step: int, ids: NDArray) -> Decisions:
        """New entries written by the host: admit them to DRAM without a read (evicting
        the overflow), like the simulator's CREATE event; the decisions the device acted
        on (entries admitted, victims with their tiers and priorities)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1:
            raise RequestError("entry ids must be 1-D")
        _check_ids(ids, self.n_entries)
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
        self._apply(self.fw.take_decisions(), self.fw.time)  # managed tiers' boundary moves
        if self.kv_traffic is not None:  # the step's reads, from the traffic itself
            self.kv_traffic.step_end(step, self.media.accesses(), self._poisoned_entries())
        if self.sampler is not None:
            self.sampler.arm(self.media.page_state)

    def prefetch_candidates(self, ids: NDArray, weights: NDArray, limit: int) -> NDArray:
        """Entries the firmware would fetch next after this attention batch, best first
        (at most ``limit``); they are hints: nothing moves until the host creates or
        reports them."""
        return self.fw.prefetch_candidates(ids, weights, limit)

    # --- a host's KV cache in the device's memory ----------------------------------------------
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
        size = self.media.capacity
        if base < 0 or base + n_entries * entry_bytes > size:
            raise RequestError(
                f"{n_entries} entries of {entry_bytes} B at DPA {base:#x} do not fit the "
                f"device's {size} bytes"
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
        self.kv_traffic = KvTraffic(
            base, entry_bytes, n_entries, self.media.page_shift, self.media.accesses()
        )
        self.sampler = None
        ps = self.media.page_state
        if self.sample_rate > 0 and ps is not None:
            kt = self.kv_traffic
            self.sampler = PageSampler(kt.first_page, kt.last_page, self.sample_rate)
            kt.sampler = self.sampler
            self.sampler.arm(ps)

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
        shift = self.media.page_shift
        for tier, to_dram in ((TIER_NVME, False), (TIER_CXL, True)):
            sel = victims[tiers == tier].astype(np.int64)
            if not sel.size:
                continue
            first = (base + sel * eb) >> shift
            last = (base + (sel + 1) * eb - 1) >> shift
            pages = sorted({p for a, b in zip(first, last, strict=True) for p in range(a, b + 1)})
            for p in pages:
                self.migrations.move_page(p, to_dram)
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
            for ids, _src, dst in d.moves:  # the lower-tier moves decided after them
                self._place_kv(ids, np.full(ids.size, dst, dtype=np.uint8))
            return
        if not self.tiering:
            return
        for p in d.victims.tolist():
            self.migrations.demote(p)
        if d.admitted.size:
            for p in d.admitted[self.fw.cache.is_resident(d.admitted)].tolist():
                self.migrations.promote(p)

    def check_placement(self) -> bool:
        """Invariant: pages in DRAM are exactly the policy cache's resident entries."""
        if not self.tiering:
            return True
        res = self.fw.cache.is_resident(np.arange(self.n_pages))
        return bool(np.array_equal(res, np.frombuffer(self.media.in_dram, dtype=np.uint8) == 1))
