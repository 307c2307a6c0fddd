"""The timeline's resources, the stages of every move, and the timing presets (docs/timeline.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..timing import TierTiming

#: Moves between tiers, as the replay books them ("from->to").
CXL_HBM, NVME_HBM, HBM_CXL, HBM_NVME, CXL_NVME, NVME_CXL = (
    "cxl->hbm", "nvme->hbm", "hbm->cxl", "hbm->nvme", "cxl->nvme", "nvme->cxl",
)  # fmt: skip
#: Every move, in the order of its code in the array forms (log columns, schedule arrays).
MOVES = (CXL_HBM, NVME_HBM, HBM_CXL, HBM_NVME, CXL_NVME, NVME_CXL)
WRITE_BACKS = (HBM_CXL, HBM_NVME)
#: The resources, in the order of their code in the array forms (:meth:`Resources.servers`).
RESOURCE_NAMES = ("link_rd", "link_wr", "dram", "nvme")
#: Scheduling classes: lower goes first (docs/timeline.md, "Discipline").
DEMAND, PREFETCH, BACKGROUND = 0, 1, 2
#: NVMe commands whose latency the drive overlaps (assumption: Gen5 data-centre drives reach
#: their bandwidth at queue depths of 32-128).
NVME_QUEUE_DEPTH = 128
#: Device DRAM servers: assumed provisioned to serve both link directions at once.
DRAM_SERVERS = 2


@dataclass(frozen=True)
class Resources:
    """Bandwidth (GB/s = bytes/ns per server), latency and servers of every resource."""

    link_gbps: float
    dram_gbps: float
    dram_latency_ns: float
    nvme_gbps: float
    nvme_latency_ns: float
    nvme_queue_depth: int = NVME_QUEUE_DEPTH
    dram_servers: int = DRAM_SERVERS

    def __post_init__(self) -> None:
        for k in ("link_gbps", "dram_gbps", "nvme_gbps"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{k} = {v!r}: must be finite and > 0")
        for k in ("dram_latency_ns", "nvme_latency_ns"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{k} = {v!r}: must be finite and >= 0")
        for k in ("nvme_queue_depth", "dram_servers"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} = {getattr(self, k)!r}: must be >= 1")

    @classmethod
    def of(cls, t: TierTiming) -> Resources:
        """The resources of a run's tier timing: the link and the DRAM at the CXL tier's
        bandwidth, the DRAM at its latency, the NVMe at its own."""
        return cls(t.cxl_gbps, t.cxl_gbps, t.cxl_latency_ns, t.nvme_gbps, t.nvme_latency_ns)

    def servers(self) -> dict[str, int]:
        """Servers per resource name."""
        return dict(zip(RESOURCE_NAMES, (1, 1, self.dram_servers, 1), strict=True))

    def gbps(self) -> dict[str, float]:
        """Bandwidth per server, per resource name."""
        bw = (self.link_gbps, self.link_gbps, self.dram_gbps, self.nvme_gbps)
        return dict(zip(RESOURCE_NAMES, bw, strict=True))


def stages(move: str, entries: int, res: Resources) -> list[tuple[float, tuple[str, ...]]]:
    """The stages (latency ns, resources) of moving ``entries`` entries (docs/timeline.md)."""
    if entries < 1:
        raise ValueError(f"a transfer of {entries} entries: must be >= 1")
    nvme = math.ceil(entries / res.nvme_queue_depth) * res.nvme_latency_ns
    dram = res.dram_latency_ns
    table = {
        CXL_HBM: [(dram, ("dram", "link_rd"))],
        NVME_HBM: [(nvme, ("nvme",)), (0.0, ("link_rd",))],
        HBM_CXL: [(dram, ("link_wr", "dram"))],
        HBM_NVME: [(0.0, ("link_wr",)), (nvme, ("nvme",))],
        CXL_NVME: [(dram, ("dram",)), (nvme, ("nvme",))],
        NVME_CXL: [(nvme, ("nvme",)), (dram, ("dram",))],
    }
    if move not in table:
        raise ValueError(f"move {move!r}: must be one of {', '.join(table)}")
    return table[move]


# --- presets ------------------------------------------------------------------------------
#: The local DDR reference the measured ratios scale (docs/timeline.md, "Presets"): the
#: components of the design's 200 ns CXL.mem budget a local access also has (request issue
#: 15 + DDR5-5600 array 80 + return 20 ns) and the design's mid-range 64 GB/s.
LOCAL_DDR_LATENCY_NS = 15.0 + 80.0 + 20.0
LOCAL_DDR_GBPS = 64.0


@dataclass(frozen=True)
class Preset:
    """A CXL tier timing with its evidence class and source."""

    name: str
    cxl_latency_ns: float
    cxl_gbps: float
    evidence: str
    source: str

    def timing(self, base: TierTiming | None = None) -> TierTiming:
        """``base`` (default: the defaults) with this preset's CXL latency and bandwidth."""
        from dataclasses import replace

        return replace(base or TierTiming(), cxl_latency_ns=self.cxl_latency_ns,
                       cxl_gbps=self.cxl_gbps)  # fmt: skip


_RATIOS = "External literature (the paper's measured ratios) × the Design target reference"
PRESETS: dict[str, Preset] = {
    "seed": Preset(
        "seed", 200.0, 64.0, "Design target",
        "the design's CXL.mem budget (unloaded component latencies, 200 ns) and its "
        "specification-derived 32-121 GB/s bracket, 64 GB/s the mid-range assumption",
    ),
    "asic": Preset(
        "asic", 2.18 * LOCAL_DDR_LATENCY_NS, 0.825 * LOCAL_DDR_GBPS, _RATIOS,
        "CXL-DMSim (arXiv 2411.02282): ASIC CXL memory expander measured with LMbench and "
        "STREAM at ~2.18x local DDR latency and 82-83 % of its bandwidth",
    ),
    "fpga": Preset(
        "fpga", 2.88 * LOCAL_DDR_LATENCY_NS, 0.57 * LOCAL_DDR_GBPS, _RATIOS,
        "CXL-DMSim (arXiv 2411.02282): FPGA CXL memory expander at ~2.88x local DDR latency "
        "and 45-69 % of its bandwidth (0.57: the middle of the range)",
    ),
}  # fmt: skip


# --- the host-DRAM offload baseline (docs/timeline.md, "Host offload") -------------------
#: PCIe Gen5 x16 link-level bandwidth the design's offload baseline starts from (GB/s).
PCIE_GEN5_X16_GBPS = 51.0
#: The design's PCIe DMA path per transfer (driver and doorbell, descriptor, pinning, round
#: trip, host DRAM, payload, completion): 13.0 µs, an unmeasured Analytical model budget.
PCIE_DMA_LATENCY_NS = 13_000.0
#: The measured fraction the design holds against its 0.32 contention factor: achieved
#: streaming bandwidth at 87 % of spec (GB10 LPDDR5X, not PCIe: the closest measurement).
MEASURED_FRACTION = 0.87


def offload_preset(contention: float) -> Preset:
    """Host-DRAM offload over PCIe (what vLLM's CPU offload and LMCache do): KV outside HBM
    is reached by DMA at ``contention`` × 51 GB/s with the 13.0 µs DMA path per transfer."""
    if not 0 < contention <= 1:
        raise ValueError(f"pcie_contention = {contention!r}: must be in (0, 1]")
    return Preset(
        f"offload-{contention:g}", PCIE_DMA_LATENCY_NS, contention * PCIE_GEN5_X16_GBPS,
        "Analytical model",
        f"host DRAM over PCIe Gen5 x16 by DMA: {contention:g} × {PCIE_GEN5_X16_GBPS:g} GB/s "
        f"(pcie_contention; the design's 0.32, or the measured {MEASURED_FRACTION:g}) and the "
        "design's 13.0 µs DMA path per transfer",
    )  # fmt: skip
