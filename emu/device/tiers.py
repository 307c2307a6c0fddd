"""The device's media: its two tiers and what says where each DPA page is.

Device DRAM and NVMe each hold real bytes (:mod:`kvcxl.emu.device.media`'s stores); the
tier map names the tier of every page; a queue per tier times its accesses
(:mod:`kvcxl.emu.device.timing`); with a patched QEMU, the page-state table tells QEMU
which pages it may complete directly against the shared DRAM file (DIRECT: in DRAM, not
poisoned, not trapped).  Moving pages between the tiers is
:mod:`kvcxl.emu.device.migration`'s job; this module only holds them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ..timing import TierParams
from .errors import RequestError
from .media import DictStore, FileStore, MmapStore, TierMap
from .pagestate import PageState
from .poison import PoisonList
from .timing import TierQueue


class Media:
    """The DRAM and NVMe tiers of one device, its tier map and its page-state table."""

    def __init__(
        self,
        capacity: int,
        page_bytes: int,
        *,
        tiering: bool,
        poison: PoisonList,
        dram_file: str | Path | None,
        nvme_file: str | Path | None,
        tier_map_file: str | Path | None,
        page_state: str | Path | None,
        dram_timing: TierParams,
        nvme_timing: TierParams,
    ) -> None:
        self.capacity = capacity
        self.page_bytes = page_bytes
        self.page_shift = page_bytes.bit_length() - 1
        self.n_pages = capacity // page_bytes
        self.poison = poison
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
            0 if tiering else 1,
            path=tier_map_file or (f"{nvme_file}.tiers" if nvme_file else None),
        )
        self.in_dram = self.tier_map.bytes  # a bytearray, or the map file's mmap
        # Shared with a patched QEMU: which pages it may access directly in the DRAM file
        # (only with a DRAM file to share; every page traps without one).
        self.page_state = None
        self.trapped: set[int] = set()  # pages the firmware always wants to see
        if page_state is not None:
            self.page_state = PageState(page_state, self.n_pages, self.page_shift)
            if dram_file:
                self.page_state.set_all(np.frombuffer(self.in_dram, dtype=np.uint8) == 1)
        self.queues = {"dram": TierQueue(dram_timing), "nvme": TierQueue(nvme_timing)}
        # CXL.mem requests per DPA page (a patched QEMU's trapped accesses; its direct ones
        # are counted in the page-state table)
        self.host_accesses = np.zeros(self.n_pages, dtype=np.uint32)

    def ends(self, to_dram: bool) -> tuple:
        """(source store, destination store) of a move to DRAM or to NVMe."""
        return (self.nvme, self.dram) if to_dram else (self.dram, self.nvme)

    def pages_of(self, dpa: int, n: int) -> range:
        """The DPA pages of ``[dpa, dpa + n)``; a RequestError if it is not inside the device."""
        if n < 1 or dpa < 0 or dpa + n > self.capacity:
            raise RequestError(
                f"{n} B at DPA {dpa:#x} is outside the device's {self.capacity} bytes"
            )
        return range(dpa >> self.page_shift, ((dpa + n - 1) >> self.page_shift) + 1)

    def trap_page(self, p: int) -> None:
        """QEMU stops accessing page ``p`` directly: before its bytes move or turn poisoned."""
        if self.page_state is not None:
            self.page_state.trap(p)

    def trap(self, pages: range) -> None:
        """Every access to these pages comes to the device, even from a patched QEMU that
        could complete it against the shared DRAM file."""
        for p in pages:
            self.trapped.add(p)
            self.trap_page(p)

    def maybe_direct(self, p: int) -> None:
        """QEMU may access page ``p`` directly again: it is in the shared DRAM file and
        none of its lines is poisoned."""
        ps = self.page_state
        if ps is None or not isinstance(self.dram, MmapStore) or not self.in_dram[p]:
            return
        if p in self.trapped:
            return
        lines = self.page_bytes >> 6
        if self.poison.any_in(p * lines, (p + 1) * lines - 1):
            return
        ps.direct(p)

    def accesses(self) -> NDArray:
        """Host accesses per DPA page so far: trapped (here) plus direct (QEMU's counts)."""
        acc = self.host_accesses.astype(np.int64)
        if self.page_state is not None:
            acc += self.page_state.count
        return acc

    def kinds(self) -> dict[str, str]:
        """Where each part of the media lives: a file, or memory."""
        return {
            "dram": "file" if isinstance(self.dram, MmapStore) else "memory",
            "nvme": "file" if isinstance(self.nvme, FileStore) else "memory",
            "tier_map": "file" if self.tier_map.path else "memory",
        }

    def close(self) -> None:
        self.dram.close()
        self.nvme.close()
        if self.page_state is not None:
            self.page_state.close()
        self.tier_map.close()
