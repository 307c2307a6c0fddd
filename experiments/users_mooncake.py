"""How much of Mooncake's production load does S1 serve at ≥ 10 tokens/s per user?
The user-count question asked on real arrivals (docs/validation.md, "users-mooncake").

The users experiments (:mod:`.users`, :mod:`.users_timeline`) sweep a count of identical
synthetic lanes.  Here the load is Mooncake's published conversation trace
(:mod:`kvcxl.emu.workloads.mooncake`): its arrivals, prompt and output lengths and prefix
reuse, with the synthetic attention on top.  The sweep:

* **Load knob.** The trace's arrival rate scaled by a factor ``rate`` (its timestamps
  divided by it; the workload's ``rate`` parameter).  Lengths and prefixes are the
  trace's, so the number of requests decoding at once scales with ``rate`` (Little's
  law).  That number is the **user count** here: every point reports the mean and the
  peak of the requests decoding in a step over the measured steps, counted from the
  simulator's per-step output.  The simulator keeps only the steps in which some request
  decodes (an idle step holds no user and takes no time), and its warm-up is the first
  ``warmup`` of those; at ``ci`` only the lowest rate has idle steps (12 of 96), between
  the trace's 3 s groups.  A user is an active request, and a request's tokens/s is
  one over its mean inter-token latency, as in the users experiments.
* **Time.** The trace's clock needs a real time per token (``itl_ms``, an assumption of
  the workload).  It is set to the target's, 100 ms (10 tokens/s), which makes the answer
  self-consistent: a point that meets the target decodes each request at least as fast as
  the replay assumed, so its requests would leave no later than replayed and the true
  concurrency is at most the replayed one; a point that fails would, in a real server,
  hold its requests longer and face more concurrency than replayed.  Either verdict
  therefore holds for the real server too (given that more concurrency is never faster).
* **Size.** S1 scaled as in the users experiments (:func:`.users.scaled_shape`,
  :func:`.users.scaled_run`: bytes, capacities and bandwidths divided by one factor ``k``;
  S1's weight streaming and prefill added by the serving model), with a context of S1's
  128 K tokens × the workload's ``token_scale`` (1/32: one 512-token hash block is one
  16-token KV block), so a simulated token stands for 32 real ones in bytes *and* in
  prompt length, no conversation request is cut (the longest is 3,944 + 11 simulated
  tokens of 4,096), and the serving model's prompt scale is the workload's.
* **Reads.** Each head reads its top-k blocks, k = 1/16 of S1's context (8,192 real tokens
  per head, as the users-timeline experiment's hot set; a prompt shorter than that is
  read whole), under the ``ema`` policy, prefetch off.
* **Movement per step.** A simulated step decodes one simulated token, i.e. 32 real tokens
  of every active request.  Its reads are per real token (a step's hot-set read is paid
  once per real token, so HBM time is not rescaled), but what the step *moves* — demand
  misses, write-backs, spills of the prompts' KV — a real server moves once over those 32
  tokens.  Two series bracket this: **amortised** divides every device-side cost by 32
  (CXL and NVMe bandwidths × 32, their access latencies / 32), so each real token pays
  1/32 of the step's movement: the mean is right if a missed block stays needed for the
  step's 32 tokens, the ITL tail is smoothed; **per-step** charges the whole movement to
  every real token (the users experiments' timing, here an upper bound on the cost).
* **Series.** The timing presets ``seed`` (200 ns, 64 GB/s), ``asic`` and ``fpga`` with
  the firmware's placement, and ``seed`` with CXL DRAM first (``seed-fill``), amortised;
  at ``ci`` also the two ``seed`` placements per-step; at ``mid`` every users-timeline
  series both ways, on both published traces (the synthetic one has requests
  longer than S1's 128 K tokens: they are cut there, and the table says how many).
  The transfer timeline is on (either engine), and every resource's utilisation is
  checked to be ≤ 1.
* **Seeds and statistics.** The arrivals are deterministic (the trace): a seed changes
  only the synthetic attention, so the 95 % CIs cover the attention alone, not the
  arrival process; the concurrency is the same at every seed.  A point **meets** the
  target when its per-user tokens/s CI is wholly ≥ 10, **fails** when wholly below.
  A series' bound lies between the mean concurrency of the last point up to which every
  point meets and that of the first point that does not.
* **Verdict.** The two movements bound a real server from either side (:func:`position`):
  per-step over-charges, so where it meets a server meets; amortised under-charges, so
  where it fails a server fails.  Per timing series, a server's bound therefore lies
  between per-step's last meeting point and amortised's first failing one.  The claim
  is contradicted when that range excludes 16 for every series, confirmed when both
  movements' own brackets hold 16 for every series, and otherwise the run cannot say
  (:func:`verdict_of`): a range from 6.8 to 83 concurrent requests places 16 nowhere.
* **The trace's clock.** Its timestamps come in groups about 3 s apart: at a low rate a
  group arrives within one step and its prefills queue one after another (TTFT), and the
  concurrency swings between groups (the peak beside the mean says how far).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from kvcxl.common.figures import figure
from kvcxl.emu.metrics import mean_ci
from kvcxl.emu.serving import combine_serving, serving_metrics, workload_turns
from kvcxl.emu.shape import PRESETS, Deployment
from kvcxl.emu.sim.simulator import simulate
from kvcxl.emu.timeline.resources import PRESETS as TIMING_PRESETS
from kvcxl.emu.timing import TierTiming
from kvcxl.emu.workloads import compile_workload, make_workload
from kvcxl.emu.workloads.attention import attention_for
from kvcxl.emu.workloads.mooncake import HASH_BLOCK_TOKENS

from ._common import LastStream
from .base import Experiment
from .users import (
    CLAIMED_BOUND,
    POLICY,
    TARGET_TOKENS_PER_S,
    _fmt,
    _meets,
    caption,
    scaled_run,
    scaled_shape,
)
from .users_timeline import HOT
from .users_timeline import SERIES as TIMELINE_SERIES

#: The real time per token the trace's clock runs at: the target's (see the docstring).
ITL_MS = 1e3 / TARGET_TOKENS_PER_S
#: Simulated tokens per real one: one 512-token hash block is one KV block.
TOKEN_SCALE = PRESETS["s1"].block_tokens / HASH_BLOCK_TOKENS
CONTEXT_TOKENS = int(PRESETS["s1"].context_tokens * TOKEN_SCALE)
MOVEMENTS = ("amortised", "per-step")
RESOURCES = ("link_rd", "link_wr", "dram", "nvme")

#: Per scale: (layers, KV heads) of the scaled S1, traces, arrival-rate factors, steps,
#: warm-up steps and the series: (users-timeline series, movement).
SCALES: dict[str, dict[str, Any]] = {
    "tiny": {
        "dims": (2, 1),
        "workloads": ["mooncake"],
        "rates": [1 / 32, 1 / 4],  # 1/32: idle steps between the trace's 3 s groups
        "steps": 32,
        "warmup": 8,
        "series": [("seed", "amortised")],
    },
    "ci": {
        "dims": (4, 2),
        "workloads": ["mooncake"],
        "rates": [1 / 32, 1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1],
        "steps": 96,
        "warmup": 32,
        "series": [(s, "amortised") for s in ("seed", "asic", "fpga", "seed-fill")]
        + [(s, "per-step") for s in ("seed", "seed-fill")],
    },
    "mid": {
        "dims": (8, 4),
        "workloads": ["mooncake", "mooncake-synthetic"],
        "rates": [1 / 32, 1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1, 3 / 2],
        "steps": 192,
        "warmup": 64,
        "series": [(s, m) for m in MOVEMENTS for s in TIMELINE_SERIES],
    },
}

#: S1's 80 layers × 8 KV heads (its context at the trace's token scale, as every scale) with
#: mid's traces, rates and series; 1,000 steps of which the first 100 are warm-up, as the
#: other experiments' s1 scale.
SCALES["s1"] = {**SCALES["mid"], "dims": (80, 8), "steps": 1000, "warmup": 100}


def series_name(timeline_series: str, movement: str) -> str:
    return timeline_series if movement == "amortised" else f"{timeline_series}/per-step"


def amortised(t: TierTiming, factor: float) -> TierTiming:
    """``t`` with every device-side cost divided by ``factor`` (the real tokens a simulated
    step stands for): CXL and NVMe bandwidths × factor, their latencies / factor; HBM as is
    (its reads are paid per real token)."""
    return replace(
        t,
        cxl_gbps=t.cxl_gbps * factor,
        nvme_gbps=t.nvme_gbps * factor,
        cxl_latency_ns=t.cxl_latency_ns / factor,
        nvme_latency_ns=t.nvme_latency_ns / factor,
    )


def check_utilisation(util: dict[str, float], where: str) -> None:
    """Refuse a run whose timeline reports a resource busier than the run (a bug)."""
    for k in RESOURCES:
        if not 0.0 <= util[k] <= 1.0 + 1e-9:
            raise ValueError(f"{where}: {k} utilisation {util[k]!r} is outside [0, 1]")


STREAMS = LastStream()


def _stream(
    wl: str, seed: int, dims: tuple[int, int, int], rate: float, steps: int, read: str,
    attention: str | None,
):  # fmt: skip
    """The read stream of one (trace, seed, rate, attention); the series of a rate share it
    (:class:`~._common.LastStream`: its runs are consecutive)."""

    def build() -> Any:
        shape = scaled_shape(*dims)
        return compile_workload(
            make_workload(wl, shape, seed=seed, itl_ms=ITL_MS, rate=rate), steps, read=read,
            attention=attention_for(shape, attention),
        )  # fmt: skip

    return STREAMS.get((wl, seed, dims, rate, steps, read, attention), build)


class UsersMooncake(Experiment):
    name = "users-mooncake"
    question = (
        "On Mooncake's production arrivals (its concurrency, prefix reuse and lengths), how "
        "much load does S1 serve at ≥ 10 tokens/s per active request, per timing preset, "
        "with every transfer queued?"
    )
    claim = "16 users is the bound of S1's HBM split (design §K.6), on production arrivals"

    def cases(self, scale: str) -> list[dict[str, Any]]:
        if scale not in SCALES:
            raise ValueError(f"scale {scale!r}: must be one of {', '.join(SCALES)}")
        sc = SCALES[scale]
        layers, kv_heads = sc["dims"]
        blocks = -(-CONTEXT_TOKENS // PRESETS["s1"].block_tokens)
        # rate outer, series inner: a task's consecutive runs share one compiled stream
        return [
            {
                "workload": wl, "policy": POLICY, "rate": rate,
                "series": series_name(ts, mv), "timing": TIMELINE_SERIES[ts][0],
                **({"cxl_gbps": TIMELINE_SERIES[ts][1]} if TIMELINE_SERIES[ts][1] else {}),
                "placement": TIMELINE_SERIES[ts][2], "movement": mv,
                "read": f"topk:{max(1, round(HOT * blocks))}",
                "layers": layers, "kv_heads": kv_heads, "context_tokens": CONTEXT_TOKENS,
                "steps": sc["steps"], "warmup": sc["warmup"],
            }
            for wl in sc["workloads"]
            for rate in sc["rates"]
            for ts, mv in sc["series"]
        ]  # fmt: skip

    def run(self, case: dict[str, Any], seed: int) -> dict[str, Any]:
        dims = (case["layers"], case["kv_heads"], case["context_tokens"])
        shape = scaled_shape(*dims)
        base = TIMING_PRESETS[case["timing"]].timing()
        if "cxl_gbps" in case:  # a point of the design's 32-121 GB/s bracket
            base = replace(base, cxl_gbps=case["cxl_gbps"])
        opts, model = scaled_run(shape, Deployment(), base)
        timing = opts.timing
        if case["movement"] == "amortised":
            timing = amortised(timing, 1.0 / TOKEN_SCALE)
        elif case["movement"] != "per-step":
            raise ValueError(f"movement {case['movement']!r}: must be one of {MOVEMENTS}")
        opts = replace(opts, timing=timing, warmup_steps=case["warmup"],
                       placement=case["placement"], timeline=True)  # fmt: skip
        steps = case["steps"]
        st = _stream(case["workload"], seed, dims, case["rate"], steps, case["read"],
                     case.get("attention"))  # fmt: skip
        r = simulate(st, opts)
        check_utilisation(r["timeline"]["utilisation"], f"{case['series']} rate {case['rate']}")
        wl = make_workload(case["workload"], shape, seed=seed, itl_ms=ITL_MS, rate=case["rate"])
        s = serving_metrics(r, model, workload_turns(wl, steps))
        # energy is not this experiment's question, and amortised NVMe bandwidth would
        # misprice its energy per bit (derived from the drive's bandwidth)
        for k in ("evidence", "energy_mj_per_token", "data_energy_mj_per_token"):
            s.pop(k)
        active = np.asarray(r["per_step"]["tokens"][case["warmup"] :], np.int64)
        return {
            "hit_rate": r["hit_rate"],
            "concurrency_mean": float(active.mean()),
            "concurrency_peak": int(active.max()),
            "requests": len(wl.window(steps)),
            "truncated": wl.truncated(steps),
            **s,
        }

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r["workload"], r["series"], r["rate"]), []).append(r)
        series: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for (wl, name, rate), runs in sorted(groups.items()):
            row = combine_serving(runs)
            hit = mean_ci([r["hit_rate"] for r in runs])
            row.update(workload=wl, series=name, rate=rate, hit_rate=hit["mean"],
                       hit_ci95=hit["ci95"])  # fmt: skip
            for k in ("concurrency_mean", "concurrency_peak", "requests", "truncated"):
                vals = {r[k] for r in runs}
                if len(vals) != 1:  # the arrivals are the trace's: no seed may change them
                    raise ValueError(f"{wl} {name} rate {rate}: {k} differs across seeds {vals}")
                row[k] = vals.pop()
            row["meets"] = _meets(row)
            series.setdefault((wl, name), []).append(row)
        parts = []
        for (wl, name), rs in series.items():
            lo, hi = bracket(rs)
            label = f"{wl}, {name}"
            if hi is None:
                met = "no rate" if lo is None else f"up to {lo:.1f} concurrent requests"
                parts.append(f"{label}: meets the target {met}, the next rate is undecided "
                             "or beyond the sweep")  # fmt: skip
            elif lo is None:
                parts.append(f"{label}: the bound is below {hi:.1f} concurrent requests "
                             "(the lowest rate fails)")  # fmt: skip
            else:
                parts.append(f"{label}: the bound is between {lo:.1f} (meets) and {hi:.1f} "
                             "(fails) concurrent requests")  # fmt: skip
        places = []
        for (wl, ts), by_mv in movements(series).items():
            where = position(by_mv.get("per-step"), by_mv.get("amortised"))
            places.append(where)
            parts.append(f"{wl}, {ts} ({' and '.join(by_mv)}): {_say(where, by_mv)}")
        why = "; ".join(parts) + " (Simulated, with the transfer timeline)"
        verdict = verdict_of(places)
        return {
            "tables": [_table(series)],
            "caption": caption(rows),
            "verdict": verdict,
            "why": why,
            "plots": {"users-mooncake-tokens.png": lambda path: _plot(series, path)},
        }


def bracket(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(mean concurrency of the last point up to which every point meets the target, that
    of the first point that fails); None where there is no such point (the lowest rate
    does not meet it / no point fails).  A point left undecided ends the walk: (lo, None)."""
    lo = None
    for r in sorted(rows, key=lambda r: r["rate"]):
        if r["meets"] is True:
            lo = r["concurrency_mean"]
            continue
        return lo, (r["concurrency_mean"] if r["meets"] is False else None)
    return lo, None


Bracket = tuple[float | None, float | None]
#: Where the claimed bound stands against a (trace, timing series)'s two movements.
POSITIONS = ("at", "above", "below", "open")


def movements(
    series: dict[tuple[str, str], list[dict[str, Any]]],
) -> dict[tuple[str, str], dict[str, Bracket]]:
    """Each series' bracket under (trace, timing series) and its movement."""
    out: dict[tuple[str, str], dict[str, Bracket]] = {}
    for (wl, name), rs in series.items():
        ts, _, per = name.partition("/")
        out.setdefault((wl, ts), {})["per-step" if per else "amortised"] = bracket(rs)
    return out


def position(per_step: Bracket | None, amortised: Bracket | None) -> str:
    """Where ``CLAIMED_BOUND`` stands against a server's bound, from the two movements.

    Per-step charges every real token the whole step's movement (an upper bound on the
    cost: where it meets the target, a server meets it); amortised charges 1/32 of it (a
    lower bound: where it fails, a server fails).  So a server's bound lies between the
    per-step bracket's ``lo`` and the amortised bracket's ``hi``:

    * ``above`` — per-step meets at more than the claim: a server serves more;
    * ``below`` — amortised fails at or below the claim: a server serves fewer;
    * ``at`` — each movement's own bracket holds the claim (lo ≤ claim < hi);
    * ``open`` — anything else: the claim lies between the bounds (or one is missing,
      undecided, or the two disagree), so the run cannot place it.
    """
    lo = per_step[0] if per_step else None
    hi = amortised[1] if amortised else None
    above = lo is not None and lo > CLAIMED_BOUND
    below = hi is not None and hi <= CLAIMED_BOUND
    if above != below:
        return "above" if above else "below"
    if above or per_step is None or amortised is None:
        return "open"  # both (the movements disagree) or a movement missing
    if all(b[1] is not None and (b[0] or 0.0) <= CLAIMED_BOUND < b[1]
           for b in (per_step, amortised)):  # fmt: skip
        return "at"
    return "open"


def verdict_of(places: list[str]) -> str:
    """Confirms when the claim is ``at`` every series' bound, contradicts when every
    series puts a server ``above`` or ``below`` it, otherwise cannot say."""
    bad = [p for p in places if p not in POSITIONS]
    if bad:
        raise ValueError(f"position {bad[0]!r}: must be one of {', '.join(POSITIONS)}")
    if places and all(p == "at" for p in places):
        return "confirms"
    if places and all(p in ("above", "below") for p in places):
        return "contradicts"
    return "cannot say"


def _say(where: str, by_mv: dict[str, Bracket]) -> str:
    """One (trace, timing series)'s position in words, with the two bounds it rests on."""
    lo = (by_mv.get("per-step") or (None, None))[0]
    hi = (by_mv.get("amortised") or (None, None))[1]
    low = "no lower bound" if lo is None else f"per-step meets at {lo:.1f}"
    high = "no upper bound" if hi is None else f"amortised fails at {hi:.1f}"
    what = {
        "above": f"a server serves more than {CLAIMED_BOUND}",
        "below": f"a server serves fewer than {CLAIMED_BOUND}",
        "at": f"both movements put the bound at {CLAIMED_BOUND}",
        "open": f"{CLAIMED_BOUND} is not placed",
    }[where]
    return f"{what} ({low}, {high})"


def _table(series: dict[tuple[str, str], list[dict[str, Any]]]) -> str:
    lines = [
        "| trace | series | rate | requests | concurrent mean / peak | seeds | hit rate | "
        "tok/s per user | ITL p50 / p95 / p99 (ms) | TTFT p50 / p95 / p99 (s) | "
        "link rd / wr, DRAM, NVMe use | meets 10 tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    word = {True: "yes", False: "no", None: "undecided"}
    for (wl, name), rs in series.items():
        for r in rs:
            ttft = [None if r[f"ttft_ms_{q}"] is None else r[f"ttft_ms_{q}"] / 1e3
                    for q in ("p50", "p95", "p99")]  # fmt: skip
            use = " / ".join(_fmt(r[f"{k}_utilisation"], ".2f") for k in RESOURCES)
            lines.append(
                f"| {wl} | {name} | {_rate(r['rate'])} | {_requests(r)} | "
                f"{r['concurrency_mean']:.1f} / {r['concurrency_peak']} | {r['seeds']} | "
                f"{_fmt(r['hit_rate'], '.3f', r['hit_ci95'])} | "
                f"{_fmt(r['tokens_per_s_per_user'], '.2f', r['tokens_per_s_per_user_ci95'])} | "
                f"{_fmt(r['itl_ms_p50'], '.1f')} / {_fmt(r['itl_ms_p95'], '.1f')} / "
                f"{_fmt(r['itl_ms_p99'], '.1f')} | "
                f"{_fmt(ttft[0], '.1f')} / {_fmt(ttft[1], '.1f')} / {_fmt(ttft[2], '.1f')} | "
                f"{use} | {word[r['meets']]} |"
            )
    return "\n".join(lines)


def _requests(r: dict[str, Any]) -> str:
    """The window's requests, and how many the shape's context cut (S1's 128 K tokens)."""
    return f"{r['requests']} ({r['truncated']} cut)" if r["truncated"] else str(r["requests"])


def _rate(rate: float) -> str:
    """A rate factor as the fraction it was written as (1/32, 3/8 …)."""
    for den in (1, 2, 4, 8, 16, 32, 64):
        num = rate * den
        if math.isclose(num, round(num)):
            return f"{round(num)}/{den}" if den > 1 else f"{round(num)}"
    return f"{rate:g}"


def _plot(series: dict[tuple[str, str], list[dict[str, Any]]], path: str) -> None:
    with figure(path, tight=True, figsize=(6.4, 3.6)) as (_, ax):
        for (wl, name), rs in series.items():
            x = np.array([r["concurrency_mean"] for r in rs], dtype=float)
            y = np.array([r["tokens_per_s_per_user"] for r in rs], dtype=float)
            e = np.array([r["tokens_per_s_per_user_ci95"] or 0.0 for r in rs], dtype=float)
            ls = "--" if name.endswith("/per-step") else "-"
            ax.errorbar(x, y, yerr=e, marker="o", ms=3, capsize=2, ls=ls, label=f"{wl}, {name}")
        ax.axhline(TARGET_TOKENS_PER_S, color="gray", ls="--", lw=1, label="target 10 tok/s")
        ax.axvline(CLAIMED_BOUND, color="red", ls=":", lw=1, label="claimed bound 16")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("concurrent requests (mean over the measured steps)")
        ax.set_ylabel("tokens/s per request\n(mean, 95 % CI over attention seeds)")
        ax.set_title("S1, scaled, on Mooncake's arrivals (rate-scaled)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        ax.text(0.99, 0.01, "Simulated + Analytical model", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="gray")  # fmt: skip


EXPERIMENT = UsersMooncake()
