"""The tiers below HBM as the firmware sees them: where each entry lives, and what moves.

The firmware session (:mod:`kvcxl.firmware.session`) owns one :class:`LowerTiers`.  It
records, for every entry that exists, whether it is in HBM, CXL DRAM or NVMe, and
decides the moves between the two lower tiers (docs/policy.md, "Tiers below HBM"):

* **CXL DRAM overflow** (``cxl_order``): when CXL DRAM holds more than its capacity,
  the surplus goes down to NVMe — ``"fifo"``: the earliest arrivals first (ties: lower
  id); ``"policy"``: the running policy's own eviction order (priority descending, ties
  lower id), so the policy ranks CXL DRAM as it ranks HBM.
* **Background moves** (``tier_management = "managed"``, at a step boundary, at most
  ``background_moves`` entries): the session hands the candidates (``sink``: CXL DRAM →
  NVMe, lowest placement value first, only into free NVMe room; ``raise_``: NVMe → CXL
  DRAM, highest first, only into free CXL room); demotions go first since they free room
  for raises.
* **Room** (docs/policy.md, "Room below HBM"): no move overfills a tier.  A move into NVMe
  takes only NVMe's free room, and a move out of HBM that capacity does not force takes
  only the free room of CXL DRAM and NVMe together (:meth:`LowerTiers.room_below`).

Drivers (the simulator's media, the device's pages) carry the moves out; they do not
decide any.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .formulas import TIER_CXL, TIER_HBM, TIER_NVME
from .select import select_victims
from .table import grow

NONE = 255  # an id no entry has been created for yet


class LowerTiers:
    """Tier of every entry (HBM, CXL DRAM, NVMe), CXL DRAM's capacity, and its arrivals."""

    def __init__(self, cxl_capacity: int | None = None, nvme_capacity: int | None = None) -> None:
        """``cxl_capacity``, ``nvme_capacity``: entries CXL DRAM and NVMe hold (None:
        unbounded)."""
        for name, cap in (("cxl_capacity", cxl_capacity), ("nvme_capacity", nvme_capacity)):
            if cap is not None and cap < 0:
                raise ValueError(f"{name} = {cap}: must be >= 0 entries")
        self.cxl_capacity = cxl_capacity
        self.nvme_capacity = nvme_capacity
        self.tier = np.full(16, NONE, dtype=np.uint8)
        self.since = np.zeros(16, dtype=np.int64)  # when it arrived in its lower tier
        self.n_cxl = 0
        self.n_nvme = 0

    def _ensure(self, n: int) -> None:
        self.tier = grow(self.tier, n, NONE)
        self.since = grow(self.since, n, 0)

    def in_hbm(self, ids: NDArray) -> None:
        """``ids`` are now in HBM (written, read in, prefetched)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self._ensure(int(ids.max()) + 1)
        self.n_cxl -= int(np.count_nonzero(self.tier[ids] == TIER_CXL))
        self.n_nvme -= int(np.count_nonzero(self.tier[ids] == TIER_NVME))
        self.tier[ids] = TIER_HBM

    def arrive(self, ids: NDArray, dest: NDArray, time: int) -> None:
        """``ids`` arrive in ``dest`` (CXL DRAM or NVMe) at batch time ``time``."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self._ensure(int(ids.max()) + 1)
        dest = np.broadcast_to(np.asarray(dest, dtype=np.uint8), ids.shape)
        was = self.tier[ids]
        self.n_cxl += int(np.count_nonzero(dest == TIER_CXL)) - int(
            np.count_nonzero(was == TIER_CXL)
        )
        self.n_nvme += int(np.count_nonzero(dest == TIER_NVME)) - int(
            np.count_nonzero(was == TIER_NVME)
        )
        self.tier[ids] = dest
        self.since[ids] = time

    def where(self, ids: NDArray) -> NDArray:
        return self.tier[np.asarray(ids, dtype=np.int64)]

    def members(self, tier: int) -> NDArray:
        return np.flatnonzero(self.tier == tier)

    def overflow(self) -> int:
        """Entries CXL DRAM holds beyond its capacity."""
        if self.cxl_capacity is None:
            return 0
        return max(self.n_cxl - self.cxl_capacity, 0)

    def room(self) -> int:
        """Free CXL DRAM entries (a large number when unbounded)."""
        if self.cxl_capacity is None:
            return 1 << 62
        return max(self.cxl_capacity - self.n_cxl, 0)

    def nvme_room(self) -> int:
        """Free NVMe entries (a large number when unbounded)."""
        if self.nvme_capacity is None:
            return 1 << 62
        return max(self.nvme_capacity - self.n_nvme, 0)

    def room_below(self) -> int:
        """Free entries of CXL DRAM and NVMe together: the most entries a move out of HBM
        that capacity does not force may take."""
        return min(self.room() + self.nvme_room(), 1 << 62)

    def spill_order(self, over: int, priority: NDArray | None) -> NDArray:
        """The ``over`` CXL DRAM entries that go down to NVMe: by ``priority`` (the policy's,
        highest first) or, when None, by arrival (earliest first); ties to the lower id."""
        in_cxl = self.members(TIER_CXL)
        key = -self.since[in_cxl] if priority is None else priority
        return select_victims(in_cxl, key, over, ordered=True)


def background_plan(
    in_cxl: NDArray,
    cxl_value: NDArray,
    cxl_sinks: NDArray,
    in_nvme: NDArray,
    nvme_value: NDArray,
    nvme_rises: NDArray,
    budget: int,
    room: int,
    nvme_room: int = 1 << 62,
) -> tuple[NDArray, NDArray]:
    """The step boundary's background moves: (to NVMe, to CXL DRAM).

    ``cxl_sinks`` marks the CXL DRAM entries placement sends down (lowest ``cxl_value``
    first, ties lower id), at most ``nvme_room`` of them (the rest wait in CXL DRAM);
    ``nvme_rises`` the NVMe entries it brings up (highest ``nvme_value`` first, ties lower
    id), into at most ``room`` free CXL entries plus what the demotions free.  At most
    ``budget`` moves in all, demotions first.
    """
    down_ids = in_cxl[cxl_sinks]
    down = select_victims(
        down_ids, -np.asarray(cxl_value)[cxl_sinks], min(budget, nvme_room), ordered=True
    )
    left = budget - down.size
    up_ids = in_nvme[nvme_rises]
    up_k = min(left, room + down.size)
    up = select_victims(up_ids, np.asarray(nvme_value)[nvme_rises], up_k, ordered=True)
    return down, up


__all__ = ["NONE", "TIER_CXL", "TIER_HBM", "TIER_NVME", "LowerTiers", "background_plan"]
