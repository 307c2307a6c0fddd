"""How many users can S1 serve? The user count swept from 1 to 24 (docs/serving.md).

The design sized S1's HBM split (47 GB of KV budget behind 140 GB of weights) for 16
users at a 97 % hit rate, both retracted; its validation programme asks for the user
count swept from 1 to 24 to test the claim that 16 is the bound.  Here a user is one
lane of the long-context retrieval workload: a 0.9 × context prompt, then decode steps
that read each head's top-k blocks (the hot set) of the growing context.

The run is a scaled-down S1 that keeps every ratio that decides the answer (see
:func:`scaled_shape`): S1's layers, heads and tokens are cut, so bytes shrink by a
factor ``k`` (per user 40 GiB → 40 GiB / k); the HBM budget, CXL and NVMe capacities
shrink by the same ``k`` and so do the HBM, CXL and NVMe bandwidths, so every transfer
takes the time it takes at S1 (the per-access latencies are not scaled: at most one per
tier per layer batch).  The anchor zone (S1: the first 100 tokens) scales with the
context; it cannot be less than one block, so the first block of each head stays pinned
(0.8 % of a 2,048-token context against S1's 0.09 %).  The synthetic attention is the
design's defaults (a 70 B model; the fit to SmolLM2 is kept for the ci preset).
The serving model (:mod:`kvcxl.emu.serving`) adds S1's weight streaming per step and
S1's prefill compute (Analytical model) and scales bytes, entries and prompt tokens
back to S1.  A user count meets the design's target when its per-user
tokens/s is ≥ 10 with 95 % confidence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kvcxl.common.figures import figure
from kvcxl.emu.metrics import mean_ci
from kvcxl.emu.serving import ServingModel, combine_serving, serving_metrics, workload_turns
from kvcxl.emu.shape import PRESETS, Deployment, ModelShape
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.timeline.resources import PRESETS as TIMING_PRESETS
from kvcxl.emu.timing import TierTiming
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.emu.workloads.attention import attention_for, attention_source
from kvcxl.firmware.config import PolicyConfig

from ._common import LastStream
from .base import Experiment

TARGET_TOKENS_PER_S = 10.0  # per user (docs/design.md, Scenario S1)
CLAIMED_BOUND = 16
# A run's hit rate moving more than this (points) between the halves of its measured steps
# says the warm-up did not suffice (measured_halves).
SETTLED_PTS = 1.0
SCALED_NAME = "s1-scaled"  # not a fitted preset: the attention is the seed's defaults
WORKLOAD = "retrieval"
POLICY = "ema"

#: Per scale: (layers, kv_heads, context tokens) of the scaled S1, user counts, steps,
#: warm-up steps, hot-set fractions (top-k blocks per head over the context's blocks) and
#: where an entry leaving HBM goes (the firmware's placement rule, or CXL DRAM first).
SCALES: dict[str, dict[str, Any]] = {
    "tiny": {
        "dims": (2, 1, 512),
        "users": [1, 2, 4],
        "steps": 24,
        "warmup": 8,
        "hot": [1 / 16],
        "placement": ["policy"],
    },
    "ci": {
        "dims": (4, 2, 2048),
        "users": list(range(1, 25)),
        "steps": 64,
        "warmup": 16,
        "hot": [1 / 32, 1 / 16],
        "placement": ["policy", "fill"],
    },
    "mid": {
        "dims": (8, 4, 4096),
        "users": list(range(1, 25)),
        "steps": 128,
        "warmup": 32,
        "hot": [1 / 32, 1 / 16],
        "placement": ["policy", "fill"],
    },
}

#: S1 itself (k = 1: nothing scaled) with mid's user counts, hot sets and placements: 80
#: layers × 8 KV heads × 128 K tokens, 1,000 steps (β·idle reaches 1), the first 100
#: warm-up, as the other experiments' s1 scale.
SCALES["s1"] = {**SCALES["mid"], "dims": (80, 8, 131072), "steps": 1000, "warmup": 100}


def scaled_shape(layers: int, kv_heads: int, context_tokens: int) -> ModelShape:
    """S1 with fewer layers, KV heads and tokens; d_head, dtype, block size and the GQA
    group stay S1's, so an entry is S1's 8 KiB and only the entry count shrinks."""
    s1 = PRESETS["s1"]
    return s1.with_(
        name=SCALED_NAME,
        layers=layers,
        kv_heads=kv_heads,
        q_heads=kv_heads * s1.group_size,
        context_tokens=context_tokens,
    )


def scaled_run(
    shape: ModelShape, dep: Deployment, base: TierTiming | None = None
) -> tuple[SimOptions, ServingModel]:
    """The simulator options and serving model of ``shape`` standing for S1 as in ``dep``;
    ``base``: the full-size tier timing (default: the defaults)."""
    full = PRESETS["s1"]
    k = full.context_bytes / shape.context_bytes
    t = base or TierTiming()
    timing = replace(t, hbm_gbps=t.hbm_gbps / k, cxl_gbps=t.cxl_gbps / k, nvme_gbps=t.nvme_gbps / k)
    kv_budget = dep.hbm_bytes - dep.weights_bytes - dep.activations_bytes
    # The anchor zone is S1's tokens scaled down with the context (at least one token: the
    # first block stays pinned, a larger share of a short context than of S1's).
    anchor = PolicyConfig().anchor_zone_size * shape.context_tokens / full.context_tokens
    opts = SimOptions(
        policy=POLICY,
        budget_bytes=int(kv_budget / k),
        cxl_bytes=int(dep.cxl_bytes / k),
        nvme_bytes=int(dep.nvme_bytes / k),
        timing=timing,
        config=PolicyConfig(anchor_zone_size=max(1, round(anchor))),
    )
    return opts, ServingModel.for_deployment(shape, full, dep, t.hbm_gbps)


class Users(Experiment):
    name = "users"
    question = (
        "At S1's sizing, how many concurrent long-context users keep ≥ 10 tokens/s each, "
        "and what do TTFT, ITL, link demand, metadata and energy per token do from 1 to 24 users?"
    )
    claim = "16 users is the bound of S1's HBM split (design §K.6; the 16-user sizing)"

    def cases(self, scale: str) -> list[dict[str, Any]]:
        if scale not in SCALES:
            raise ValueError(f"scale {scale!r}: must be one of {', '.join(SCALES)}")
        sc = SCALES[scale]
        layers, kv_heads, tokens = sc["dims"]
        blocks = -(-tokens // PRESETS["s1"].block_tokens)
        return [
            {
                "workload": WORKLOAD,
                "policy": POLICY,
                "users": u,
                "hot_fraction": hot,
                "placement": placement,
                "read": f"topk:{max(1, round(hot * blocks))}",
                "layers": layers,
                "kv_heads": kv_heads,
                "context_tokens": tokens,
                "steps": sc["steps"],
                "warmup": sc["warmup"],
            }
            # placement inner: a worker's consecutive runs share one stream (_stream)
            for hot in sc["hot"]
            for u in sc["users"]
            for placement in sc["placement"]
        ]

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        shape = scaled_shape(case["layers"], case["kv_heads"], case["context_tokens"])
        dep = Deployment(users=case["users"])
        # A case may name a timing preset and turn the transfer timeline on (docs/timeline.md).
        base = TIMING_PRESETS[case["timing"]].timing() if "timing" in case else None
        if "cxl_gbps" in case:  # a point of the design's 32-121 GB/s bracket
            base = replace(base or TierTiming(), cxl_gbps=case["cxl_gbps"])
        opts, model = scaled_run(shape, dep, base)
        opts = replace(opts, warmup_steps=case["warmup"], placement=case["placement"],
                       timeline=bool(case.get("timeline", False)))  # fmt: skip
        r = simulate(_stream(case, seed, shape), opts)
        turns = workload_turns(
            make_workload(case["workload"], shape, seed=seed, lanes=case["users"]),
            case["steps"],
        )
        s = serving_metrics(r, model, turns)
        s.pop("evidence")
        first, second = measured_halves(r["per_step"], case["warmup"])
        return {
            "hit_rate": r["hit_rate"],
            "hit_rate_first_half": first,
            "hit_rate_second_half": second,
            "misses_nvme": r["misses_nvme"],
            **s,
        }  # (with the timeline, s holds its per-resource utilisation too)

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r["placement"], r["hot_fraction"], r["users"]), []).append(r)
        summary = []
        for (placement, hot, users), runs in sorted(groups.items()):
            row = combine_serving(runs)
            hit = mean_ci([r["hit_rate"] for r in runs])
            row.update(placement=placement, hot_fraction=hot, users=users)
            row.update(hit_rate=hit["mean"], hit_ci95=hit["ci95"])
            row["meets"] = _meets(row)
            row["meets_link_bound"] = _meets(row, "link_bound_tokens_per_s_per_user")
            summary.append(row)
        verdict, why = _verdict(summary)
        return {
            "tables": [_table(summary)],
            "caption": caption(rows),
            "verdict": verdict,
            "why": why,
            "plots": {"users-tokens.png": lambda path: _plot(summary, path)},
        }


#: What decides a users run's read stream: its runs that agree on these (and the seed)
#: differ only in how the device is timed and placed, and replay one stream.
STREAM_FIELDS = ("workload", "users", "layers", "kv_heads", "context_tokens", "steps", "read",
                 "attention")  # fmt: skip
STREAMS = LastStream()


def _stream(case: dict[str, Any], seed: int, shape: ModelShape) -> Any:
    """The read stream of ``case`` on ``seed``, built once for the consecutive runs that
    share it (:class:`~._common.LastStream`)."""

    def build() -> Any:
        wl = make_workload(case["workload"], shape, seed=seed, lanes=case["users"])
        attention = attention_for(shape, case.get("attention"))
        return compile_workload(wl, case["steps"], attention=attention, read=case["read"])

    return STREAMS.get((seed, *(case.get(k) for k in STREAM_FIELDS)), build)


def measured_halves(per_step: dict[str, Any], warmup: int) -> tuple[float | None, float | None]:
    """The hit rate of the first and of the second half of a run's measured steps (those
    after the warm-up; the second half takes an odd one): a warm-up that sufficed leaves
    them about equal.  None where a half has no steps or no reads."""
    reads = np.asarray(per_step["reads"][warmup:], np.int64)
    hits = np.asarray(per_step["hits"][warmup:], np.int64)
    half = reads.size // 2

    def rate(a: int, b: int) -> float | None:
        n = int(reads[a:b].sum())
        return float(hits[a:b].sum()) / n if n else None

    return (rate(0, half), rate(half, reads.size)) if half else (None, None)


def settling(rows: list[dict[str, Any]]) -> str:
    """What the caption says of the warm-up: the largest move of a run's hit rate from the
    first half of its measured steps to the second, settled within ``SETTLED_PTS`` points;
    "" for runs stored before the halves were kept."""
    moves = [
        abs(r["hit_rate_second_half"] - r["hit_rate_first_half"]) * 100
        for r in rows
        if r.get("hit_rate_first_half") is not None and r.get("hit_rate_second_half") is not None
    ]
    if not moves:
        return ""
    worst = max(moves)
    if worst <= SETTLED_PTS:
        return (
            f" The warm-up sufficed: no run's hit rate moves more than {worst:.2f} pts from "
            "the first half of its measured steps to the second."
        )
    return (
        f" The warm-up did not suffice: a run's hit rate moves by up to {worst:.2f} pts from "
        f"the first half of its measured steps to the second (settled: ≤ {SETTLED_PTS:g}); "
        "a longer --warmup would measure the settled steps."
    )


def caption(rows: list[dict[str, Any]]) -> str:
    """The line above a users table: its class, the scaled shape, the runs and where the
    attention came from (the scaled S1 is no fitted preset: the seed's defaults unless the
    case chose the fit)."""
    c = rows[0]
    dims = [c.get(k) for k in ("layers", "kv_heads", "context_tokens")]
    shape = "scaled S1"
    if all(dims):
        shape += f" ({dims[0]} layers × {dims[1]} KV heads × {dims[2]:,} tokens)"
    if "steps" in c and "warmup" in c:
        shape += f", {c['steps']} steps of which the first {c['warmup']} are warm-up (excluded)"
    seeds = sorted({r["seed"] for r in rows})
    return (
        f"Simulated (S1's weights and prefill: Analytical model), {shape}, {len(seeds)} seeds "
        f"({seeds[0]}–{seeds[-1]}); attention: synthetic, "
        f"{attention_source(SCALED_NAME, c.get('attention'), c.get('layers'))}." + settling(rows)
    )


def _series(summary: list[dict[str, Any]]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """The summary rows per (placement, hot set), by user count."""
    out: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in sorted(summary, key=lambda r: r["users"]):
        out.setdefault((r["placement"], r["hot_fraction"]), []).append(r)
    return out


def _label(placement: str, hot: float) -> str:
    return f"hot set {hot:.2%}, placement {placement}"


def _meets(row: dict[str, Any], key: str = "tokens_per_s_per_user") -> bool | None:
    """True/False when the per-user tokens/s CI is wholly above/below the target, else None."""
    mean, half = row[key], row[f"{key}_ci95"] or 0.0
    if mean is None:
        return None
    if mean - half >= TARGET_TOKENS_PER_S:
        return True
    if mean + half < TARGET_TOKENS_PER_S:
        return False
    return None


def bound_of(rows: list[dict[str, Any]], meets: str = "meets") -> tuple[int, bool]:
    """The largest user count up to which every count meets the target, and whether that is
    decided: the next count fails (not undecided, and the sweep does not end there)."""
    best = 0
    for row in sorted(rows, key=lambda r: r["users"]):
        if row[meets] is True:
            best = row["users"]
            continue
        return best, row[meets] is False
    return best, False  # every count met it: the bound lies beyond the sweep


def read_bound(rows: list[dict[str, Any]], meets: str = "meets") -> tuple[int | None, str]:
    """A series' bound (:func:`bound_of`; None where it is left open) and it in words."""
    b, decided = bound_of(rows, meets)
    if not decided:
        return None, open_words(b, rows)
    hi = first_fail(b, rows) - 1
    # a range of counts not swept that holds the claimed bound: the claim is not decided
    return (None if b <= CLAIMED_BOUND <= hi and hi > b else b), bound_words(b, rows)


def first_fail(b: int, rows: list[dict[str, Any]]) -> int:
    """The first count that fails past a decided bound ``b``: the sweep's next count."""
    return min(r["users"] for r in rows if r["users"] > b)


def verdict_of(bounds: list[int | None]) -> str:
    """Confirms when every series' bound is decided and 16; contradicts when every one is
    decided and none is 16; otherwise cannot say."""
    if bounds and all(b is not None for b in bounds):
        if all(b == CLAIMED_BOUND for b in bounds):
            return "confirms"
        if all(b != CLAIMED_BOUND for b in bounds):
            return "contradicts"
    return "cannot say"


def bound_words(b: int, rows: list[dict[str, Any]]) -> str:
    """A decided bound in words: the counts below a sweep that starts above 1 (``--where
    users=14-18``) were not run, so a first count that fails puts the bound below it; a
    gap between the last count that meets the target and the first that fails leaves the
    bound a range."""
    lo = min(r["users"] for r in rows)
    if b == 0 and lo > 1:
        return f"the bound is below {lo} users (the sweep's smallest count fails)"
    nxt = first_fail(b, rows)
    if nxt > b + 1:  # (--where users=4,8)
        return (
            f"the bound is {b}–{nxt - 1} users ({b} meets the target, {nxt} fails; the "
            "counts between were not swept)"
        )
    return f"the bound is {b} users"


def open_words(b: int, rows: list[dict[str, Any]]) -> str:
    """A bound :func:`bound_of` left open, in words: every count swept met the target, or
    the count after the ones that met it (the next one swept, not b + 1) is undecided."""
    counts = sorted(r["users"] for r in rows)
    nxt = next((u for u in counts if u > b), None)
    if nxt is None:
        return f"every count up to {counts[-1]} meets the target"
    why = "its 95 % CI straddles 10 tok/s"
    if b == 0:
        return f"{nxt} users, the sweep's smallest count, is undecided ({why})"
    return f"{b} users meet it, {nxt} is undecided ({why})"


#: The two timings a bound is read under: the simulator's, and the link carrying every move.
TIMINGS = {"meets": "simulated timing", "meets_link_bound": "link-bound"}


def _verdict(summary: list[dict[str, Any]]) -> tuple[str, str]:
    """:func:`verdict_of` every series' bound under both timings."""
    parts, bounds = [], []
    for (placement, hot), rows in _series(summary).items():
        for meets, timing in TIMINGS.items():
            bound, words = read_bound(rows, meets)
            bounds.append(bound)
            parts.append(f"{_label(placement, hot)}, {timing}: {words}")
    verdict = verdict_of(bounds)
    why = "; ".join(parts) + (f"; none is {CLAIMED_BOUND}" if verdict == "contradicts" else "")
    return verdict, why


def _fmt(v: Any, spec: str, ci: Any = None) -> str:
    if v is None:
        return "–"
    s = format(v, spec)
    return f"{s} ± {format(ci, spec)}" if ci is not None else s


def _link_figure(r: dict[str, Any]) -> Any:
    """The timeline's link utilisation where the run has one, else the link demand."""
    return r["link_utilisation"] if r.get("link_utilisation") is not None else r["link_demand"]


def _table(summary: list[dict[str, Any]]) -> str:
    head = (
        "| placement | hot set | users | seeds | hit rate | tok/s per user | tok/s aggregate | "
        "ITL p50 / p95 / p99 (ms) | TTFT p50 / p95 / p99 (s) | link demand | J/token | "
        "tok/s per user, link-bound | meets 10 tok/s (simulated / link-bound) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in summary:
        ttft = [None if r[f"ttft_ms_{q}"] is None else r[f"ttft_ms_{q}"] / 1e3
                for q in ("p50", "p95", "p99")]  # fmt: skip
        e = r["energy_mj_per_token"]
        word = {True: "yes", False: "no", None: "undecided"}
        meets = f"{word[r['meets']]} / {word[r['meets_link_bound']]}"
        lb, lb_ci = (
            r["link_bound_tokens_per_s_per_user"],
            r["link_bound_tokens_per_s_per_user_ci95"],
        )
        lines.append(
            f"| {r['placement']} | {r['hot_fraction']:.2%} | {r['users']} | {r['seeds']} | "
            f"{_fmt(r['hit_rate'], '.3f', r['hit_ci95'])} | "
            f"{_fmt(r['tokens_per_s_per_user'], '.2f', r['tokens_per_s_per_user_ci95'])} | "
            f"{_fmt(r['tokens_per_s'], '.1f')} | "
            f"{_fmt(r['itl_ms_p50'], '.1f')} / {_fmt(r['itl_ms_p95'], '.1f')} / "
            f"{_fmt(r['itl_ms_p99'], '.1f')} | "
            f"{_fmt(ttft[0], '.1f')} / {_fmt(ttft[1], '.1f')} / {_fmt(ttft[2], '.1f')} | "
            f"{_fmt(_link_figure(r), '.2f')} | "
            f"{_fmt(None if e is None else e / 1e3, '.2f')} | {_fmt(lb, '.2f', lb_ci)} | "
            f"{meets} |"
        )
    return "\n".join(lines)


def _plot(summary: list[dict[str, Any]], path: str) -> None:
    with figure(path, tight=True, figsize=(6.4, 3.6)) as (_, ax):
        _draw(summary, ax)


def _draw(summary: list[dict[str, Any]], ax: Any) -> None:
    for (placement, hot), rs in _series(summary).items():
        x = np.array([r["users"] for r in rs])
        y = np.array([r["tokens_per_s_per_user"] for r in rs], dtype=float)
        e = np.array([r["tokens_per_s_per_user_ci95"] or 0.0 for r in rs], dtype=float)
        line = ax.errorbar(x, y, yerr=e, marker="o", ms=3, capsize=2, label=_label(placement, hot))
        lb = np.array([r["link_bound_tokens_per_s_per_user"] for r in rs], dtype=float)
        ax.plot(x, lb, ls="--", lw=1, color=line[0].get_color())
    ax.axhline(TARGET_TOKENS_PER_S, color="gray", ls="--", lw=1, label="target 10 tok/s")
    ax.axvline(CLAIMED_BOUND, color="red", ls=":", lw=1, label="claimed bound 16")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("tokens/s per user (mean, 95 % CI;\ndashed: link-bound)")
    ax.set_title("S1, scaled: per-user decode rate against users", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.text(0.99, 0.01, "Simulated + Analytical model", transform=ax.transAxes, ha="right",
            va="bottom", fontsize=7, color="gray")  # fmt: skip


EXPERIMENT = Users()
