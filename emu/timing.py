"""The media tiers' timing parameters: one definition for the simulator and the device.

An access of ``n`` bytes to a tier costs ``latency + n / bandwidth``.  The defaults are
analytic inputs, not measurements (docs/simulator.md, "Timing model and metrics"):

========  ===========  ==========  ==========================================
tier      latency      bandwidth   source
========  ===========  ==========  ==========================================
HBM       0            8 TB/s      B200
CXL DRAM  200 ns       64 GB/s     a CXL Type-3 memory expander
NVMe      25 µs        14 GB/s     a PCIe Gen5 x4 drive
========  ===========  ==========  ==========================================

The simulator costs every access analytically with :class:`TierTiming` (one set of
overridable parameters per run, plus the optional GB10 decode model as compute time);
the device emulator puts a queueing server on top of the same :class:`TierParams` per
tier (:mod:`kvcxl.emu.device.timing`).  It imports only the firmware's tier codes, so
both import it without a cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM, TIER_HBM_PINNED, TIER_NVME


@dataclass(frozen=True)
class TierParams:
    """One tier's fixed latency (ns) and bandwidth (GB/s = bytes per ns)."""

    name: str
    latency_ns: float
    bandwidth_gbps: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_ns) and self.latency_ns >= 0):
            raise ValueError(
                f"{self.name}_latency_ns = {self.latency_ns!r}: must be finite and >= 0"
            )
        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise ValueError(f"{self.name}_gbps = {self.bandwidth_gbps!r}: must be finite and > 0")

    def access_ns(self, nbytes: float) -> float:
        """Time of one access of ``nbytes`` without queueing: latency + nbytes / bandwidth."""
        return self.latency_ns + nbytes / self.bandwidth_gbps


HBM = TierParams("hbm", 0.0, 8000.0)
CXL_DRAM = TierParams("cxl", 200.0, 64.0)
NVME = TierParams("nvme", 25_000.0, 14.0)
#: The design's CXL tier bandwidth bracket (specification-derived, GB/s): CXL 3.0 x16 one
#: direction, the mid-range working assumption, the pessimistic end.  Swept, as it asks.
CXL_GBPS_SWEEP = (121.0, CXL_DRAM.bandwidth_gbps, 32.0)

#: The GB10 decode model (measured): a step costs 73.9 ms + 17.58 ms per GiB of KV read.
COMPUTE_BASE_MS = 73.9
COMPUTE_MS_PER_GIB = 17.58


@dataclass(frozen=True)
class TierTiming:
    """The simulator's timing inputs: every tier's :class:`TierParams`, field by field.

    Flat fields so that a run's overrides (``--cxl-gbps``, a sweep's ``timing`` table)
    name one number each; :meth:`tier` gives a tier's :class:`TierParams`.
    """

    hbm_latency_ns: float = HBM.latency_ns
    hbm_gbps: float = HBM.bandwidth_gbps
    cxl_latency_ns: float = CXL_DRAM.latency_ns
    cxl_gbps: float = CXL_DRAM.bandwidth_gbps
    nvme_latency_ns: float = NVME.latency_ns
    nvme_gbps: float = NVME.bandwidth_gbps
    compute_model: bool = False  # add the GB10 decode model as compute time per step
    compute_base_ms: float = COMPUTE_BASE_MS
    compute_ms_per_gib: float = COMPUTE_MS_PER_GIB

    def __post_init__(self) -> None:
        for code in (TIER_HBM, TIER_CXL, TIER_NVME):
            self.tier(code)  # validates latency and bandwidth
        for k in ("compute_base_ms", "compute_ms_per_gib"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{k} = {v!r}: must be finite and >= 0")

    def tier(self, code: int) -> TierParams:
        """The parameters of tier ``code`` (HBM for both HBM codes)."""
        if code in (TIER_HBM, TIER_HBM_PINNED):
            return TierParams("hbm", self.hbm_latency_ns, self.hbm_gbps)
        if code == TIER_CXL:
            return TierParams("cxl", self.cxl_latency_ns, self.cxl_gbps)
        return TierParams("nvme", self.nvme_latency_ns, self.nvme_gbps)

    def access_ns(self, tier: int, nbytes: float) -> float:
        """Time of one access of ``nbytes`` to ``tier`` (HBM for both HBM codes)."""
        if tier in (TIER_HBM, TIER_HBM_PINNED):
            return self.hbm_latency_ns + nbytes / self.hbm_gbps
        if tier == TIER_CXL:
            return self.cxl_latency_ns + nbytes / self.cxl_gbps
        return self.nvme_latency_ns + nbytes / self.nvme_gbps
