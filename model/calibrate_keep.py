"""keep_threshold by the design's SLO rule: the smallest hot set meeting the hit-rate SLO.

The design (docs/design.md, "Uncalibrated parameters", keep threshold): "sweep the
(keep, evict) pair against real attention traces; take the point meeting the 97 %
hit-rate SLO at the smallest hot set".  Under threshold placement the hot set is the
entries scoring ≥ keep, so both the hot set and the reads it serves shrink as keep
grows: the smallest hot set meeting the SLO is the one at the *largest* keep whose
hot set still serves ``slo`` of the reads.  That keep is an order statistic of the
scores the reads had, so it is found exactly rather than on a grid:
sort the read entries' scores, highest first; keep = the ⌈slo·n⌉-th.

Only entries present before the step count (:mod:`.trajectory`): a block written in
the step is in HBM by its write, whatever its score.  The evict threshold does not
move the hot set, so the rule does not decide it (the caller picks it by the managed
replay's latency, :mod:`.managed`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray


def slo_keep(
    scores: NDArray, reads: NDArray, present: NDArray, slo: float, weights: NDArray | None = None
) -> dict[str, Any]:
    """The largest keep whose hot set (score ≥ keep among present entries) serves at least
    ``slo`` of the reads; with ``weights``, of the read attention mass instead.

    ``keep`` is None when no keep > 0 meets the SLO (more than 1 − slo of the reads, or
    of their mass, are of entries scoring 0)."""
    if not 0.0 < slo <= 1.0:
        raise ValueError(f"slo = {slo!r}: must be in (0, 1]")
    read = present & reads
    s = np.asarray(scores)[read]
    if s.size == 0:
        raise ValueError("no reads of entries present before their step: nothing to serve")
    order = np.argsort(-s, kind="stable")
    s_desc = s[order]
    if weights is None:
        need = math.ceil(slo * s.size - 1e-9)  # reads the hot set must serve
        keep = float(s_desc[need - 1])
    else:
        m = np.asarray(weights)[read][order]
        cum = np.cumsum(m)
        need = int(np.searchsorted(cum, slo * cum[-1] * (1 - 1e-12))) + 1
        keep = float(s_desc[min(need, s.size) - 1])
    if keep <= 0.0:
        return {"keep": None, "slo": slo, "reason": "reads of entries scoring 0 exceed 1 − slo"}
    hot = present & (scores >= keep)
    served = read & hot
    mass = np.asarray(weights)[read].sum() if weights is not None else None
    out = {
        "keep": keep,
        "slo": slo,
        "hot_set_fraction": float(hot.sum() / max(int(present.sum()), 1)),
        "read_hit_rate": float(served.sum() / s.size),
    }
    if weights is not None:
        out["mass_hit_rate"] = float(np.asarray(weights)[served].sum() / mass)
    return out


def hot_set_curve(
    scores: NDArray, reads: NDArray, present: NDArray, keeps: list[float]
) -> list[dict[str, float]]:
    """Hot-set share and read share served at each keep (the sweep the rule summarises)."""
    read = present & reads
    n_read = max(int(read.sum()), 1)
    n_present = max(int(present.sum()), 1)
    rows = []
    for k in keeps:
        hot = present & (scores >= k)
        rows.append(
            {
                "keep": k,
                "hot_set_fraction": float(hot.sum() / n_present),
                "read_hit_rate": float((hot & read).sum() / n_read),
            }
        )
    return rows
