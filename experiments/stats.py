"""The programme's statistics over seeds (docs/validation.md, "Statistics").

Means carry 95 % confidence intervals from the project's one Student-t table
(:mod:`kvcxl.emu.metrics`); latency-like values also get the median and p50/p95/p99.
A gain between two arms is the mean of the per-seed differences (the arms replay the
same seeds' streams, so the comparison is paired) with its own interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvcxl.emu.metrics import mean_ci, percentiles


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Mean, its 95 % CI (half-width, lo, hi), n, median and p50/p95/p99 of ``values``."""
    x = [float(v) for v in values if v is not None]
    out = mean_ci(x)
    out["median"] = float(np.median(x)) if x else None
    out.update(percentiles(x))
    return out


def paired_gain(new: Sequence[float], old: Sequence[float]) -> dict[str, Any]:
    """Mean of ``new[i] − old[i]`` over seeds with its 95 % CI (the same seeds, paired)."""
    if len(new) != len(old):
        raise ValueError(f"paired samples differ in length: {len(new)} vs {len(old)}")
    return mean_ci([a - b for a, b in zip(new, old, strict=True)])


def fmt_ci(s: dict[str, Any], scale: float = 1.0, digits: int = 1, sign: bool = False) -> str:
    """``mean ± half-width`` of a :func:`summary` or :func:`paired_gain`, times ``scale``."""
    if s.get("mean") is None:
        return "—"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    m = f.format(s["mean"] * scale)
    if s.get("ci95") is None:
        return m
    return f"{m} ± {s['ci95'] * scale:.{digits}f}"


def excludes_zero(s: dict[str, Any]) -> bool:
    """Whether a gain's 95 % CI lies wholly on one side of zero."""
    return s.get("lo") is not None and (s["lo"] > 0 or s["hi"] < 0)
