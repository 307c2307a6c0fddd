"""Statistics over seeds: means with 95 % confidence intervals, percentiles.

What the design's validation programme asks for (docs/design.md, "Validation programme").

The confidence interval of a mean over n samples is ``mean ± t(0.975, n−1) · s / √n``
with the sample standard deviation s and Student's t quantile :func:`t975`
(tabulated below, so no SciPy is needed).  This is the one t table of the project:
the simulator's seeds and the calibration's prompts (:mod:`kvcxl.model.calibrate`)
both use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# Student's t, two-sided 95 % (the 0.975 quantile), by degrees of freedom, to 3 decimals.
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
    17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
    25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000,
    120: 1.980,
}  # fmt: skip
_Z975 = 1.960  # the normal quantile: t at infinitely many degrees of freedom


def t975(df: int | float) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``inf``: normal).

    Exact (to the table's 3 decimals) for df ≤ 30 and at 40, 60, 120; between them and
    beyond 120 (towards the normal 1.960) linear in 1/df, within 5·10⁻⁴ of the exact value.
    """
    if not df >= 1:
        raise ValueError(f"degrees of freedom = {df}: must be >= 1")
    if df in _T975:
        return _T975[df]
    if df > 120:
        return _Z975 + (_T975[120] - _Z975) * 120 / df  # → the normal 1.960
    keys = sorted(_T975)
    hi = next(k for k in keys if k > df)
    lo = max(k for k in keys if k < df)
    # Interpolate linearly in 1/df, which is close to exact in this range.
    f = (1 / lo - 1 / df) / (1 / lo - 1 / hi)
    return _T975[lo] + f * (_T975[hi] - _T975[lo])


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """Mean, 95 % CI half-width and bounds, sample std and n (CI is None for n = 1)."""
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return {"mean": None, "ci95": None, "lo": None, "hi": None, "std": None, "n": 0}
    mean = float(x.mean())
    if n == 1:
        return {"mean": mean, "ci95": None, "lo": None, "hi": None, "std": None, "n": 1}
    std = float(x.std(ddof=1))
    half = t975(n - 1) * std / math.sqrt(n)
    return {"mean": mean, "ci95": half, "lo": mean - half, "hi": mean + half, "std": std, "n": n}


def linear_percentiles(values: Sequence[float] | np.ndarray, qs: Sequence[float]) -> list[float]:
    """The ``qs`` percentiles of a non-empty sample by numpy's default ("linear") method,
    the same float64 values as ``np.percentile(values, qs)``: sorted once, then numpy's own
    interpolation (from the lower neighbour below the midpoint, from the upper one at and
    above it) in Python floats.  It skips np.percentile's ~20 Python frames, which a short
    replay's result pays for more than for its loop (tests/test_sim_units.py holds the two
    equal bit for bit).  A sample holding NaN has NaN percentiles, as numpy's."""
    s = np.sort(np.asarray(values, dtype=np.float64), kind="stable").tolist()
    n = len(s)
    if n == 0:
        raise ValueError("percentiles of an empty sample")
    out = []
    for q in qs:
        if not 0 <= q <= 100:
            raise ValueError(f"percentile {q}: must be within [0, 100]")
        if s[-1] != s[-1]:  # NaN sorts last
            out.append(math.nan)
            continue
        v = (n - 1) * (q / 100)
        i = min(math.floor(v), n - 1)
        g = v - i
        a, b = s[i], s[min(i + 1, n - 1)]
        d = b - a
        out.append(b - d * (1 - g) if g >= 0.5 else a + d * g)
    return out


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 of a latency-like sample."""
    if len(values) == 0:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = linear_percentiles(values, (50, 95, 99))
    return {"p50": p50, "p95": p95, "p99": p99}


#: Metrics averaged over seeds (each gets a ``<name>_ci95`` and the per-seed values).
SEED_METRICS = (
    "hit_rate",
    "byte_miss_ratio",
    "effective_latency_ns",
    "stall_ns_per_step_mean",
    "tokens_per_s",
    "prefetch_precision",
    "prefetch_coverage",
)
#: Counters summed over seeds.
SUMMED = (
    "reads", "hits", "misses", "audited_victims", "wrong_victims", "history_checked",
    "priority_mismatches", "outranked_by_history", "pin_violations", "audit_faults",
)  # fmt: skip


def combine_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result row from the same configuration replayed on several seeds."""
    if not runs:
        raise ValueError("no runs to combine")
    first = runs[0]
    row: dict[str, Any] = {
        k: first[k]
        for k in (
            "evidence", "policy", "budget_bytes", "budget_entries", "budget_fraction",
            "granularity", "prefetch", "persistent_metadata", "alpha", "entry_bytes",
            "metadata_bytes_per_entry", "history_not_audited",
        )
        if k in first
    }  # fmt: skip
    row["seeds"] = len(runs)
    for k in SEED_METRICS:
        vals = [r.get(k) for r in runs]
        stats = mean_ci(vals)
        row[k] = stats["mean"]
        row[f"{k}_ci95"] = stats["ci95"]
        if len(runs) > 1:
            row[f"{k}_per_seed"] = vals
    for k in SUMMED:
        vals = [r.get(k) for r in runs]
        row[k] = None if any(v is None for v in vals) else int(sum(vals))
    row["kv_bytes_mean"] = float(np.mean([r["kv_bytes"] for r in runs]))
    pairs: dict[str, float] = {}
    for r in runs:
        for k, v in r["bytes_moved"].items():
            pairs[k] = pairs.get(k, 0) + v / len(runs)
    row["bytes_moved_mean"] = pairs
    stalls = np.concatenate(
        [np.asarray(r["per_step"]["stall_ns"][r["warmup_steps"] :]) for r in runs]
    )
    row["stall_ns_per_step"] = percentiles(stalls)
    return row


def audit_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the eviction audit checked over ``rows`` (docs/policy.md, the eviction audit):
    the summed counts, and the policies whose history part did not run (``not_audited``)."""
    keys = ("audited_victims", "wrong_victims", "history_checked", "priority_mismatches",
            "outranked_by_history", "pin_violations", "audit_faults")  # fmt: skip
    totals: dict[str, Any] = {k: int(sum(r.get(k) or 0 for r in rows)) for k in keys}
    totals["not_audited"] = sorted(
        {r["policy"] for r in rows if r.get("audited_victims") is not None and
         r.get("history_checked") is None and "policy" in r}
    )  # fmt: skip
    return totals


def audit_cell(row: dict[str, Any]) -> str:
    """A table's audit cell: ``faults/victims`` when both parts ran; "not audited" when the
    policy's priority could not be recomputed from history (its top-k faults, if any, still
    show); "—" when the audit was off."""
    audited = row.get("audited_victims")
    if audited is None:
        return "—"
    faults = row.get("audit_faults") or 0
    if row.get("history_checked") is None:
        return f"{faults}/{audited} top-k" if faults else "not audited"
    return f"{faults}/{audited}"


def audit_sentence(totals: dict[str, Any]) -> str:
    """One line saying what the audit compared, for every table that quotes it."""
    skipped = totals.get("not_audited") or []
    tail = (
        f" Not audited from history ({', '.join(skipped)}): their priority is not an entry's "
        "own history (each reason: `kvcxl policy list`); top-k only."
        if skipped
        else ""
    )
    return (
        f"Audit: {totals['audited_victims']:,} victims checked against the exact top-k of the "
        f"policy's priorities ({totals['wrong_victims']} wrong); "
        f"{totals['history_checked']:,} priorities (every victim and a sample of the other "
        "eligible entries per pass) recomputed from the entries' own history by the "
        f"documented formulas ({totals['priority_mismatches']} differ, "
        f"{totals['outranked_by_history']} victims outranked, "
        f"{totals['pin_violations']} pins broken).{tail}"
    )


def wilson_ci(successes: int, n: int) -> dict[str, Any]:
    """A proportion with its 95 % Wilson score interval (sound at 0 and n, where t is not).

    ``lo, hi = (p + z²/2n ∓ z·√(p(1−p)/n + z²/4n²)) / (1 + z²/n)`` with p = successes/n
    and z the normal 0.975 quantile.
    """
    if n < 1:
        return {"rate": None, "lo": None, "hi": None, "n": 0, "successes": 0}
    if not 0 <= successes <= n:
        raise ValueError(f"successes = {successes}: must be within 0 … n = {n}")
    p, z2 = successes / n, _Z975**2
    mid = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return {"rate": p, "lo": max(0.0, mid - half), "hi": min(1.0, mid + half), "n": n,
            "successes": successes}  # fmt: skip
