"""Pages moving between the device's tiers, at once or in steps a reset may interrupt.

A move copies the page, records its new tier in the tier map, then drops the old copy:
a process killed anywhere in between leaves the page whole in the tier the map names.
A stepwise migration (the churn's, ``--churn``) lets other requests come between the
steps; the host's writes then go to both copies (:meth:`Migrations.mirror`), and a
firmware reset completes it when its new tier is recorded and rolls it back when not.
Every move is charged to both tiers' queues and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .pagestate import DIRECT
from .tiers import Media


@dataclass
class Migration:
    """A migration the host can see in progress (the stepwise ones: `--churn`)."""

    to_dram: bool
    recorded: bool = False  # the tier map names the new tier (the copy is then the page)


class Migrations:
    """The moves of one device's pages between its DRAM and NVMe tiers."""

    def __init__(self, media: Media, counters: dict[str, int], clock: Callable[[], float]):
        self.media = media
        self.counters = counters
        self.clock = clock  # the device's clock (ns): when a move is charged to the queues
        self.inflight: dict[int, Migration] = {}  # page → its migration in progress
        # DRAM pages placed on NVMe whose bytes wait in the DRAM file until QEMU no
        # longer maps them into the guest (PageState.unmapped); settle_leaving moves them
        self.leaving: dict[int, None] = {}

    # --- moves at once ---------------------------------------------------------------------
    def _ends(self, to_dram: bool) -> tuple:
        return self.media.ends(to_dram)

    def _move(
        self, p: int, src, dst, src_q: str, dst_q: str, to_dram: int, src_charged: bool = False
    ) -> None:
        # Copy, record the new tier, then drop the old copy.
        data = src.peek(p)
        if data is not None:
            dst.put(p, data)
        self.media.in_dram[p] = to_dram
        if data is not None:
            src.drop(p)
            self._charge(src_q, dst_q, src_charged)

    def _charge(self, src_q: str, dst_q: str, src_charged: bool = False) -> None:
        t = self.clock()
        q, pb = self.media.queues, self.media.page_bytes
        if not src_charged:  # (a fill charged its read to the access that caused it)
            q[src_q].serve(t, pb, record=False)
        q[dst_q].serve(t, pb, record=False)
        self.counters["bytes_migrated"] += pb

    def demote(self, p: int) -> None:
        """Page ``p`` to NVMe (nothing when it is there)."""
        if self.inflight:
            self._settle(p)
        m = self.media
        if m.in_dram[p]:
            if not self.unmap(p):
                # QEMU still maps it: the page stays in the DRAM file (accesses trap and
                # are served from there) until settle_leaving finds it unmapped
                if p not in self.leaving:
                    self.counters["demotions_deferred"] += 1
                self.leaving[p] = None
                return
            self.leaving.pop(p, None)
            self._leaves_dram(p)
            self._move(p, m.dram, m.nvme, "dram", "nvme", 0)
            self.counters["migrations_to_nvme"] += 1

    def unmap(self, p: int) -> bool:
        """Take page ``p`` off DIRECT (a trap); True once no guest access can reach its
        bytes in the DRAM file unseen, so that they may leave it.  False while a patched
        QEMU still maps the page into the guest as RAM: ask again later."""
        ps = self.media.page_state
        if ps is None:
            return True
        was_direct = ps.state[p] == DIRECT
        ps.trap(p)  # before the bytes leave the shared file
        if ps.unmapped(p):
            return True
        if was_direct:
            self.counters["unmaps_awaited"] += 1  # QEMU had it mapped as guest RAM
        return False

    def _leaves_dram(self, p: int) -> None:
        """Page ``p``'s bytes are about to leave the DRAM file: QEMU must not map it."""
        ps = self.media.page_state
        if ps is not None and ps.aliasing:
            self.counters["alias_checks"] += 1
            if ps.mapped[p]:
                self.counters["alias_violations"] += 1

    def check_alias(self) -> int:
        """Every page QEMU maps into the guest as RAM is in the DRAM tier (a check of the
        protocol, run periodically under the engine's lock); returns the pages that are
        not, also counted in ``alias_violations``."""
        ps = self.media.page_state
        if ps is None or not ps.aliasing:
            return 0
        in_dram = np.frombuffer(self.media.in_dram, np.uint8)
        bad = int(np.count_nonzero(ps.mapped & (in_dram == 0)))
        self.counters["alias_checks"] += 1
        self.counters["alias_violations"] += bad
        return bad

    def settle_leaving(self) -> int:
        """Move the deferred demotions whose pages QEMU no longer maps; returns how many."""
        moved = 0
        ps = self.media.page_state
        for p in list(self.leaving):
            if ps is None or ps.unmapped(p):
                del self.leaving[p]
                self.demote(p)
                moved += 1
        return moved

    def promote(self, p: int, src_charged: bool = False) -> None:
        """Page ``p`` to DRAM (nothing when it is there)."""
        if self.inflight:
            self._settle(p)
        m = self.media
        if p in self.leaving:  # placed on NVMe, never left: it stays, direct again
            del self.leaving[p]
            m.maybe_direct(p)
        if not m.in_dram[p]:
            self._move(p, m.nvme, m.dram, "nvme", "dram", 1, src_charged)
            self.counters["migrations_to_dram"] += 1
            m.maybe_direct(p)

    def move_page(self, p: int, to_dram: bool) -> None:
        """Page ``p`` to DRAM or to NVMe at once, bytes and all: a PLACE frame's pages, or
        the pages of victims the firmware placed (the churn moves pages in steps instead:
        :meth:`start`)."""
        if to_dram:
            self.promote(p)
        else:
            self.demote(p)

    def fill(self, p: int, t: float) -> float:
        """A host access arriving at ``t`` found page ``p`` on NVMe: the page comes into
        DRAM (counted) and the access waits for it; returns when the page is in DRAM."""
        self.counters["nvme_fills"] += 1
        ready = self.media.queues["nvme"].serve(t, self.media.page_bytes)  # charged here
        self.promote(p, src_charged=True)
        return ready

    def realign(self, tiering: bool) -> int:
        """After a restart on persistent media or a firmware reset: the policy's metadata
        starts empty, so every page goes where a new device keeps it (tiered: NVMe;
        otherwise DRAM) and the firmware's view and the bytes agree again.  Nothing is
        lost: each move copies before it drops.  Returns the pages moved."""
        m = self.media
        want = 0 if tiering else 1
        moved = 0
        for p in np.flatnonzero(np.frombuffer(m.in_dram, np.uint8) != want).tolist():
            if want:
                self._move(p, m.nvme, m.dram, "nvme", "dram", 1)
                m.maybe_direct(p)
            elif not self.unmap(p):  # mapped into a guest: its bytes leave once unmapped
                self.leaving[p] = None
            else:
                self._leaves_dram(p)
                self._move(p, m.dram, m.nvme, "dram", "nvme", 0)
            moved += 1
        return moved

    # --- migrations in steps (a reset may find one half done) -------------------------------
    def start(self, p: int, to_dram: bool) -> bool:
        """Begin moving page ``p`` in steps that other requests may come between: copy it
        now (the host's writes then go to both copies), record its new tier and drop the
        old copy in :meth:`step`.  False when the page is already there."""
        if self.inflight:
            self._settle(p)
        m = self.media
        if bool(m.in_dram[p]) == to_dram:
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

    def step(self, p: int) -> bool:
        """The next step of page ``p``'s migration: record the new tier, then (the next
        call) drop the old copy.  True when the migration is done."""
        mig = self.inflight[p]
        if not mig.recorded:
            self.media.in_dram[p] = int(mig.to_dram)
            mig.recorded = True
            return False
        self._finish(p)
        return True

    def mirror(self, p: int, off: int, data: bytes | memoryview) -> None:
        """A write to a page being copied goes to the copy too (until the new tier is
        recorded the old copy is the page; after, the copy is): neither may go stale."""
        mig = self.inflight.get(p)
        if mig is not None and not mig.recorded:
            self._ends(mig.to_dram)[1].write(p, off, data)

    def settle_all(self) -> tuple[int, int]:
        """A reset: each migration in progress completes when its new tier is recorded and
        rolls back when not.  Returns (completed, rolled back)."""
        completed = rolled_back = 0
        for p, mig in list(self.inflight.items()):
            if mig.recorded:
                self._finish(p)
                completed += 1
            else:
                self._roll_back(p)
                rolled_back += 1
        return completed, rolled_back

    def _finish(self, p: int) -> None:
        mig = self.inflight.pop(p)
        src, _ = self._ends(mig.to_dram)
        src.drop(p)
        self._charge(*(("nvme", "dram") if mig.to_dram else ("dram", "nvme")))
        self.counters["migrations_to_dram" if mig.to_dram else "migrations_to_nvme"] += 1
        if mig.to_dram:
            self.media.maybe_direct(p)

    def _roll_back(self, p: int) -> None:
        """Undo a migration whose new tier is not recorded: the old copy is the page (the
        host's writes went to it), the new one is dropped."""
        mig = self.inflight.pop(p)
        _, dst = self._ends(mig.to_dram)
        dst.drop(p)
        self.counters["migrations_rolled_back"] += 1
        if not mig.to_dram:
            self.media.maybe_direct(p)

    def _settle(self, p: int) -> None:
        """Complete page ``p``'s migration in progress, if any (before another move)."""
        mig = self.inflight.get(p)
        if mig is not None:
            if not mig.recorded:
                self.step(p)
            self._finish(p)
