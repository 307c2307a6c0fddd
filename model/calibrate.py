"""The design's calibration of the ema policy on real traces: α × β, then keep/evict.

The procedure is the one the design gives for its uncalibrated parameters
(docs/design.md, "Uncalibrated parameters"); docs/calibration.md has the results.

Stage 1 sweeps α × β jointly (the seed: "β chosen without reference to α
double-counts recency") and scores every point two ways:

* **hit rate at a fixed HBM budget** (Simulated): the captured trace replayed
  through the firmware session (:class:`~kvcxl.firmware.session.FirmwareSession`)
  with demand paging.  Each step writes its new block and reads the entries whose
  full-cache attention weight is at least ``read_threshold`` (a sparse, Quest-like
  read set; with dense reads every policy has the same hit rate).  Also the attention-mass hit rate:
  the share of the read weight served from HBM.
* **output quality** (Measured): the real model re-run with the cache bounded by
  the policy at the same budget (:mod:`.quality`): mean KL and top-1 agreement.

Stage 2 takes the best (α, β) and sweeps the threshold placement's keep/evict
pair on the EMA score trajectories: for each keep, the hot set (entries with
score ≥ keep, as a share of all entries) and the share of reads it serves; for
each evict, the share of reads that would come from NVMe (score < evict).  Then
every pair decides residency itself: each trace replayed under managed tiers
(:mod:`.managed`), reads counted by the tier that served them.

The best point is reported with a 95 % confidence interval over prompts
(Student's t on the per-prompt values).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.common.figures import figure
from kvcxl.common.jsonout import wrote
from kvcxl.common.progress import progress as progress_bar
from kvcxl.emu.metrics import mean_ci
from kvcxl.firmware.formulas import ema_update
from kvcxl.firmware.policies import POLICIES

from .calibrate_k7 import k7, print_k7, write_toml
from .capture import load_model
from .managed import managed_sweep
from .positions import position_steps, session_for
from .quality import PolicySpec, run


def ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % confidence interval (Student's t, the one t table
    of :func:`kvcxl.emu.metrics.t975`); NaN where there is no value or no spread to show."""
    s = mean_ci(values)
    nan = float("nan")
    return (nan if s["mean"] is None else s["mean"]), (nan if s["ci95"] is None else s["ci95"])


def dense_weights(trace: Any, max_tokens: int | None = None) -> NDArray:
    """(steps, layers, kv_heads, blocks) weights of a one-context, one-step-per-position capture."""
    if not trace.extra.get("step_is_position"):
        raise ValueError("the trace is not a per-position capture (`kvcxl trace capture`)")
    if np.unique(trace.context).size > 1:
        raise ValueError("the trace holds several contexts: calibration needs one per trace")
    first = int(trace.step[0]) if len(trace) else 0
    if first != 0:
        raise ValueError(
            f"the trace starts at step {first}: capture without --decode-only for calibration"
        )
    S = int(trace.step[-1]) + 1
    if max_tokens is not None:
        S = min(S, max_tokens)
    sel = trace.step < S
    bt = trace.shape.block_tokens
    NB = -(-S // bt)
    w = np.zeros((S, trace.shape.layers, trace.shape.kv_heads, NB), dtype=np.float32)
    w[trace.step[sel], trace.layer[sel], trace.head[sel], trace.block[sel]] = trace.weight[sel]
    return w


def replay_hit_rate(
    weights: NDArray,
    policy: str,
    config: Any,
    budget_tokens: int,
    block_tokens: int,
    read_threshold: float,
    *,
    audit: bool = True,
) -> dict[str, float]:
    """Hit rate and attention-mass hit rate of ``policy`` replaying dense capture weights.

    ``audit=False`` skips the eviction audit (its counts are then 0), for sweeps that
    replay many traces and whose victims other runs audit.
    """

    fw = session_for(
        weights, policy, config, budget_tokens, block_tokens, audit=audit, placement="fill"
    )
    hit_w = read_w = 0.0
    for s, ids, w in position_steps(fw, weights, block_tokens, read_threshold):
        hit, _ = fw.read(s, ids, w)
        hit_w += float(w[hit].sum())
        read_w += float(w.sum())
    st, au = fw.cache.stats, fw.audit
    reads = st.hits + st.misses
    if au is not None and au.faults:  # a wrong victim, or a priority its history contradicts
        raise RuntimeError(f"eviction audit failed for {policy}: {au.as_dict()}")
    return {
        "hit_rate": st.hits / reads if reads else 0.0,
        "mass_hit_rate": hit_w / read_w if read_w else 0.0,
        "reads": reads,
        "audited_victims": au.checked if au else 0,
        "wrong_victims": au.wrong if au else 0,
        "history_checked": au.as_dict()["history_checked"] if au else 0,  # None: not audited
        "audit_faults": au.faults if au else 0,
    }


def ema_scores(weights: NDArray, alpha: float) -> NDArray:
    """(steps, entries) EMA score of every entry before each step (float mode, docs/policy.md)."""

    S, L, H, NB = weights.shape
    flat = weights.transpose(0, 3, 1, 2).reshape(S, NB * L * H).astype(np.float64)
    out = np.zeros_like(flat)
    s = np.zeros(flat.shape[1])
    for t in range(S):
        out[t] = s
        s = np.asarray(ema_update(s, flat[t], alpha))
    return out


def threshold_sweep(
    weights: NDArray,
    alpha: float,
    keeps: Sequence[float],
    evicts: Sequence[float],
    read_threshold: float,
    block_tokens: int,
) -> dict[str, Any]:
    """Hot-set size and read shares of threshold placement on real score trajectories."""
    S, L, H, NB = weights.shape
    scores = ema_scores(weights, alpha)
    flat = weights.transpose(0, 3, 1, 2).reshape(S, NB * L * H)
    exists = np.arange(NB)[None, :] <= (np.arange(S) // block_tokens)[:, None]  # (S, NB)
    exists = np.repeat(exists, L * H, axis=1)
    reads = (flat >= read_threshold) & exists
    n_reads = max(int(reads.sum()), 1)
    n_exist = max(int(exists.sum()), 1)
    keep_rows = []
    for k in keeps:
        hot = (scores >= k) & exists
        keep_rows.append(
            {
                "keep": k,
                "hot_set_fraction": float(hot.sum() / n_exist),
                "read_hit_rate": float((hot & reads).sum() / n_reads),
                "mass_hit_rate": float(flat[hot & reads].sum() / max(flat[reads].sum(), 1e-12)),
            }
        )
    evict_rows = []
    for e in evicts:
        cold = (scores < e) & exists
        evict_rows.append(
            {
                "evict": e,
                "nvme_fraction": float(cold.sum() / n_exist),
                "nvme_read_fraction": float((cold & reads).sum() / n_reads),
            }
        )
    return {"keep": keep_rows, "evict": evict_rows}


def _floats(text: str, name: str) -> list[float]:
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{name} {text!r}: expected comma-separated numbers") from None
    if not vals:
        raise ValueError(f"--{name} is empty")
    return vals


def sweep(
    traces: Sequence[tuple[str, Any, list[int]]],
    alphas: Sequence[float],
    betas: Sequence[float],
    budget_tokens: int,
    *,
    base: Any,
    read_threshold: float = 0.01,
    quality: bool = True,
    model: Any = None,
    keeps: Sequence[float] = (0.02, 0.05, 0.1, 0.2),
    evicts: Sequence[float] = (0.005, 0.01, 0.02, 0.05),
    touches: Sequence[float] = (0.001, 0.005, 0.01, 0.02, 0.05),
    baselines: Sequence[str] = ("lru", "sink-window", "h2o"),
    progress: bool = False,
) -> dict[str, Any]:
    """The whole calibration; returns the JSON-ready report."""

    for a in alphas:
        base.with_(alpha=a)  # validates (ConfigError names the bad value)
    for b in betas:
        base.with_(beta=b)
    for t in touches:
        base.with_(touch_threshold=t)
    A, B, P = len(alphas), len(betas), len(traces)
    hit = np.zeros((A, B, P))
    mass = np.zeros((A, B, P))
    kl = np.full((A, B, P), np.nan)
    top1 = np.full((A, B, P), np.nan)
    dense = []
    for _, trace, tokens in traces:
        dense.append(dense_weights(trace, len(tokens)))
    bt = traces[0][1].shape.block_tokens
    refs = []
    total = A * B * P * (2 if quality else 1) + (P if quality else 0)
    bar, _ = progress_bar(total, "calibrate", "run", off=not progress)
    if quality:
        for _, _, tokens in traces:
            ref, _ = run(
                model, tokens, policy=None, budget_tokens=None, block_tokens=bt, config=base
            )
            refs.append(ref)
            bar.update(1)
    for i, a in enumerate(alphas):
        for j, b in enumerate(betas):
            cfg = base.with_(alpha=a, beta=b)
            for p, (_, _, tokens) in enumerate(traces):
                r = replay_hit_rate(dense[p], "ema", cfg, budget_tokens, bt, read_threshold)
                hit[i, j, p], mass[i, j, p] = r["hit_rate"], r["mass_hit_rate"]
                bar.update(1)
                if quality:
                    spec = PolicySpec(f"ema:alpha={a},beta={b}", "ema", {"alpha": a, "beta": b})
                    _, res = run(
                        model,
                        tokens,
                        policy=spec,
                        budget_tokens=budget_tokens,
                        block_tokens=bt,
                        config=base,
                        reference=refs[p],
                    )
                    assert res is not None
                    kl[i, j, p] = float(res.kl[res.bounded].mean()) if res.bounded.any() else 0.0
                    top1[i, j, p] = (
                        float(res.agree[res.bounded].mean()) if res.bounded.any() else 1.0
                    )
                    bar.update(1)
    bar.close()
    base_rows = []
    for name in baselines:
        spec = PolicySpec.parse(name)
        cfg = base.with_(**{**POLICIES[spec.name].budget_params(budget_tokens), **spec.overrides})
        vals = [
            replay_hit_rate(dense[p], spec.name, cfg, budget_tokens, bt, read_threshold)
            for p in range(P)
        ]
        base_rows.append(
            {
                "policy": name,
                "hit_rate": ci95([v["hit_rate"] for v in vals]),
                "mass_hit_rate": ci95([v["mass_hit_rate"] for v in vals]),
            }
        )
    mean_hit = hit.mean(-1)
    ib, jb = np.unravel_index(int(np.argmax(mean_hit)), mean_hit.shape)
    best_hit = _point(alphas, betas, ib, jb, hit, mass, kl, top1)
    report: dict[str, Any] = {
        "evidence": {"hit_rate": "Simulated", "quality": "Measured"},
        "traces": [name for name, _, _ in traces],
        "tokens": [len(t) for _, _, t in traces],
        "budget_tokens": budget_tokens,
        "block_tokens": bt,
        "read_threshold": read_threshold,
        "alphas": list(alphas),
        "betas": list(betas),
        "hit_rate": hit.tolist(),
        "mass_hit_rate": mass.tolist(),
        "best_by_hit_rate": best_hit,
        "baselines": base_rows,
    }
    seed_pt = _nearest(alphas, betas, 0.05, 0.001)
    if seed_pt is not None:
        report["seed_point"] = _point(alphas, betas, *seed_pt, hit, mass, kl, top1)
    default_pt = _nearest(alphas, betas, 0.2, 0.001)
    if default_pt is not None:
        report["default_point"] = _point(alphas, betas, *default_pt, hit, mass, kl, top1)
    best_a = alphas[ib]
    if quality:
        mean_kl = kl.mean(-1)
        iq, jq = np.unravel_index(int(np.nanargmin(mean_kl)), mean_kl.shape)
        report["kl"] = kl.tolist()
        report["top1"] = top1.tolist()
        report["best_by_quality"] = _point(alphas, betas, iq, jq, hit, mass, kl, top1)
        best_a = alphas[iq]
    report["thresholds"] = {
        "alpha": best_a,
        "per_trace": [threshold_sweep(d, best_a, keeps, evicts, read_threshold, bt) for d in dense],
    }
    cfg = base.with_(alpha=alphas[ib], beta=betas[jb])
    report["touch_threshold"] = touch_sweep(dense, cfg, touches, budget_tokens, bt, read_threshold)
    # The same pairs deciding residency: replayed under managed tiers at the α stage 2 used.
    report["managed"] = managed_sweep(
        dense, cfg.with_(alpha=best_a), keeps, evicts, budget_tokens, bt, read_threshold,
        traces[0][1].shape.entry_bytes,
    )  # fmt: skip
    return report


def touch_sweep(
    dense: Sequence[NDArray],
    config: Any,
    touches: Sequence[float],
    budget_tokens: int,
    block_tokens: int,
    read_threshold: float,
) -> dict[str, Any]:
    """The ema's hit rate (Simulated) by touch threshold at ``config``'s α and β, with its 95 %
    CI over traces: a read with weight below the threshold does not reset the idle count."""
    rows = []
    for t in touches:
        cfg = config.with_(touch_threshold=t)
        vals = [
            replay_hit_rate(d, "ema", cfg, budget_tokens, block_tokens, read_threshold)
            for d in dense
        ]
        rows.append(
            {
                "touch_threshold": t,
                "hit_rate": ci95([v["hit_rate"] for v in vals]),
                "per_trace": [round(v["hit_rate"], 5) for v in vals],
            }
        )
    best = max(rows, key=lambda r: r["hit_rate"][0])
    return {
        "evidence": "Simulated",
        "alpha": config.alpha,
        "beta": config.beta,
        "rows": rows,
        "best": best["touch_threshold"],
    }


def _nearest(alphas: Sequence[float], betas: Sequence[float], a: float, b: float) -> Any:
    if a in alphas and b in betas:
        return alphas.index(a), betas.index(b)
    return None


def _point(alphas, betas, i, j, hit, mass, kl, top1) -> dict[str, Any]:
    out = {
        "alpha": alphas[i],
        "beta": betas[j],
        "hit_rate": ci95(hit[i, j]),
        "mass_hit_rate": ci95(mass[i, j]),
    }
    if not np.isnan(kl[i, j]).all():
        out["kl"] = ci95(kl[i, j])
        out["top1"] = ci95(top1[i, j])
    return out


def heatmap(report: dict[str, Any], key: str, path: Path, label: str, fmt: str) -> None:
    size = (1.3 * len(report["betas"]) + 2.5, 0.7 * len(report["alphas"]) + 2)
    with figure(path, dpi=120, tight=True, figsize=size) as (fig, ax):
        _draw_heatmap(report, key, label, fmt, fig, ax)


def _draw_heatmap(
    report: dict[str, Any], key: str, label: str, fmt: str, fig: Any, ax: Any
) -> None:
    z = np.asarray(report[key]).mean(-1)
    spread = float(np.nanmax(z) - np.nanmin(z))
    # A flat surface keeps a colour scale of at least ±0.005 so noise does not look like signal.
    mid = float(np.nanmean(z))
    lo, hi = (mid - 0.005, mid + 0.005) if spread < 0.01 else (None, None)
    im = ax.imshow(z, cmap="viridis", aspect="auto", origin="lower", vmin=lo, vmax=hi)
    ax.set_xticks(range(len(report["betas"])), [f"{b:g}" for b in report["betas"]])
    ax.set_yticks(range(len(report["alphas"])), [f"{a:g}" for a in report["alphas"]])
    ax.set(xlabel="β (recency decay)", ylabel="α (EMA)")
    for i in range(z.shape[0]):
        for j in range(z.shape[1]):
            ax.text(j, i, format(z[i, j], fmt), ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=ax, label=label)
    ax.set_title(
        f"{label}, budget {report['budget_tokens']} tok/head, mean of "
        f"{len(report['traces'])} prompts; spread {spread:.2g}",
        fontsize=9,
    )


def main(
    args: argparse.Namespace,
    load_measured: Callable[[str, int | None], tuple[Any, list[int]]],
    base_config: Callable[[str | None, str], Any],
) -> int:
    """Handler of ``kvcxl calibrate``."""
    alphas = _floats(args.alpha, "alpha")
    betas = _floats(args.beta, "beta")
    keeps = _floats(args.keep, "keep")
    evicts = _floats(args.evict, "evict")
    touches = _floats(args.touch, "touch")
    if args.budget.relative:  # one budget for every trace, whatever its length
        raise ValueError(f"--budget {args.budget}: tokens per KV head are accepted (e.g. 128)")
    budget = int(args.budget.resolve())
    for flag, v in (("--slo", args.slo), ("--breakeven", args.breakeven)):
        if not 0 < v <= 1:
            raise ValueError(f"{flag} {v}: must be in (0, 1]")
    if not 0 <= args.read_threshold <= 1:
        raise ValueError(f"--read-threshold {args.read_threshold}: must be in [0, 1]")
    traces = []
    for path in args.trace:
        trace, tokens = load_measured(path, args.max_tokens)
        traces.append((Path(path).name, trace, tokens))
    bts = {t.shape.block_tokens for _, t, _ in traces}
    aggs = {t.aggregation for _, t, _ in traces}
    if len(bts) > 1 or len(aggs) > 1:
        raise ValueError("all traces must share one block size and one aggregation")
    bt = bts.pop()
    if budget < bt:
        raise ValueError(f"--budget {budget}: less than one {bt}-token block")
    base = base_config(args.config, aggs.pop())
    model = None
    if not args.no_quality:
        model, _ = load_model(args.threads)
    report = sweep(
        traces,
        alphas,
        betas,
        budget,
        base=base,
        read_threshold=args.read_threshold,
        quality=not args.no_quality,
        model=model,
        keeps=keeps,
        evicts=evicts,
        touches=touches,
        progress=True,
    )
    report["k7"] = _k7(args, traces, base, report, budget)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_toml(report["k7"], out / "calibrated.toml")
    (out / "calibration.json").write_text(json.dumps(report, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    heatmap(report, "hit_rate", out / "hit_rate.png", "hit rate (Simulated)", ".3f")
    heatmap(report, "mass_hit_rate", out / "mass_hit_rate.png", "attention-mass hit rate", ".3f")
    if "kl" in report:
        heatmap(report, "kl", out / "kl.png", "KL full‖bounded (Measured)", ".3f")
        heatmap(report, "top1", out / "top1.png", "top-1 agreement (Measured)", ".3f")
    _print(report)
    print_k7(report["k7"])
    wrote(f"{out}/calibration.json, {out}/calibrated.toml and heat maps")
    return 0


def _k7(
    args: argparse.Namespace, traces: Sequence[tuple[str, Any, list[int]]], base: Any,
    report: dict[str, Any], budget: int,
) -> dict[str, Any]:  # fmt: skip
    """Every trace-fittable §K.7 parameter by its own method (:mod:`.calibrate_k7`)."""
    dense = [dense_weights(trace, len(tokens)) for _, trace, tokens in traces]
    bt = traces[0][1].shape.block_tokens
    layers = traces[0][1].shape.layers

    def base_hits(a: float, b: float) -> list[float]:
        cfg = base.with_(alpha=a, beta=b)
        return [
            replay_hit_rate(d, "ema", cfg, budget, bt, args.read_threshold)["hit_rate"]
            for d in dense
        ]

    bar, update = progress_bar(12 + min(16, layers - 1), "calibrate §K.7", "stage")
    try:
        return k7(
            dense, [name for name, _, _ in traces], base, report,
            budget_tokens=budget, block_tokens=bt, read_threshold=args.read_threshold,
            entry_bytes=traces[0][1].shape.entry_bytes, slo=args.slo,
            prefetch_limit=args.prefetch_limit,
            breakeven=args.breakeven, sink_ratio=args.sink_ratio, base_hits=base_hits,
            tick=lambda: update(1),
        )  # fmt: skip
    finally:
        bar.close()


def _fmt(ci: Sequence[float]) -> str:
    m, h = ci
    return f"{m:.4f} ± {h:.4f}" if not math.isnan(h) else f"{m:.4f}"


def _print(r: dict[str, Any]) -> None:
    print(
        f"ema α × β on {len(r['traces'])} traces, budget {r['budget_tokens']} tokens/head, "
        f"reads: weight ≥ {r['read_threshold']}  (hit rate Simulated, quality Measured)"
    )
    for key in ("best_by_hit_rate", "best_by_quality", "seed_point", "default_point"):
        if key in r:
            p = r[key]
            line = f"  {key:<17} α={p['alpha']:<6g} β={p['beta']:<7g} hit {_fmt(p['hit_rate'])}"
            line += f"  mass {_fmt(p['mass_hit_rate'])}"
            if "kl" in p:
                line += f"  KL {_fmt(p['kl'])}  top-1 {_fmt(p['top1'])}"
            print(line)
    for b in r["baselines"]:
        print(f"  {b['policy']:<17} hit {_fmt(b['hit_rate'])}  mass {_fmt(b['mass_hit_rate'])}")
    m = r.get("managed")
    if m:
        print(
            f"  keep/evict under managed tiers at α={m['alpha']:g} (Simulated; latency "
            "Analytical model), mean over traces:"
        )
        for row in m["rows"]:
            pt = row["per_trace"]
            mean = {k: float(np.mean([p[k] for p in pt])) for k in pt[0]}
            mark = (
                "  ← lowest latency"
                if (row["keep"], row["evict"])
                == (m["best_by_latency"]["keep"], m["best_by_latency"]["evict"])
                else ""
            )
            print(f"    keep {row['keep']:<6g} evict {row['evict']:<6g} hit {mean['hit_rate']:.4f}"
                  f"  CXL {mean['cxl_read_fraction']:.4f}  NVMe {mean['nvme_read_fraction']:.4f}"
                  f"  held {mean['held_fraction']:.3f}  {mean['effective_latency_ns']:,.0f} ns"
                  f"{mark}")  # fmt: skip
    t = r.get("touch_threshold")
    if t:
        print(f"  touch threshold at α={t['alpha']:g} β={t['beta']:g} (hit rate, Simulated):")
        for row in t["rows"]:
            mark = "  ← best" if row["touch_threshold"] == t["best"] else ""
            print(f"    {row['touch_threshold']:<8g} {_fmt(row['hit_rate'])}{mark}")
