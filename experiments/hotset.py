"""The hot-set size (the HBM budget, as a share of the workload's KV bytes) swept from 2 %
to 20 %: hit rate of LRU and of the EMA at each size, per workload."""

from __future__ import annotations

from typing import Any

from ._common import base_cases, by_workload, column, prefixed, replay, titled
from ._common import stream as case_stream
from .base import Experiment
from .stats import fmt_ci, summary

SIZES = ("2%", "5%", "10%", "15%", "20%")
POLICIES = ("lru", "ema")
CLAIM_SHARE, CLAIM_HIT = 5.4, 97.0  # the retracted "5.4 % hot set → 97 % of accesses"


class HotSet(Experiment):
    name = "hot-set"
    question = "How does the hit rate grow with the hot-set size, from 2 % to 20 % of the KV?"
    required_arms = POLICIES  # (its report reads both at every size)
    claim = "A 5.4 % hot set serves 97 % of accesses (v4.0; retracted, §K.3.2)"

    def cases(self, scale: str) -> list[dict[str, Any]]:
        return base_cases(scale, alpha=0.2, sizes=list(SIZES), policies=list(POLICIES))

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        st = case_stream(case, seed)
        out: dict[str, Any] = {}
        for size in case["sizes"]:
            for p in case["policies"]:
                out |= prefixed(f"{p}@{size}", replay(st, case, p, size, alpha=case["alpha"]))
        return out

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        groups = by_workload(rows)
        tables, reach = [], []
        for wl, rs in groups.items():
            head = "| policy | " + " | ".join(f"hit rate % at {s}" for s in SIZES) + " |"
            lines = [head, "|---|" + "---|" * len(SIZES)]
            for p in POLICIES:
                cells = [fmt_ci(summary(column(rs, f"{p}@{s}", "hit_rate")), 100) for s in SIZES]
                lines.append(f"| {p} | " + " | ".join(cells) + " |")
            tables.append(titled(wl, rs, "\n".join(lines)))
            # the smallest swept size at which the EMA's CI reaches 97 %
            hi = {s: summary(column(rs, f"ema@{s}", "hit_rate"))["hi"] or 0 for s in SIZES}
            ok = [s for s in SIZES if hi[s] * 100 >= CLAIM_HIT]
            reach.append((wl, ok[0] if ok else None))
        small = [w for w, s in reach if s is not None and float(s[:-1]) <= CLAIM_SHARE]
        never = [w for w, s in reach if s is None]
        if len(small) == len(reach):
            verdict = "confirms"
        elif len(small) == 0:
            verdict = "contradicts"
        else:
            verdict = "cannot say"
        why = (
            f"The EMA reaches 97 % (upper CI bound) at ≤ {CLAIM_SHARE} % of the KV on "
            f"{len(small)} of {len(reach)} workloads ({', '.join(small) or 'none'}); "
            f"never within 20 % on {', '.join(never) or 'none'}."
        )
        return {"tables": tables, "verdict": verdict, "why": why,
                "plots": {"hot-set.png": lambda p: _plot(groups, p)}}  # fmt: skip


def _plot(groups: dict[str, list[dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [float(s[:-1]) for s in SIZES]
    fig, axes = plt.subplots(1, len(POLICIES), figsize=(10, 4), sharey=True)
    for ax, p in zip(axes, POLICIES, strict=True):
        for wl, rs in groups.items():
            s = [summary(column(rs, f"{p}@{z}", "hit_rate")) for z in SIZES]
            ax.errorbar(x, [v["mean"] * 100 for v in s],
                        yerr=[(v["ci95"] or 0) * 100 for v in s], label=wl, capsize=2)  # fmt: skip
        ax.axhline(CLAIM_HIT, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{p} (Simulated)")
        ax.set_xlabel("hot set (HBM budget) % of KV bytes")
    axes[0].set_ylabel("HBM hit rate % (mean ± 95 % CI)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


EXPERIMENT = HotSet()
