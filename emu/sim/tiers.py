"""The three media tiers below the policy: where every entry's bytes are, and what moving costs.

Tiers are exclusive and lossless: every entry that exists is in exactly one of
HBM (pinned or not), CXL DRAM or NVMe, and a read of an entry outside HBM is
served from its tier, never dropped.  What stays in HBM and where an entry that
leaves it goes (placement), which CXL DRAM entries go down to NVMe when CXL DRAM
is full, and the background moves of managed tiers are the firmware session's
decisions (:class:`kvcxl.firmware.session.FirmwareSession`, its
:class:`~kvcxl.firmware.tiering.LowerTiers`); this module carries them out and
counts the bytes moved between every pair of tiers.

What an access to a tier costs (latency + bytes / bandwidth, the defaults, the
optional compute term) is :mod:`kvcxl.emu.timing`, shared with the device emulator.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware.formulas import (
    TIER_CXL,
    TIER_HBM,
    TIER_HBM_PINNED,
    TIER_NAMES,
    TIER_NVME,
)

HOST = 4  # source of newly written KV (the GPU producing it)
PAIR_NAMES = (*TIER_NAMES, "host")
# The pairs bytes_moved reports, in its order: from host, HBM, CXL, NVMe to another tier.
_PAIRS = [(a, b) for a in (HOST, TIER_HBM, TIER_CXL, TIER_NVME)
          for b in (TIER_HBM, TIER_CXL, TIER_NVME) if a != b]  # fmt: skip
_PAIR_FROM = np.array([a for a, _ in _PAIRS])
_PAIR_TO = np.array([b for _, b in _PAIRS])
_PAIR_KEYS = [f"{PAIR_NAMES[a]}->{PAIR_NAMES[b]}" for a, b in _PAIRS]


class Tiers:
    """Tier of every entry, CXL/NVMe capacities, placement and the bytes-moved matrix."""

    def __init__(
        self, entry_bytes: int, cxl_entries: int, nvme_entries: int, size: int = 16
    ) -> None:
        """``size``: entries to make room for up front (more are added as created)."""
        self.entry_bytes = entry_bytes
        self.cap = {TIER_CXL: int(cxl_entries), TIER_NVME: int(nvme_entries)}
        self.tier = np.zeros(max(size, 16), dtype=np.uint8)
        self.count = np.zeros(4, dtype=np.int64)  # entries per tier code
        self.moved = np.zeros((5, 4), dtype=np.int64)  # entries moved [from, to]; row 4: host
        self.n = 0

    def _ensure(self, n: int) -> None:
        if self.tier.size < n:
            size = max(n, 2 * self.tier.size)
            self.tier = np.concatenate([self.tier, np.zeros(size - self.tier.size, np.uint8)])

    def create(self, ids: NDArray) -> None:
        """New entries written into HBM by the host."""
        self._ensure(int(ids.max()) + 1 if ids.size else 0)
        self.n = max(self.n, int(ids.max()) + 1 if ids.size else 0)
        self.tier[ids] = TIER_HBM
        self.count[TIER_HBM] += ids.size
        self.moved[HOST, TIER_HBM] += ids.size

    def promote(self, ids: NDArray) -> NDArray:
        """``ids`` (unique, outside HBM) move into HBM; returns the tier each came from."""
        src = self.tier[ids].copy()
        by_src = np.bincount(src, minlength=4)[:4]
        self.moved[:4, TIER_HBM] += by_src
        self.count -= by_src
        self.tier[ids] = TIER_HBM
        self.count[TIER_HBM] += ids.size
        return src

    def demote(self, ids: NDArray, dest: NDArray) -> None:
        """``ids`` left HBM for ``dest`` (CXL DRAM or NVMe, as placement decided)."""
        if ids.size == 0:
            return
        dest = np.asarray(dest, dtype=np.uint8)
        src = self.tier[ids]
        pairs = np.bincount(src.astype(np.int64) * 4 + dest, minlength=16)[:16].reshape(4, 4)
        self.moved[:4] += pairs
        self.count -= pairs.sum(axis=1)
        self.count += pairs.sum(axis=0)
        self.tier[ids] = dest
        self._check_nvme()

    def move(self, ids: NDArray, src: int, dst: int) -> None:
        """``ids`` (all in tier ``src``) move to tier ``dst``: a lower-tier move the firmware
        decided (CXL DRAM overflow, managed tiers' background moves)."""
        if ids.size == 0:
            return
        if not np.all(self.tier[ids] == src):
            raise AssertionError(f"a move from tier {TIER_NAMES[src]} of an entry not in it")
        self.moved[src, dst] += ids.size
        self.count[src] -= ids.size
        self.count[dst] += ids.size
        self.tier[ids] = dst
        self._check_nvme()

    def _check_nvme(self) -> None:
        # The firmware moves an entry into NVMe only into its free room (docs/policy.md,
        # "Room below HBM"), and a workload that cannot fit is refused up front: an
        # overfull NVMe is a defect of the engine, not of the input.
        if self.count[TIER_NVME] > self.cap[TIER_NVME]:
            raise AssertionError(
                f"NVMe over capacity: {int(self.count[TIER_NVME])} entries placed, capacity "
                f"{self.cap[TIER_NVME]}"
            )

    # --- checks and reports ------------------------------------------------------------
    def check(self, n_created: int, hbm_resident: int, hbm_capacity: int) -> None:
        """Invariants: every entry in one tier, counts match, no tier over capacity."""
        t = self.tier[:n_created]
        counts = np.bincount(t, minlength=4)
        if not np.array_equal(counts, self.count):
            raise AssertionError(f"tier counts drifted: {counts.tolist()} vs {self.count.tolist()}")
        if counts.sum() != n_created:
            raise AssertionError("an entry is in no tier")
        hbm = int(counts[TIER_HBM] + counts[TIER_HBM_PINNED])
        if hbm != hbm_resident:
            raise AssertionError(f"HBM holds {hbm} entries, the cache says {hbm_resident}")
        if hbm > hbm_capacity:
            raise AssertionError(f"HBM over budget: {hbm} > {hbm_capacity}")
        if counts[TIER_CXL] > self.cap[TIER_CXL] or counts[TIER_NVME] > self.cap[TIER_NVME]:
            raise AssertionError("a lower tier is over capacity")

    def bytes_moved(self, moved: NDArray | None = None) -> dict[str, int]:
        """Bytes moved per tier pair, ``"from->to"`` (pinned HBM counted as HBM), of
        ``moved`` (an entries-moved matrix like :attr:`moved`; default: everything so far)."""
        return self.bytes_moved_rows([self.moved if moved is None else moved])[0]

    def bytes_moved_rows(self, moved: NDArray) -> list[dict[str, int]]:
        """:meth:`bytes_moved` of every matrix in ``moved`` (one per read step), merged and
        scaled in one numpy pass: the per-step books of a short replay would otherwise cost
        more than its loop.  Pairs in the order HOST, HBM, CXL, NVMe (from) by HBM, CXL,
        NVMe (to); a pair no bytes moved between is left out."""
        m = np.array(moved, dtype=np.int64)  # (steps, 5, 4), a copy
        m[:, TIER_HBM] += m[:, TIER_HBM_PINNED]
        m[:, :, TIER_HBM] += m[:, :, TIER_HBM_PINNED]
        vals = m[:, _PAIR_FROM, _PAIR_TO] * self.entry_bytes
        used = np.flatnonzero(vals.any(axis=0))  # the pairs any step moved bytes between
        keys = [_PAIR_KEYS[k] for k in used.tolist()]
        vals = vals[:, used]
        full = vals.all(axis=1).tolist()  # rows that moved bytes between every used pair
        out = []
        for row, every in zip(vals.tolist(), full, strict=True):  # (no comprehension frame)
            if every:  # (dict over zip runs in C: most steps of a replay)
                out.append(dict(zip(keys, row, strict=True)))
                continue
            d = {}
            for k, v in zip(keys, row, strict=True):
                if v:
                    d[k] = v
            out.append(d)
        return out

    def occupancy(self) -> dict[str, int]:
        return {
            "hbm": int(self.count[TIER_HBM] + self.count[TIER_HBM_PINNED]),
            "hbm_pinned": int(self.count[TIER_HBM_PINNED]),
            "cxl": int(self.count[TIER_CXL]),
            "nvme": int(self.count[TIER_NVME]),
        }
