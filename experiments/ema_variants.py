"""The EMA's own rules as named variants, each against the seed's literal EMA, over runs
long enough for β to act (docs/validation.md, "ema-variants").

The seed writes the priority ``(1 − score)·(1 − e^(−β·idle))`` with β = 0.001, a 1,000-step
horizon; kvcxl's reading adds rules the seed does not make: a read of weight ≥
``touch_threshold`` (0.01) zeroes idle, and equal priorities (every entry touched lately
has priority 0) go to the lower entry id.  The arms: the literal EMA (kvcxl's defaults);
each other tie-break (``ema_tie_break``: last touch, score, admission age); the touch
threshold swept; no touch zeroing idle (``ema_touch_resets_idle = false``: idle counts
steps since the entry's admission); and the priority's floor form (``ema-floor``).
Every run is at least 1,000 steps after its warm-up, so β·idle reaches 1; ``mid`` keeps its
shape and narrows to three of the programme's workloads (``uniform``, which reads a quarter
of every context's blocks at every step, is the slowest to replay) to afford that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._common import (
    arm_table,
    attention_summary,
    base_cases,
    by_workload,
    column,
    prefixed,
    replay,
    titled,
)
from ._common import stream as case_stream
from .base import Experiment
from .stats import fmt_ci, paired_gain

BASELINE = "ema"
BUDGET = "10%"
#: label → (policy, its parameters): the seed's literal EMA first, the baseline of every gain.
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "ema": ("ema", {}),
    "tie: last touch": ("ema", {"ema_tie_break": "last-touch"}),
    "tie: score": ("ema", {"ema_tie_break": "score"}),
    "tie: age": ("ema", {"ema_tie_break": "age"}),
    "touch ≥ 0.001": ("ema", {"touch_threshold": 0.001}),
    "touch ≥ 0.05": ("ema", {"touch_threshold": 0.05}),
    "touch ≥ 0.1": ("ema", {"touch_threshold": 0.1}),
    "no touch zeroes idle": ("ema", {"ema_touch_resets_idle": False}),
    "ema-floor (0.05)": ("ema-floor", {}),
}
#: Each scale's run: ≥ 1,000 steps after the warm-up (β = 0.001's horizon), and which
#: workloads (None: the scale's own).
RUNS: dict[str, dict[str, Any]] = {
    "tiny": {"steps": 24, "warmup": 4, "workloads": None},
    "ci": {"steps": 1100, "warmup": 100, "workloads": None},
    "mid": {"steps": 1100, "warmup": 100,
            "workloads": ("retrieval", "multi-turn", "shared-prefix")},
}  # fmt: skip
MOVES = 1.0  # pts: a gain whose CI lies wholly beyond ±this moves the EMA


class EmaVariants(Experiment):
    name = "ema-variants"
    required_arms = (BASELINE,)  # every variant's margin is taken against it
    question = (
        "Which of the rules kvcxl adds to read the seed's EMA (the tie-break among equal "
        "priorities, the touch that zeroes idle, the priority's form) moves its hit rate, "
        "by how much, when runs are long enough for β to act?"
    )
    claim = (
        "The EMA's priority (1 − score)·(1 − e^(−β·idle)), β = 0.001 (a 1,000-step horizon), "
        "ranks by attention and recency; the rules the seed leaves open (kvcxl: entry-id ties, "
        "a read ≥ 0.01 zeroes idle) do not decide its results"
    )

    def cases(self, scale: str) -> list[dict[str, Any]]:
        out = base_cases(scale, budget=BUDGET, arms=list(ARMS))
        run = RUNS.get(scale)
        if run is None:  # (a scale of 1,000 steps or more: as it is)
            return out
        if run["workloads"] is not None:
            out = [c for c in out if c["workload"] in run["workloads"]]
        return [{**c, "steps": run["steps"], "warmup": run["warmup"]} for c in out]

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        st = case_stream(case, seed)
        out: dict[str, Any] = {}
        for label in case["arms"]:
            policy, config = ARMS[label]
            out |= prefixed(label, replay(st, case, policy, case["budget"], **config))
        return out

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        groups = by_workload(rows)
        labels = [a for a in ARMS if f"{a}:hit_rate" in rows[0]]
        variants = [a for a in labels if a != BASELINE]
        gains = {
            wl: {a: paired_gain(hr(rs, a), hr(rs, BASELINE)) for a in variants}
            for wl, rs in groups.items()
        }
        tables = [_gain_table(gains, variants)]
        arms = [(a, a, None if a == BASELINE else BASELINE) for a in labels]
        for wl, rs in groups.items():
            tables.append(titled(wl, rs, arm_table(rs, arms, f"over {BASELINE} (pts)")))
        best, tally = best_variant(gains, variants)
        moved = [(a, wl) for wl, g in gains.items() for a in variants if _moves(g[a])]
        inside = all(
            g[a]["lo"] is not None and -MOVES < g[a]["lo"] * 100 and g[a]["hi"] * 100 < MOVES
            for g in gains.values()
            for a in variants
        )
        up, down = tally[best]
        why = (
            f"{len(moved)} of {len(variants) * len(groups)} (variant, workload) gains over the "
            f"literal EMA have a 95 % CI wholly beyond ±{MOVES:g} pt. The best variant, by "
            f"workloads won minus lost (CI excluding 0), is '{best}': above the literal EMA "
            f"on {up}, below on {down} of {len(groups)} workloads."
        )
        verdict = "contradicts" if moved else ("confirms" if inside else "cannot say")
        return {
            "tables": tables,
            "caption": f"Simulated; attention: {attention_summary(rows)}.",
            "verdict": verdict,
            "why": why,
            "plots": {},
            "best": best,
        }


def hr(rows: list[dict[str, Any]], arm: str) -> list[float]:
    return column(rows, arm, "hit_rate")


def _moves(g: dict[str, Any]) -> bool:
    return g["lo"] is not None and (g["lo"] * 100 >= MOVES or g["hi"] * 100 <= -MOVES)


def best_variant(
    gains: dict[str, dict[str, dict[str, Any]]], variants: list[str]
) -> tuple[str, dict[str, tuple[int, int]]]:
    """The variant with the most workloads won minus lost against the literal EMA (a paired
    gain whose CI excludes 0), then the larger median gain over workloads; and each
    variant's (won, lost)."""
    tally: dict[str, tuple[int, int]] = {}
    for a in variants:
        gs = [g[a] for g in gains.values()]
        won = sum(1 for g in gs if g["lo"] is not None and g["lo"] > 0)
        lost = sum(1 for g in gs if g["hi"] is not None and g["hi"] < 0)
        tally[a] = (won, lost)

    def rank(a: str) -> tuple[int, float]:
        med = float(np.median([g[a]["mean"] for g in gains.values()]))
        return tally[a][0] - tally[a][1], med

    return max(variants, key=rank), tally


def _gain_table(gains: dict[str, dict[str, dict[str, Any]]], variants: list[str]) -> str:
    """Each variant's paired gain over the literal EMA per workload (pts, mean ± 95 % CI)."""
    wls = list(gains)
    head = "| variant | " + " | ".join(wls) + " |\n|---|" + "---|" * len(wls)
    lines = [head]
    for a in variants:
        cells = [fmt_ci(gains[wl][a], 100, 1, sign=True) for wl in wls]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return (
        "Paired gain in HBM hit rate over the seed's literal EMA (pts, mean ± 95 % CI over "
        "seeds; Simulated):\n\n" + "\n".join(lines)
    )


EXPERIMENT = EmaVariants()
