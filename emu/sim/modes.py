"""Float against integer: how far the published numbers are from the hardware's.

Every hit rate in docs/results.md is computed in float mode; the RTL computes the EMA
in Q0.16 (docs/policy.md, "The fixed-point contract").  This replays the same streams
in both modes, for every policy that has an integer mode, and reports per workload ×
budget the hit-rate difference float − int (mean over seeds with a 95 % CI) and the
share of victims that differ:

    differ = 1 − |F ∩ I| / max(|F|, |I|)

where F and I are the multisets of evictions (step, context, layer, KV head, block) of
the float and the integer run of one seed (so the order of victims within a step does
not count, and an entry evicted at another step does).  Both modes run audited.

``python -m kvcxl.emu.sim.modes [--seeds N] [--json F]`` prints the markdown table of
docs/results.md ("Float and integer arithmetic"); every figure is Simulated.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

import numpy as np

from kvcxl.common.sizes import BYTES, Budget, as_budget, budget_arg
from kvcxl.firmware.policies import POLICIES

from ..metrics import mean_ci
from ..workloads import WORKLOADS
from .sweep import SweepSpec, run_sweep

INT_POLICIES = sorted(name for name, cls in POLICIES.items() if "int" in cls.modes)
_KEY = ("step", "context", "layer", "head", "block")


def victims_differ(f: dict[str, np.ndarray], i: dict[str, np.ndarray]) -> float:
    """1 − |F ∩ I| / max(|F|, |I|) over the multisets of (step, ctx, layer, head, block)."""
    a = Counter(zip(*(f[k].tolist() for k in _KEY), strict=True))
    b = Counter(zip(*(i[k].tolist() for k in _KEY), strict=True))
    n = max(sum(a.values()), sum(b.values()))
    return 0.0 if n == 0 else 1.0 - sum((a & b).values()) / n


def compare(
    workloads: list[str],
    budgets: list[Budget | str],
    seeds: list[int],
    steps: int = 200,
    jobs: int | None = None,
) -> list[dict[str, Any]]:
    """One row per workload × policy × budget (policies with an integer mode); a row's
    budget is its text, as the sweep's rows carry it."""
    texts = [str(as_budget(b, BYTES)) for b in budgets]
    rows = []
    for wl in workloads:
        runs = {}
        for mode in ("float", "int"):
            spec = SweepSpec(
                workload=wl, seeds=seeds, policies=INT_POLICIES, budgets=budgets, steps=steps,
                mode=mode, record_victims=True, audit=True,
            )  # fmt: skip
            runs[mode] = {
                (r["seed"], r["policy"], r["budget"]): r for r in run_sweep(spec, jobs=jobs)
            }
        for policy in INT_POLICIES:
            for budget in texts:
                pairs = [(runs["float"][(s, policy, budget)], runs["int"][(s, policy, budget)])
                         for s in seeds]  # fmt: skip
                faults = sum(r["audit_faults"] for p in pairs for r in p)
                rows.append({
                    "workload": wl, "policy": policy, "budget": budget, "seeds": len(seeds),
                    "hit_float": mean_ci([f["hit_rate"] for f, _ in pairs]),
                    "hit_int": mean_ci([i["hit_rate"] for _, i in pairs]),
                    "float_minus_int": mean_ci([f["hit_rate"] - i["hit_rate"] for f, i in pairs]),
                    "victims_differ": mean_ci([victims_differ(f["_victims"], i["_victims"])
                                               for f, i in pairs]),
                    "audit_faults": faults,
                })  # fmt: skip
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def pct(m: dict[str, Any], digits: int = 1) -> str:
        s = f"{100 * m['mean']:.{digits}f}"
        return s if m["ci95"] is None else f"{s} ± {100 * m['ci95']:.{digits}f}"

    out = [
        "| workload | policy | budget | hit % float | hit % int | float − int, pts | "
        "victims that differ, % |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['workload']} | {r['policy']} | {r['budget']} | {pct(r['hit_float'])} | "
            f"{pct(r['hit_int'])} | {pct(r['float_minus_int'], 2)} | {pct(r['victims_differ'])} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcxl.emu.sim.modes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--seeds", type=int, default=10, help="seeds per workload (default 10)")
    ap.add_argument("--steps", type=int, default=200, help="decode steps (default 200)")
    ap.add_argument("--budget", action="append", type=budget_arg(BYTES),
                    help="HBM budgets (default 10%% and 25%%)")  # fmt: skip
    ap.add_argument("--workload", action="append", help="workloads (default: all)")
    ap.add_argument("--jobs", type=int, default=None, help="local processes (default: cores)")
    ap.add_argument("--json", dest="json_out", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.steps < 1:
        raise SystemExit("--seeds and --steps must be >= 1")
    rows = compare(
        args.workload or list(WORKLOADS), args.budget or ["10%", "25%"],
        list(range(args.seeds)), args.steps, args.jobs,
    )  # fmt: skip
    print(markdown(rows))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"evidence": "Simulated", "rows": rows}, f, indent=2)
    return 0 if all(r["audit_faults"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
