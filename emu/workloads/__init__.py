"""Synthetic workloads and the compiled read streams every policy replays.

The workloads are the design's (docs/design.md, "Workloads").

``catalog`` — the synthetic workloads (``WORKLOADS``); ``mooncake`` — Mooncake's published
request traces as arrivals (``ARRIVALS``); ``attention`` — the synthetic attention
generator, with its fitted values in ``attention_fit.toml``; ``stream`` — the compiled
``ReadStream``.

>>> from kvcxl.emu.shape import PRESETS
>>> from kvcxl.emu.workloads import make_workload, compile_workload
>>> s = compile_workload(make_workload("cyclic", PRESETS["ci"], seed=1), steps=20)
>>> s.n_steps
20
"""

from __future__ import annotations

from typing import Any

from ..shape import ModelShape
from .base import StepPlan, Turn, Workload
from .catalog import WORKLOADS
from .mooncake import ARRIVALS
from .stream import ReadStream, compile_workload, from_trace, parse_read_mode

DEFAULT_WORKLOAD = "zipf-sessions"
#: Every workload by name: the synthetic ones, then the real arrivals.
ALL_WORKLOADS: dict[str, type[Workload]] = {**WORKLOADS, **ARRIVALS}


def make_workload(name: str, shape: ModelShape, seed: int = 0, **params: Any) -> Workload:
    """A workload by name, with a clear error naming the known ones."""
    try:
        cls = ALL_WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; choose from: {', '.join(ALL_WORKLOADS)}"
        ) from None
    return cls(shape, seed, **params)


__all__ = [
    "ALL_WORKLOADS",
    "ARRIVALS",
    "DEFAULT_WORKLOAD",
    "WORKLOADS",
    "ReadStream",
    "StepPlan",
    "Turn",
    "Workload",
    "compile_workload",
    "from_trace",
    "make_workload",
    "parse_read_mode",
]
