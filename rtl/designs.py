"""The RTL design registry: one entry per design, read by every command and tool.

An entry names the design's factory (the Amaranth component, imported when built),
its Verilog module name, the parameters ``kvcxl rtl verilog`` builds it with and which
of them the command line's shape options set, the reset tables it is loaded with,
its bounded formal checks (harnesses in :mod:`kvcxl.rtl.formal`) with the defects
each must catch, and its testbench: the cocotb module and the model module in
``tb/`` (named here, imported only by the testbench: the RTL never imports ``tb``).

``kvcxl rtl verilog``, ``kvcxl rtl formal``, ``kvcxl rtl test``, :func:`export.build`
and the testbench runner all read :data:`DESIGNS`; adding an engine is its module,
its model, its bench and its line here (docs/architecture.md).

Standard library only, so that the command line lists designs and checks without
loading Amaranth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The command line's shape options (kvcxl rtl verilog --entries/--lanes/...).
SHAPE_OPTIONS = ("entries", "lanes", "batch", "layers", "heads", "blocks")


@dataclass(frozen=True)
class Design:
    """One RTL design and everything the tools need to know about it."""

    name: str
    module: str  # the Verilog module name
    summary: str
    factory: Callable[..., Any]  # **params -> the Amaranth component
    defaults: dict[str, int] = field(default_factory=dict)  # kvcxl rtl verilog's parameters
    decay: bool = False  # loaded with the firmware's decay table (decay_init)
    formal: dict[str, tuple[str, ...]] = field(default_factory=dict)  # check -> its defects
    # the defects a whole-trace replay (`kvcxl rtl sim --check`) stops, the first planted by
    # a bare --defect; the others change no replay's victims, and only `formal` sees them
    replay: tuple[str, ...] = ()
    sim_policy: str | None = None  # the `kvcxl rtl sim --policy` this design replays
    bench: str | None = None  # the cocotb module in tb/ (kvcxl.tb.<bench>)
    model: str | None = None  # its model in tb/ (kvcxl.tb.<model>: params() builds the DUT)
    bench_count: tuple[str, int] = ("steps", 0)  # what `kvcxl rtl test --steps` sets; default

    def shape(self) -> tuple[str, ...]:
        """The command line's shape options this design takes."""
        return tuple(k for k in SHAPE_OPTIONS if k in self.defaults)


# --- factories: the Amaranth import happens when a design is built ----------------------


def _core(**p: Any) -> Any:
    from .core import PolicyCore

    return PolicyCore(
        p["entries"], p.get("lanes", 1), p.get("batch", 8),
        decay_init=p.get("decay_init"), defect=p.get("defect"),
    )  # fmt: skip


def _scoring(**p: Any) -> Any:
    from .scoring import ScoringEngine

    return ScoringEngine(
        p["entries"], p.get("lanes", 1), decay_init=p.get("decay_init"), defect=p.get("defect")
    )


def _eviction(**p: Any) -> Any:
    from .eviction import EvictionEngine

    return EvictionEngine(
        p["entries"], p.get("lanes", 1), p.get("batch", 8), defect=p.get("defect")
    )


def _prefetch(**p: Any) -> Any:
    from .prefetch import PrefetchEngine

    return PrefetchEngine(**p)


def _frontend(**p: Any) -> Any:
    from .frontend import CxlMemFrontEnd

    return CxlMemFrontEnd(**p)


def _hdm(**p: Any) -> Any:
    from .hdm import HdmDecode

    return HdmDecode(**p)


def _slot_queue(policy: str) -> Callable[..., Any]:
    def factory(**p: Any) -> Any:
        from .slot_queue import SlotQueueEngine

        return SlotQueueEngine(p["entries"], policy, defect=p.get("defect"))

    return factory


def _s3fifo(**p: Any) -> Any:
    from .s3fifo import S3FifoEngine

    return S3FifoEngine(p["entries"], p["ids"], defect=p.get("defect"))


def _tier_boundary(**p: Any) -> Any:
    from .tier_boundary import TierBoundary

    return TierBoundary(p["entries"], p.get("lanes", 1), p.get("batch", 8), defect=p.get("defect"))


def _record_stream(**p: Any) -> Any:
    from .record_stream import RecordStreamEngine

    return RecordStreamEngine(
        p["entries"], p.get("lanes", 1), p.get("batch", 8), p.get("burst", 16),
        decay_init=p.get("decay_init"), defect=p.get("defect"),
    )  # fmt: skip


def _top(**p: Any) -> Any:
    from .top import PolicyEngine

    return PolicyEngine(**p)


_CORE_SHAPE = {"entries": 1024, "lanes": 1, "batch": 64}

_ALL = (
    Design("core", "policy_core", "scoring → eviction", _core, dict(_CORE_SHAPE), decay=True,
           bench="cocotb_policy_core", model="policy_uvm", bench_count=("steps", 2000)),
    Design("eviction", "eviction_engine", "the EvictionEngine alone", _eviction,
           dict(_CORE_SHAPE),
           formal={"eviction": ("tie_off_by_one",), "eviction_1lane": ("skip_drain",)}),
    Design("scoring", "scoring_engine", "the ScoringEngine alone", _scoring,
           {"entries": 1024, "lanes": 1}, decay=True, formal={"scoring": ("ignore_pinned",)}),
    Design("prefetch", "prefetch_engine", "the PrefetchEngine alone", _prefetch,
           {"layers": 8, "heads": 2, "blocks": 16}, bench="cocotb_prefetch",
           model="prefetch_model", bench_count=("touches", 6)),
    Design("frontend", "cxl_mem_front_end", "the CXL.mem front end with its HDM decoder",
           _frontend, {"entries": 1024},
           formal={"frontend": ("lose_request", "drop_on_stall", "duplicate_response")},
           bench="cocotb_frontend", model="frontend_model", bench_count=("messages", 150)),
    Design("hdm", "hdm_decode", "the HDM decoder (HPA → DPA) alone", _hdm,
           formal={"hdm": ("mis_interleave",)}),
    Design("top", "policy_engine",
           "CXL.mem front end + weight buffer + core + prefetch (--layers/--heads/--blocks)",
           _top, {"layers": 4, "heads": 2, "blocks": 8, "lanes": 1, "batch": 64}, decay=True,
           replay=("tie_off_by_one",), sim_policy="ema",
           bench="cocotb_top", model="top_model", bench_count=("steps", 12)),
    Design("clock", "clock_engine",
           "CLOCK: a pointer walk over linked slots (--entries slots; firmware/golden_clock.py)",
           _slot_queue("clock"), {"entries": 1024},
           formal={"clock": ("victim_unoffered", "stuck_hand", "clock_clears")},
           replay=("victim_unoffered",), sim_policy="clock",
           bench="cocotb_slot_queue", model="slot_queue_model", bench_count=("commands", 400)),
    Design("sieve", "sieve_engine",
           "SIEVE: a hand over linked slots (--entries slots; firmware/golden_clock.py)",
           _slot_queue("sieve"), {"entries": 1024},
           formal={"sieve": ("keep_visited", "clear_stays")}, replay=("victim_unoffered",),
           sim_policy="sieve",
           bench="cocotb_slot_queue", model="slot_queue_model", bench_count=("commands", 400)),
    Design("s3fifo", "s3fifo_engine",
           "S3-FIFO: small and main queues over linked slots, an exact ghost of ids "
           "(--entries slots; firmware/golden_s3fifo.py)",
           _s3fifo, {"entries": 1024, "ids": 4096},
           formal={"s3fifo": ("offer_ignored", "stuck_cursor", "main_clears")},
           replay=("offer_ignored",), sim_policy="s3fifo",
           bench="cocotb_slot_queue", model="s3fifo_model", bench_count=("commands", 400)),
    Design("tier_boundary", "tier_boundary",
           "managed tiers' step boundary: CXL DRAM ↔ NVMe moves (firmware/tiering.py)",
           _tier_boundary, {"entries": 1024, "lanes": 1, "batch": 64},
           formal={"tier_boundary": ("sink_at_threshold", "ups_ignore_downs")},
           bench="cocotb_tier_boundary", model="tier_boundary_model", bench_count=("plans", 60)),
    Design("record_stream", "record_stream_engine",
           "EMA scoring + top-k with the records in device DRAM (burst memory port)",
           _record_stream, {"entries": 1024, "lanes": 4, "batch": 64}, decay=True,
           formal={"record_stream": ("hold_writes", "lose_word", "early_done")},
           replay=("early_done",), sim_policy="ema --records dram",
           bench="cocotb_record_stream", model="record_stream_model", bench_count=("sweeps", 24)),
)  # fmt: skip

DESIGNS: dict[str, Design] = {d.name: d for d in _ALL}

# The bounded checks ``kvcxl rtl formal`` runs, and the check that must catch each defect.
CHECKS: tuple[str, ...] = tuple(c for d in _ALL for c in d.formal)
DEFECTS: dict[str, str] = {x: c for d in _ALL for c, xs in d.formal.items() for x in xs}


def get(name: str) -> Design:
    """The design called ``name``; a clear error listing the others."""
    try:
        return DESIGNS[name]
    except KeyError:
        raise ValueError(f"design = {name!r}: must be one of {', '.join(DESIGNS)}") from None


def check_shape(design: Design, params: dict[str, Any]) -> None:
    """Refuse a shape whose entries do not split into whole groups of lanes."""
    lanes = params.get("lanes")
    if not lanes:
        return
    if "entries" in design.defaults and params["entries"] % lanes:
        raise ValueError(f"--entries {params['entries']} must be a multiple of --lanes {lanes}")
    if {"layers", "heads", "blocks"} <= design.defaults.keys():
        entries = params["layers"] * params["heads"] * params["blocks"]
        if entries % lanes:
            raise ValueError(
                f"layers·heads·blocks = {entries} must be a multiple of --lanes {lanes}"
            )


# --- the cost table's rows (kvcxl rtl cost, rtl/cost.py) --------------------------------
# Here, not in rtl/cost.py, so that the command line names them without loading Amaranth.


@dataclass(frozen=True)
class Engine:
    """One row of the cost table: a design of the registry, its lanes and its policy."""

    key: str
    label: str
    design: str
    shape: dict = field(default_factory=dict)  # over the registry's defaults
    policy: str | None = None  # its column of the policies table (None: not a policy)
    lanes: int = 1
    cycles_per_update: int = 1
    update: str = "entry"  # what one update is
    ice40_entries: int = 256  # the first shape tried on an iCE40 (cost.ICE40_ENTRIES)


def _ema(design: str, lanes: int) -> Engine:
    """An EMA row, on chip (``core``) or with its records in DRAM (``record_stream``): its
    lanes name it and set both its shape and its updates/s."""
    dram = design == "record_stream"
    return Engine(f"ema-{'dram-' * dram}{lanes}",
                  f"EMA, {'records in DRAM, ' * dram}{lanes} lane{'s' * (lanes > 1)}",
                  design, {"lanes": lanes}, "ema", lanes, 1, "entries scored")  # fmt: skip


ENGINES: tuple[Engine, ...] = (
    # The EMA at 1 and 4 lanes, on chip and with its records in DRAM.
    *(_ema(design, lanes) for design in ("core", "record_stream") for lanes in (1, 4)),
    # Two cycles a touch or a slot visited: the slot's words come from block RAM, which
    # also holds the registry's 1 024 slots on an iCE40 (tried first there).
    Engine("clock", "CLOCK", "clock", {}, "clock", 1, 2, "touches or walk visits", 1024),
    Engine("sieve", "SIEVE", "sieve", {}, "sieve", 1, 2, "touches or walk visits", 1024),
    # At its registry shape: 1 024 slots, a ghost over 4 096 ids; two cycles a touch, its
    # slot's words from block RAM as CLOCK's.
    Engine("s3fifo", "S3-FIFO", "s3fifo", {}, "s3fifo", 1, 2, "touches or walk steps"),
    # The front end's entries only size its touch index (its line store is 64 lines).
    Engine("frontend", "CXL.mem front end", "frontend", {}, None, 1, 1, "messages", 1024),
)  # fmt: skip
ENGINE_KEYS: tuple[str, ...] = tuple(e.key for e in ENGINES)
