"""Which policy should the device run? Every registered online policy ranked on every
workload, with Belady's offline optimum as the bound (docs/validation.md, "policies").

The policies come from the firmware's registry (:data:`kvcxl.firmware.policies.POLICIES`):
every online one that is not an ablation-ladder variant, so a policy added later joins the
ranking without an edit here.  The workloads: every synthetic one of the scale, Mooncake's
two published traces as arrivals (``mooncake``, ``mooncake-synthetic``: the first
``steps`` steps of each, a context long enough that no request is cut), and SmolLM2 captures
when ``KVCXL_CAPTURES`` names a folder of ``.npz`` traces (``kvcxl trace capture``; a
capture is one Measured trace, so its seeds replay the same stream and its CI is 0).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from kvcxl.common.figures import figure
from kvcxl.firmware.policies import POLICIES

from ..trace import Trace
from ..workloads import ARRIVALS, from_trace
from ._common import (
    SCALES,
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
from .stats import excludes_zero, fmt_ci, paired_gain, summary

BASELINE = "ema"  # the seed's policy, which every margin is taken against
BOUND = "belady"  # the offline optimum that may bypass: the upper bound of every online policy
BUDGET = "10%"
CAPTURES_ENV = "KVCXL_CAPTURES"
CAPTURE = "capture:"  # a captured trace's workload name: CAPTURE + its file's stem
# Mooncake's longest request at the default token scale (block_tokens / 512) is 5,981 + 1
# tokens (the synthetic trace; the conversation trace's 3,944 + 11): 8 K holds both.
ARRIVAL_CONTEXT_TOKENS = {"tiny": 8192, "ci": 8192, "mid": 16384}


def ranked_policies() -> list[str]:
    """Every online, non-ablation policy of the registry, sorted, then the bound."""
    online = sorted(p for p, c in POLICIES.items() if c.online and not c.ablation)
    return [*online, BOUND]


def capture_files() -> list[Path]:
    """The ``.npz`` traces in ``$KVCXL_CAPTURES`` (none when unset), sorted by name."""
    d = os.environ.get(CAPTURES_ENV)
    if not d:
        return []
    p = Path(d)
    if not p.is_dir():
        raise ValueError(f"{CAPTURES_ENV}={d!r}: not a folder of captured traces (.npz)")
    return sorted(p.glob("*.npz"))


@functools.lru_cache(maxsize=2)
def _trace_stream(path: str):
    return from_trace(Trace.load(path))


class Policies(Experiment):
    name = "policies"
    question = (
        "Which policy should the device run on each workload, by how much does it beat the "
        "seed's EMA, and how far is it from Belady's optimum?"
    )
    claim = (
        "The attention-aware EMA is the policy the device should run (the design's choice; "
        "Appendix N's provisional finding: no policy dominates every workload)"
    )

    def cases(self, scale: str) -> list[dict[str, Any]]:
        extra = {"budget": BUDGET, "policies": ranked_policies()}
        out = base_cases(scale, **extra)
        fixed = {k: v for k, v in SCALES[scale].items() if k != "workloads"}
        for wl in ARRIVALS:
            out.append({"workload": wl, "scale": scale, "read": out[0]["read"], **fixed,
                        "context_tokens": ARRIVAL_CONTEXT_TOKENS[scale], **extra})  # fmt: skip
        for f in capture_files():
            out.append({"workload": f"{CAPTURE}{f.stem}", "trace": str(f.resolve()),
                        "scale": scale, "read": "trace", **fixed, **extra})  # fmt: skip
        return out

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        if "trace" in case:
            st = _trace_stream(case["trace"])
            # A capture's steps are its own: the warm-up is the scale's share of them.
            n = st.n_steps
            case = {**case, "warmup": n * int(case["warmup"]) // int(case["steps"])}
        else:
            st = case_stream(case, seed)
        out: dict[str, Any] = {}
        for p in case["policies"]:
            out |= prefixed(p, replay(st, case, p, case["budget"]))
        return out

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        groups = by_workload(rows)
        tables, ranking = [], []
        for wl, rs in groups.items():
            pols = rs[0]["policies"]
            online = [p for p in pols if p != BOUND]
            order = sorted(online, key=lambda p: -float(np.mean(column(rs, p, "hit_rate"))))
            arms = [(BOUND, f"{BOUND} (offline bound)", BASELINE)]
            arms += [(p, p, None if p == BASELINE else BASELINE) for p in order]
            tables.append(titled(wl, rs, arm_table(rs, arms, f"over {BASELINE} (pts)")))
            ranking.append(_rank(wl, rs, order))
        verdict, why = _verdict(ranking)
        if not any(wl.startswith(CAPTURE) for wl in groups):  # (say what did not join)
            why += (
                f" No SmolLM2 capture joined: {CAPTURES_ENV} names none (a folder of "
                "`kvcxl trace capture` traces)."
            )
        return {
            "tables": [_ranking_table(ranking), *tables],
            "caption": f"Simulated, every workload of the tables below; attention: "
            f"{attention_summary(rows)}.",
            "verdict": verdict,
            "why": why,
            "plots": {"policies.png": lambda path: _plot(groups, path)},
            "ranking": ranking,
        }


def _rank(wl: str, rs: list[dict[str, Any]], order: list[str]) -> dict[str, Any]:
    """One workload's answer: the best online policy, its lead over the runner-up and its
    margin over the EMA (paired, with CIs), the EMA's rank and the gap to the bound."""
    best, second = order[0], order[1] if len(order) > 1 else order[0]
    hit = lambda p: column(rs, p, "hit_rate")  # noqa: E731
    return {
        "workload": wl,
        "best": best,
        "best_hit": summary(hit(best)),
        "runner_up": second,
        "lead": paired_gain(hit(best), hit(second)),
        "over_ema": paired_gain(hit(best), hit(BASELINE)),
        "ema_rank": order.index(BASELINE) + 1 if BASELINE in order else None,
        "policies": len(order),
        "to_bound": paired_gain(hit(BOUND), hit(best)),
        "seeds": len(rs),
    }


def _ranking_table(ranking: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | best online policy | its hit rate % | lead over runner-up (pts) | "
        f"margin over {BASELINE} (pts) | {BASELINE}'s rank | Belady − best (pts) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in ranking:
        lines.append(
            f"| {r['workload']} | {r['best']} | {fmt_ci(r['best_hit'], 100)} | "
            f"{fmt_ci(r['lead'], 100, 1, sign=True)} over {r['runner_up']} | "
            f"{fmt_ci(r['over_ema'], 100, 1, sign=True)} | {r['ema_rank']} of {r['policies']} | "
            f"{fmt_ci(r['to_bound'], 100, 1, sign=True)} |"
        )
    return (
        "**Ranking** — Simulated, hit rate at a 10 % HBM budget, mean ± 95 % CI over seeds; "
        "margins are paired per seed.\n\n" + "\n".join(lines)
    )


def _verdict(ranking: list[dict[str, Any]]) -> tuple[str, str]:
    """Confirms when the EMA is best or tied (margin's CI includes 0) on every workload;
    contradicts when another policy beats it (CI excluding 0) on most workloads."""
    beaten = [r for r in ranking if r["best"] != BASELINE and excludes_zero(r["over_ema"])]
    leaders = sorted({r["best"] for r in ranking})
    where = ", ".join(f"{r['workload']}: {r['best']}" for r in beaten) or "none"
    why = (
        f"{BASELINE} is beaten with a CI excluding 0 on {len(beaten)} of {len(ranking)} "
        f"workloads ({where}); the leaders are {', '.join(leaders)}."
    )
    if any(r["over_ema"].get("ci95") is None for r in ranking if r["best"] != BASELINE):
        return "cannot say", why + " (one seed: no confidence interval)"
    if not beaten:
        return "confirms", why
    if 2 * len(beaten) > len(ranking):
        return "contradicts", why
    return "cannot say", why


def _plot(groups: dict[str, list[dict[str, Any]]], path: str) -> None:
    wls = list(groups)
    pols = groups[wls[0]][0]["policies"]
    size = (1.0 + 0.8 * len(pols), 0.9 + 0.45 * len(wls))
    with figure(path, tight=True, figsize=size) as (fig, ax):
        _draw(groups, wls, pols, fig, ax)


def _draw(
    groups: dict[str, list[dict[str, Any]]], wls: list[str], pols: Any, fig: Any, ax: Any
) -> None:
    m = np.array([[np.mean(column(groups[w], p, "hit_rate")) * 100 for p in pols] for w in wls])
    im = ax.imshow(m, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    for i in range(len(wls)):
        best = max((j for j, p in enumerate(pols) if p != BOUND), key=lambda j: m[i, j])
        for j in range(len(pols)):
            weight = "bold" if j == best else "normal"
            ax.text(j, i, f"{m[i, j]:.0f}", ha="center", va="center", fontsize=7,
                    color="white" if m[i, j] < 60 else "black", fontweight=weight)  # fmt: skip
    ax.set_xticks(range(len(pols)), pols, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(wls)), wls, fontsize=8)
    fig.colorbar(im, ax=ax, label="hit rate % (mean over seeds)")
    ax.set_title("Policies by workload (bold: best online)", fontsize=9)
    ax.text(1.0, -0.02, "Simulated", transform=ax.transAxes, ha="right", va="top",
            fontsize=7, color="gray")  # fmt: skip


EXPERIMENT = Policies()
