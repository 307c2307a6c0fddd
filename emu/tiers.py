"""The three media tiers below the policy: where every entry's bytes are, and what moving costs.

Tiers are exclusive and lossless: every entry that exists is in exactly one of
HBM (pinned or not), CXL DRAM or NVMe, and a read of an entry outside HBM is
served from its tier, never dropped.  HBM residency is decided by
:class:`kvcxl.firmware.cache.PolicyCache`; this module decides where an entry that
leaves HBM goes (placement), spills CXL DRAM to NVMe when CXL is full, and counts
the bytes moved between every pair of tiers.

The timing model (SPEC §9; analytic inputs, not measurements, all overridable):
an access to a tier costs ``latency + bytes / bandwidth``.  Defaults: HBM
8 TB/s (B200); CXL DRAM 200 ns + 64 GB/s; NVMe 25 µs + 14 GB/s (a PCIe Gen5 x4
drive; the seed gives no NVMe bandwidth).  The optional compute term is the
measured GB10 decode model ``73.9 ms + 17.58 ms · KV_GiB`` (Appendix L).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

from ..firmware.formulas import (
    TIER_CXL,
    TIER_HBM,
    TIER_HBM_PINNED,
    TIER_NAMES,
    TIER_NVME,
    placement_thresholds,
    placement_weighted,
)
from ..firmware.select import select_victims

HOST = 4  # source of newly written KV (the GPU producing it)
PAIR_NAMES = (*TIER_NAMES, "host")

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip


def parse_size(text: str | int | float, total: int | None = None) -> int:
    """``512MiB``, ``2GB``, ``4096`` (bytes) or ``25%`` (of ``total``) → bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text!r} is negative")
        return int(text)
    t = str(text).strip()
    if t.endswith("%"):
        try:
            pct = float(t[:-1])
        except ValueError:
            raise ValueError(f"size {text!r}: {t[:-1]!r} is not a number") from None
        if not 0 <= pct <= 100 or not np.isfinite(pct):
            raise ValueError(f"size {text!r}: a percentage must be in [0, 100]")
        if total is None:
            raise ValueError(f"size {text!r}: a percentage needs a workload to be relative to")
        return int(total * pct / 100)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)", t)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(
            f"size {text!r} is not understood: use bytes (4096), a unit (512MiB, 2GB) or a "
            "percentage of the workload's KV bytes (25%)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class TierTiming:
    """Per-access latency (ns) and bandwidth (GB/s = bytes/ns) of each tier."""

    hbm_latency_ns: float = 0.0
    hbm_gbps: float = 8000.0
    cxl_latency_ns: float = 200.0
    cxl_gbps: float = 64.0
    nvme_latency_ns: float = 25_000.0
    nvme_gbps: float = 14.0
    compute_model: bool = False  # add the GB10 decode model as compute time per step
    compute_base_ms: float = 73.9
    compute_ms_per_gib: float = 17.58

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if isinstance(v, bool):
                continue
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"tier timing {k} = {v!r}: must be finite and >= 0")
        for k in ("hbm_gbps", "cxl_gbps", "nvme_gbps"):
            if getattr(self, k) <= 0:
                raise ValueError(f"tier timing {k} = {getattr(self, k)!r}: must be > 0")

    def access_ns(self, tier: int, nbytes: float) -> float:
        """Time of one access of ``nbytes`` to ``tier`` (HBM for both HBM codes)."""
        if tier in (TIER_HBM, TIER_HBM_PINNED):
            return self.hbm_latency_ns + nbytes / self.hbm_gbps
        if tier == TIER_CXL:
            return self.cxl_latency_ns + nbytes / self.cxl_gbps
        return self.nvme_latency_ns + nbytes / self.nvme_gbps


class Tiers:
    """Tier of every entry, CXL/NVMe capacities, placement and the bytes-moved matrix."""

    def __init__(
        self,
        entry_bytes: int,
        cxl_entries: int,
        nvme_entries: int,
        *,
        placement: str = "policy",
        config=None,  # PolicyConfig: placement mode, thresholds, weights
        scored: bool = False,
    ) -> None:
        if placement not in ("policy", "fill"):
            raise ValueError(f"placement {placement!r}: must be 'policy' or 'fill'")
        self.entry_bytes = entry_bytes
        self.cap = {TIER_CXL: int(cxl_entries), TIER_NVME: int(nvme_entries)}
        self.placement = placement if scored else "fill"
        self.config = config
        self.tier = np.zeros(16, dtype=np.uint8)
        self.since = np.zeros(16, dtype=np.int64)  # time the entry entered its lower tier
        self.count = np.zeros(4, dtype=np.int64)  # entries per tier code
        self.moved = np.zeros((5, 4), dtype=np.int64)  # entries moved [from, to]; row 4: host
        self.n = 0

    def _ensure(self, n: int) -> None:
        if self.tier.size < n:
            size = max(n, 2 * self.tier.size)
            self.tier = np.concatenate([self.tier, np.zeros(size - self.tier.size, np.uint8)])
            self.since = np.concatenate([self.since, np.zeros(size - self.since.size, np.int64)])

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

    def demote(
        self,
        ids: NDArray,
        score: NDArray | None,
        idle: NDArray | None,
        anchor: NDArray | None,
        time: int,
    ) -> None:
        """``ids`` left HBM: place each in CXL DRAM or NVMe, then spill CXL if it is full."""
        if ids.size == 0:
            return
        dest = np.full(ids.size, TIER_CXL, dtype=np.uint8)
        cfg = self.config
        if self.placement == "policy" and cfg is not None and score is not None:
            if cfg.placement_mode == "thresholds":
                want = placement_thresholds(score, cfg.keep_threshold, cfg.evict_threshold)
            else:
                want = placement_weighted(
                    score,
                    idle if idle is not None else 0,
                    anchor,
                    cfg.beta,
                    cfg.placement_weights,
                    cfg.placement_cuts,
                )
            dest[np.asarray(want) == TIER_NVME] = TIER_NVME
        src = self.tier[ids]
        pairs = np.bincount(src.astype(np.int64) * 4 + dest, minlength=16)[:16].reshape(4, 4)
        self.moved[:4] += pairs
        self.count -= pairs.sum(axis=1)
        self.count += pairs.sum(axis=0)
        self.tier[ids] = dest
        self.since[ids] = time
        self._spill(time)

    def _spill(self, time: int) -> None:
        over = int(self.count[TIER_CXL] - self.cap[TIER_CXL])
        if over > 0:
            in_cxl = np.flatnonzero(self.tier[: self.n] == TIER_CXL)
            # Oldest arrivals in CXL DRAM go down first (ties: lower entry id).
            out = select_victims(in_cxl, -self.since[in_cxl], over, ordered=False)
            self.moved[TIER_CXL, TIER_NVME] += out.size
            self.count[TIER_CXL] -= out.size
            self.count[TIER_NVME] += out.size
            self.tier[out] = TIER_NVME
            self.since[out] = time
        if self.count[TIER_NVME] > self.cap[TIER_NVME]:
            raise ValueError(
                f"NVMe tier full: {int(self.count[TIER_NVME])} entries placed, capacity "
                f"{self.cap[TIER_NVME]} ({self.cap[TIER_NVME] * self.entry_bytes} B); "
                "raise --nvme or --cxl"
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
        m = (self.moved if moved is None else moved).copy()
        m[TIER_HBM] += m[TIER_HBM_PINNED]
        m[:, TIER_HBM] += m[:, TIER_HBM_PINNED]
        out = {}
        for a in (HOST, TIER_HBM, TIER_CXL, TIER_NVME):
            for b in (TIER_HBM, TIER_CXL, TIER_NVME):
                if a != b and m[a, b]:
                    out[f"{PAIR_NAMES[a]}->{PAIR_NAMES[b]}"] = int(m[a, b]) * self.entry_bytes
        return out

    def occupancy(self) -> dict[str, int]:
        return {
            "hbm": int(self.count[TIER_HBM] + self.count[TIER_HBM_PINNED]),
            "hbm_pinned": int(self.count[TIER_HBM_PINNED]),
            "cxl": int(self.count[TIER_CXL]),
            "nvme": int(self.count[TIER_NVME]),
        }
