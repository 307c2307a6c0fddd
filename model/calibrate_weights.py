"""The weighted placement's (R, E, N) weights and its P cuts, fitted to reuse.

The design (docs/design.md, "Uncalibrated parameters", tier-placement weights): "Fit,
do not choose. Log per-token (recency, EMA, anchor-membership, was-attended) tuples
from real traces and solve for the weights … — a small constrained regression or
coarse simplex sweep. The tier boundaries … must be re-fitted at the same time."

Tuples: every entry present before every step (:mod:`.trajectory`) with
``R = 1 − r = e^(−β·idle)``, ``E`` its EMA score, ``N`` 1 in the anchor zone, and
``y`` 1 when the entry is read in the step (reuse).  The regression is a linear
probability model ``y ≈ c0 + cR·R + cE·E + cN·N`` with ``cR, cE, cN ≥ 0`` (exact
non-negative least squares over the eight active sets); the weights are the
coefficients scaled to sum to 1, so ``P = (ŷ − c0) / (cR + cE + cN)`` ranks entries
exactly as the fitted reuse probability does.  Goodness of fit: R² of the regression
and the AUC of P as a predictor of reuse (Mann–Whitney, ties counted half).  A coarse
simplex sweep scores every weight triple on a 0.1 grid by the same AUC, as the check
the design names.

The cuts use the same SLO as keep (:mod:`.calibrate_keep`): ``low`` is the largest cut
whose HBM set (P ≥ low) serves ``slo`` of the reads — the smallest hot set meeting it —
and ``high`` splits that set so that at most ``pinned_fraction`` of it (the
configuration's share of HBM for pinned entries) sits at or above ``high``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware.formulas import placement_value

from .calibrate_keep import slo_keep
from .trajectory import Trajectory

FEATURES = ("R", "E", "N")


def auc(score: NDArray, label: NDArray) -> float:
    """Area under the ROC curve of ``score`` predicting boolean ``label`` (ties count ½)."""
    score = np.asarray(score, dtype=np.float64).ravel()
    label = np.asarray(label, dtype=bool).ravel()
    pos = int(label.sum())
    neg = label.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    _, inv, counts = np.unique(score, return_inverse=True, return_counts=True)
    # Average 1-based rank of each distinct value.
    upper = np.cumsum(counts)
    avg = upper - (counts - 1) / 2.0
    ranks = avg[inv]
    return float((ranks[label].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def fit_nonnegative(X: NDArray, y: NDArray) -> dict[str, Any]:
    """Least squares ``y ≈ c0 + X·c`` with ``c ≥ 0`` (c0 free), exact over all active sets.

    Returns the intercept, the coefficients, R² and the residual sum of squares."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, k = X.shape
    A = np.column_stack([np.ones(n), X])
    G = A.T @ A  # the normal equations: every subset's fit comes from these sums
    b = A.T @ y
    yy = float(y @ y)
    sst = yy - n * float(y.mean()) ** 2
    best: tuple[float, NDArray] | None = None
    for r in range(k + 1):
        for subset in itertools.combinations(range(k), r):
            cols = [0, *(j + 1 for j in subset)]
            sol, *_ = np.linalg.lstsq(G[np.ix_(cols, cols)], b[cols], rcond=None)
            if any(sol[1:] < -1e-12):
                continue
            coef = np.zeros(k + 1)
            coef[cols] = sol
            coef[1:] = np.maximum(coef[1:], 0.0)
            sse = yy - 2 * float(coef @ b) + float(coef @ G @ coef)
            if best is None or sse < best[0] - 1e-12 * max(abs(best[0]), 1.0):
                best = (sse, coef)
    assert best is not None  # the intercept-only subset is always feasible
    sse, coef = best
    return {
        "intercept": float(coef[0]),
        "coefficients": coef[1:].tolist(),
        "r2": float(1.0 - sse / sst) if sst > 0 else float("nan"),
        "sse": float(sse),
        "samples": n,
    }


def features(traj: Trajectory, beta: float, anchor_zone_size: int) -> tuple[NDArray, NDArray]:
    """(samples, 3) features R, E, N and boolean reuse of every present (step, entry)."""
    t, e = np.nonzero(traj.present)
    recency = np.exp(-beta * traj.idle[t, e].astype(np.float64))  # 1 − r, as the firmware's R
    anchor = (traj.first_token()[e] < anchor_zone_size).astype(np.float64)
    X = np.column_stack([recency, traj.scores[t, e], anchor])
    return X, traj.reads[t, e]


def fit_weights(X: NDArray, y: NDArray) -> dict[str, Any]:
    """The regression, its weights (coefficients scaled to sum 1) and the AUC of their P."""
    fit = fit_nonnegative(X, y)
    c = np.asarray(fit["coefficients"])
    total = float(c.sum())
    if total <= 0:
        return {**fit, "weights": None, "auc": float("nan"), "reason": "no feature predicts reuse"}
    w = c / total
    return {**fit, "weights": [float(x) for x in w], "auc": auc(X @ w, y)}


def simplex_sweep(
    X: NDArray, y: NDArray, step: float = 0.1, max_samples: int = 200_000
) -> dict[str, Any]:
    """Every (wR, wE, wN) on the simplex grid of ``step``, scored by the AUC of P (on a
    fixed random subsample of at most ``max_samples`` tuples: the sweep is a check, and
    66 sorts of millions of tuples would dominate the calibration's time)."""
    if len(y) > max_samples:
        pick = np.random.default_rng(0).choice(len(y), max_samples, replace=False)
        X, y = X[pick], y[pick]
    n = round(1 / step)
    rows = []
    for i in range(n + 1):
        for j in range(n + 1 - i):
            w = (i / n, j / n, (n - i - j) / n)
            rows.append({"weights": list(w), "auc": auc(X @ np.asarray(w), y)})
    best = max(rows, key=lambda r: r["auc"])
    return {"step": step, "samples": len(y), "rows": rows, "best": best}


def fit_cuts(
    p: NDArray, reads: NDArray, present: NDArray, slo: float, pinned_fraction: float
) -> dict[str, Any]:
    """``low`` by the SLO on P (the smallest HBM set serving ``slo`` of the reads) and
    ``high`` leaving at most ``pinned_fraction`` of that set at or above it."""
    low = slo_keep(p, reads, present, slo)
    if low["keep"] is None:
        return {"cuts": None, "reason": low["reason"]}
    lo = low["keep"]
    hbm = np.sort(p[present & (p >= lo)])
    # The smallest high with |P ≥ high| ≤ ⌊pinned_fraction·|HBM set|⌋: just above the
    # largest value that must stay below it (a cut on a tie would pin more than the share).
    j = hbm.size - int(np.floor(pinned_fraction * hbm.size)) - 1
    hi = float(np.nextafter(hbm[j] if j >= 0 else lo, np.inf))
    if not 0.0 < lo < hi < 1.0:
        return {"cuts": None, "low": lo, "high": hi, "reason": "cuts not within 0 < low < high < 1"}
    pinned = present & (p >= hi)
    return {
        "cuts": [lo, hi],
        "hot_set_fraction": low["hot_set_fraction"],
        "read_hit_rate": low["read_hit_rate"],
        "pinned_fraction_of_hbm": float(pinned.sum() / max(hbm.size, 1)),
        "pinned_read_rate": float((pinned & reads).sum() / max(int(pinned.sum()), 1)),
    }


def budget_hit_rate(p: NDArray, reads: NDArray, present: NDArray, capacity: int) -> float:
    """Share of reads served when, before every step, the ``capacity`` present entries with
    the highest P are in HBM (an Analytical model of placement at a fixed budget)."""
    hits = total = 0
    for t in range(p.shape[0]):
        cand = np.flatnonzero(present[t])
        r = reads[t, cand]
        total += int(r.sum())
        if cand.size <= capacity:
            hits += int(r.sum())
            continue
        top = np.argpartition(-p[t, cand], capacity - 1)[:capacity]
        hits += int(r[top].sum())
    return hits / total if total else float("nan")


def calibrate_weights(
    trajs: list[Trajectory],
    beta: float,
    anchor_zone_size: int,
    slo: float,
    pinned_fraction: float,
    seed_weights: tuple[float, float, float],
    capacity: int | None = None,
) -> dict[str, Any]:
    """The fit pooled over traces, its cuts per trace (the strictest kept), and where the
    seed's weights land (AUC, and hit rate at ``capacity`` entries when given)."""
    parts = [features(t, beta, anchor_zone_size) for t in trajs]
    X = np.concatenate([x for x, _ in parts])
    y = np.concatenate([r for _, r in parts])
    fit = fit_weights(X, y)
    out: dict[str, Any] = {
        "evidence": "Measured attention, Analytical model of placement",
        "beta": beta,
        "anchor_zone_size": anchor_zone_size,
        "features": list(FEATURES),
        "fit": fit,
        "seed": {"weights": list(seed_weights), "auc": auc(X @ np.asarray(seed_weights), y)},
        "per_trace_fit": [fit_weights(x, r) for x, r in parts],
        "sweep": simplex_sweep(X, y),
    }
    if fit["weights"] is None:
        return out
    w = tuple(fit["weights"])
    per_cuts = []
    for tr in trajs:
        p = _p_grid(tr, w, beta, anchor_zone_size)
        per_cuts.append(fit_cuts(p, tr.reads, tr.present, slo, pinned_fraction))
    out["per_trace_cuts"] = per_cuts
    ok = [c for c in per_cuts if c["cuts"] is not None]
    if len(ok) == len(per_cuts):
        # The SLO must hold on every trace: the lowest low; high keeps the pinned share
        # within bound on every trace: the highest high.
        lo = min(c["cuts"][0] for c in ok)
        hi = max(c["cuts"][1] for c in ok)
        out["cuts"] = [lo, hi] if lo < hi < 1.0 else None
    else:
        out["cuts"] = None
    if capacity is not None:
        rows = {
            "fit": w,
            "seed": tuple(seed_weights),
            "sweep": tuple(out["sweep"]["best"]["weights"]),
        }
        out["budget_hit_rate"] = {
            "capacity_entries": capacity,
            **{
                k: [
                    budget_hit_rate(
                        _p_grid(tr, v, beta, anchor_zone_size), tr.reads, tr.present, capacity
                    )
                    for tr in trajs
                ]
                for k, v in rows.items()
            },
        }
    return out


def _p_grid(
    tr: Trajectory, weights: tuple[float, ...], beta: float, anchor_zone_size: int
) -> NDArray:
    """P of every (step, entry) by the firmware's formula (absent entries included)."""
    anchor = (tr.first_token() < anchor_zone_size).astype(np.float64)[None, :]
    return np.asarray(placement_value(tr.scores, tr.idle, anchor, beta, tuple(weights)))  # type: ignore[arg-type]
