"""Every workload on its own (never averaged): LRU, the EMA at the design's α = 0.2 and at
Appendix N's α = 0.05, and the offline optimum (Belady) as the bound, at one budget."""

from __future__ import annotations

from typing import Any

from ._common import arm_table, base_cases, by_workload, column, prefixed, replay, titled
from ._common import stream as case_stream
from .base import Experiment
from .stats import fmt_ci, paired_gain

ALPHAS = (0.2, 0.05)  # the design's α and Appendix N's optimum
CLAIM_PTS, CLAIM_HIT = 25.0, 97.0


class Workloads(Experiment):
    name = "workloads"
    question = "Per workload, what hit rate does the policy reach, and how far is it above LRU?"
    claim = "97 % HBM hit rate and +25 pts over LRU (v4.0; retracted, §K.3.2)"

    def cases(self, scale: str) -> list[dict[str, Any]]:
        return base_cases(scale, budget="10%", alphas=list(ALPHAS))

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        st = case_stream(case, seed)
        out: dict[str, Any] = {}
        b = case["budget"]
        out |= prefixed("lru", replay(st, case, "lru", b))
        for a in case["alphas"]:
            out |= prefixed(f"ema-{a}", replay(st, case, "ema", b, alpha=a))
        out |= prefixed("belady", replay(st, case, "belady", b))
        return out

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        arms = [
            ("lru", "LRU", None),
            ("ema-0.2", "EMA α = 0.2", "lru"),
            ("ema-0.05", "EMA α = 0.05", "lru"),
            ("belady", "Belady (offline bound)", "lru"),
        ]
        tables, hits, pts, lines = [], 0, 0, []
        groups = by_workload(rows)
        for wl, rs in groups.items():
            tables.append(titled(wl, rs, arm_table(rs, arms, "over LRU (pts)")))
            best = max(("ema-0.2", "ema-0.05"), key=lambda a: sum(column(rs, a, "hit_rate")))
            g = paired_gain(column(rs, best, "hit_rate"), column(rs, "lru", "hit_rate"))
            hr = max(column(rs, best, "hit_rate"))
            hits += hr * 100 >= CLAIM_HIT
            pts += (g["hi"] if g["hi"] is not None else g["mean"]) * 100 >= CLAIM_PTS
            lines.append(f"{wl} {fmt_ci(g, 100, 1, sign=True)}")
        n = len(groups)
        verdict = "cannot say"
        if hits == n and pts == n:
            verdict = "confirms"
        elif pts == 0:
            verdict = "contradicts"
        why = (
            f"Best EMA over LRU (pts): {'; '.join(lines)}. +{CLAIM_PTS:.0f} pts is within the "
            f"CI on {pts} of {n} workloads; a seed reaches {CLAIM_HIT:.0f} % on {hits} of {n}."
        )
        return {"tables": tables, "verdict": verdict, "why": why, "plots": {}}


EXPERIMENT = Workloads()
