"""The user sweep again, with the transfer timeline, per timing preset (docs/timeline.md).

The same scaled S1, workload, policy and seeds as :mod:`.users`, one series per timing
preset (the design's 200 ns / 64 GB/s and its 121 / 32 GB/s ends; CXL-DMSim's ASIC and
FPGA expanders), with every transfer — demand misses, write-backs to CXL DRAM and NVMe,
spills — queued on the link, device DRAM and NVMe.  Hot set 1/16 of the context (16
users' hot sets just fit the 47 GB), the firmware's placement, and CXL DRAM first (the
users experiment's series whose analytic bound was 16) at each CXL preset.  A count meets
the target when its per-user tokens/s CI is wholly ≥ 10.
"""

from __future__ import annotations

from typing import Any

from kvcxl.emu.metrics import mean_ci
from kvcxl.emu.serving import combine_serving
from kvcxl.emu.shape import PRESETS

from .users import POLICY, WORKLOAD, Users, _fmt, _meets, caption, read_bound, verdict_of
from .users import SCALES as USERS_SCALES

#: Series: (timing preset, full-size CXL GB/s or None for the preset's own, placement:
#: the firmware's rule, or CXL DRAM first: the users experiment's two placements).
SERIES = {
    "seed": ("seed", None, "policy"),
    "asic": ("asic", None, "policy"),
    "fpga": ("fpga", None, "policy"),
    "seed-fill": ("seed", None, "fill"),
    "asic-fill": ("asic", None, "fill"),
    "fpga-fill": ("fpga", None, "fill"),
    "seed-121": ("seed", 121.0, "policy"),
    "seed-32": ("seed", 32.0, "policy"),
}
#: The series per scale; shapes, user counts, steps and warm-up are the users experiment's.
SERIES_AT = {"tiny": ["seed"], "mid": list(SERIES), "s1": list(SERIES),
             "ci": ["seed", "asic", "fpga", "seed-fill", "asic-fill", "fpga-fill"]}  # fmt: skip
SCALES: dict[str, dict[str, Any]] = {
    k: {**USERS_SCALES[k], "series": v} for k, v in SERIES_AT.items()
}
HOT = 1 / 16


class UsersTimeline(Users):
    name = "users-timeline"
    question = (
        "With every transfer queued on the link, device DRAM and NVMe, how many concurrent "
        "long-context users keep ≥ 10 tokens/s each, per CXL timing preset?"
    )
    claim = "16 users is the bound of S1's HBM split (design §K.6), now with contention"

    def cases(self, scale: str) -> list[dict[str, Any]]:
        if scale not in SCALES:
            raise ValueError(f"scale {scale!r}: must be one of {', '.join(SCALES)}")
        sc = SCALES[scale]
        layers, kv_heads, tokens = sc["dims"]
        blocks = -(-tokens // PRESETS["s1"].block_tokens)
        return [
            {
                "workload": WORKLOAD, "policy": POLICY, "users": u, "hot_fraction": HOT,
                "placement": SERIES[name][2], "read": f"topk:{max(1, round(HOT * blocks))}",
                "layers": layers, "kv_heads": kv_heads, "context_tokens": tokens,
                "steps": sc["steps"], "warmup": sc["warmup"], "series": name,
                "timing": SERIES[name][0], "timeline": True,
                **({"cxl_gbps": SERIES[name][1]} if SERIES[name][1] else {}),
            }
            for u in sc["users"]
            for name in sc["series"]  # series inner: consecutive runs share one stream
        ]  # fmt: skip

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r["series"], r["users"]), []).append(r)
        series: dict[str, list[dict[str, Any]]] = {}
        for (name, users), runs in sorted(groups.items()):
            row = combine_serving(runs)
            hit = mean_ci([r["hit_rate"] for r in runs])
            row.update(series=name, users=users, hit_rate=hit["mean"], hit_ci95=hit["ci95"])
            for k in ("link_rd_utilisation", "link_wr_utilisation", "nvme_utilisation"):
                row[k] = mean_ci([r.get(k) for r in runs])["mean"]
            row["meets"] = _meets(row)
            series.setdefault(name, []).append(row)
        parts, bounds = [], []
        for name, rs in series.items():
            bound, words = read_bound(rs)
            bounds.append(bound)
            parts.append(f"{name}: {words}")
        why = "; ".join(parts) + " (Simulated, with the transfer timeline)"
        verdict = verdict_of(bounds)
        return {"tables": [_table(series)], "caption": caption(rows), "verdict": verdict,
                "why": why, "plots": {}}  # fmt: skip


def _table(series: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| timing | users | seeds | hit rate | tok/s per user | ITL p50 / p99 (ms) | "
        "TTFT p50 / p99 (s) | link rd / wr use | NVMe use | meets 10 tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    word = {True: "yes", False: "no", None: "undecided"}
    for name, rs in series.items():
        for r in rs:
            t50, t99 = (None if r[f"ttft_ms_{q}"] is None else r[f"ttft_ms_{q}"] / 1e3
                        for q in ("p50", "p99"))  # fmt: skip
            lines.append(
                f"| {name} | {r['users']} | {r['seeds']} | "
                f"{_fmt(r['hit_rate'], '.3f', r['hit_ci95'])} | "
                f"{_fmt(r['tokens_per_s_per_user'], '.2f', r['tokens_per_s_per_user_ci95'])} | "
                f"{_fmt(r['itl_ms_p50'], '.1f')} / {_fmt(r['itl_ms_p99'], '.1f')} | "
                f"{_fmt(t50, '.1f')} / {_fmt(t99, '.1f')} | "
                f"{_fmt(r['link_rd_utilisation'], '.2f')} / "
                f"{_fmt(r['link_wr_utilisation'], '.2f')} | "
                f"{_fmt(r['nvme_utilisation'], '.2f')} | {word[r['meets']]} |"
            )
    return "\n".join(lines)


EXPERIMENT = UsersTimeline()
