"""Verilog export of the engines (Amaranth's bundled Yosys; no system tools needed)."""

from __future__ import annotations

from pathlib import Path

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig


def default_decay(config: PolicyConfig | None = None) -> list[int]:
    """The reset contents of the decay table: the golden model's table for the config."""
    cfg = config or PolicyConfig()
    return [int(v) for v in fx.decay_table(cfg.beta, cfg.decay_shift)]


def build(design: str, **params):
    """The Amaranth component ``design``: core, scoring, eviction, prefetch, frontend or top."""
    # lazy: amaranth is the optional 'hdl' extra; kvcxl.tb.runner imports this module at top
    # and `kvcxl bench` imports that (via kvcxl.tb.bench) without it
    from .core import PolicyCore
    from .eviction import EvictionEngine
    from .scoring import ScoringEngine

    if design == "core":
        return PolicyCore(
            params["entries"],
            params.get("lanes", 1),
            params.get("batch", 8),
            decay_init=params.get("decay_init"),
            defect=params.get("defect"),
        )
    if design == "scoring":
        return ScoringEngine(
            params["entries"], params.get("lanes", 1), decay_init=params.get("decay_init")
        )
    if design == "eviction":
        return EvictionEngine(
            params["entries"],
            params.get("lanes", 1),
            params.get("batch", 8),
            defect=params.get("defect"),
        )
    if design == "prefetch":
        from .prefetch import PrefetchEngine  # lazy: amaranth (as above)

        return PrefetchEngine(**params)
    if design == "top":
        from .top import PolicyEngine  # lazy: amaranth (as above)

        return PolicyEngine(**params)
    if design == "frontend":
        from .frontend import CxlMemFrontEnd  # lazy: amaranth (as above)

        return CxlMemFrontEnd(**params)
    raise ValueError(
        f"design = {design!r}: must be core, scoring, eviction, prefetch, frontend or top"
    )


def to_verilog(component, name: str) -> str:
    from amaranth.back import verilog  # lazy: the 'hdl' extra (see build)

    return verilog.convert(component, name=name, emit_src=False)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds it (keeps simulator builds incremental)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
