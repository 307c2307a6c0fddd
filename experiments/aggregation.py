"""Max versus mean aggregation of a GQA group's query-head weights into one KV-head weight.

The same seed's workload is compiled twice, once per aggregation (the sparse reads are the
KV head's top-k of the aggregated weights, so both the scores and the reads follow it),
and replayed under the EMA at the design's α.
"""

from __future__ import annotations

from typing import Any

from ._common import arm_table, base_cases, by_workload, column, prefixed, replay, titled
from ._common import stream as case_stream
from .base import Experiment
from .stats import excludes_zero, fmt_ci, paired_gain


class Aggregation(Experiment):
    name = "aggregation"
    question = "Does max- or mean-aggregation over a GQA group give the EMA the higher hit rate?"
    claim = "Max-aggregation protects an entry any head of the group needs (the design's default)"

    def cases(self, scale: str) -> list[dict[str, Any]]:
        return base_cases(scale, budget="10%", alpha=0.2)

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for agg in ("max", "mean"):
            st = case_stream(case, seed, aggregation=agg)
            m = replay(st, case, "ema", case["budget"], alpha=case["alpha"], aggregation=agg)
            out |= prefixed(agg, m)
        return out

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        arms = [("mean", "mean-aggregation", None), ("max", "max-aggregation", "mean")]
        tables, wins, losses, lines = [], 0, 0, []
        for wl, rs in by_workload(rows).items():
            tables.append(titled(wl, rs, arm_table(rs, arms, "max − mean (pts)")))
            g = paired_gain(column(rs, "max", "hit_rate"), column(rs, "mean", "hit_rate"))
            if excludes_zero(g):
                wins += g["lo"] > 0
                losses += g["hi"] < 0
            lines.append(f"{wl} {fmt_ci(g, 100, 1, sign=True)}")
        n = len(lines)
        verdict = "confirms" if wins == n else "contradicts" if losses > wins else "cannot say"
        why = (
            f"max − mean hit rate (pts): {'; '.join(lines)}. Max wins with a CI excluding 0 on "
            f"{wins} of {n} workloads, loses on {losses}."
        )
        return {"tables": tables, "verdict": verdict, "why": why, "plots": {}}


EXPERIMENT = Aggregation()
