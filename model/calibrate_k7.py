"""Every trace-fittable parameter of the design's §K.7 table, each by its own method, into
one configuration file that ``--config`` replays.

``kvcxl calibrate`` runs this after its α × β sweep (:mod:`.calibrate`).  One module per
method: α × β here (the sweep's hit rates, :func:`choose_alpha_beta`), keep by the SLO
(:mod:`.calibrate_keep`) with evict by the managed replay's latency (:mod:`.managed`),
the (R, E, N) weights and the P cuts by a fit of reuse (:mod:`.calibrate_weights`), the
four prefetch parameters by precision and recall (:mod:`.calibrate_prefetch`), and the
anchor zone by where the sink stops (:mod:`.calibrate_anchor`).  The three rows no
trace can fit (eviction_batch, the PCIe contention factor, the demo thresholds) are
named with the reason.  docs/calibration.md has the results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import rope_factor

from .calibrate_anchor import anchor_size, sink_profile
from .calibrate_keep import hot_set_curve, slo_keep
from .calibrate_prefetch import calibrate_prefetch, fit_hyperbola
from .calibrate_weights import calibrate_weights, fit_cuts
from .managed import managed_sweep
from .trajectory import trajectory

NOT_FITTED = {
    "eviction_batch": "depends on the controller's cycle cost per pass, a Design target for "
    "unbuilt silicon (the design: a placeholder until a controller model exists)",
    "pcie_contention": "a host measurement (achieved offload bandwidth on a loaded host), "
    "not a property of attention traces",
    "demo thresholds": "a presentation constant of one animation (the design: not calibratable)",
}


def paired_ci(diffs: Sequence[float]) -> tuple[float, float]:
    """Mean and 95 % half-width (Student's t) of paired differences; NaN half-width for n < 2."""
    from .calibrate import ci95

    return ci95(list(diffs))


def choose_alpha_beta(
    alphas: Sequence[float],
    betas: Sequence[float],
    hit: NDArray,
    base_hits: Sequence[float],
    base: tuple[float, float],
) -> dict[str, Any]:
    """The grid's best (α, β) by mean hit rate over traces, taken only when it beats the
    base point by more than the 95 % interval of the paired per-trace differences (with
    one trace, by any margin); otherwise α and β are not identifiable and the base stays."""
    hit = np.asarray(hit, dtype=np.float64)
    mean = hit.mean(-1)
    i, j = np.unravel_index(int(np.argmax(mean)), mean.shape)
    diffs = hit[i, j] - np.asarray(base_hits, dtype=np.float64)
    m, half = paired_ci(diffs.tolist())
    if hit.shape[-1] < 2:
        better = m > 0
    else:
        better = bool(m - half > 0)
    chosen = (alphas[i], betas[j]) if better else base
    return {
        "best": {"alpha": alphas[i], "beta": betas[j], "hit_rate": float(mean[i, j])},
        "base": {"alpha": base[0], "beta": base[1], "hit_rate": float(np.mean(base_hits))},
        "gain_over_base": [m, half],
        "spread": float(mean.max() - mean.min()),
        "identifiable": bool(better),
        "alpha": chosen[0],
        "beta": chosen[1],
    }


def k7(
    dense: Sequence[NDArray],
    names: Sequence[str],
    base: PolicyConfig,
    sweep_report: dict[str, Any],
    *,
    budget_tokens: int,
    block_tokens: int,
    read_threshold: float,
    entry_bytes: int,
    slo: float = 0.97,
    prefetch_limit: int = 64,
    breakeven: float = 0.5,
    sink_ratio: float = 2.0,
    base_hits: Callable[[float, float], list[float]] | None = None,
    tick: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """The JSON-ready report of every method and the fitted values (``"config"``)."""
    tick = tick or (lambda: None)
    alphas, betas = sweep_report["alphas"], sweep_report["betas"]
    hit = np.asarray(sweep_report["hit_rate"])
    if base.alpha in alphas and base.beta in betas:
        bh = hit[alphas.index(base.alpha), betas.index(base.beta)].tolist()
    elif base_hits is not None:
        bh = base_hits(base.alpha, base.beta)
    else:
        raise ValueError("the base (α, β) is not on the grid and no replay was given for it")
    ab = choose_alpha_beta(alphas, betas, hit, bh, (base.alpha, base.beta))
    cfg = base.with_(alpha=ab["alpha"], beta=ab["beta"])
    trajs = [
        trajectory(d, cfg.alpha, cfg.touch_threshold, read_threshold, block_tokens) for d in dense
    ]
    tick()
    report: dict[str, Any] = {
        "traces": list(names),
        "slo": slo,
        "alpha_beta": {**ab, "evidence": "Simulated (hit rate of the firmware replay)"},
    }

    # Anchor zone: where the sink stops, the widest over traces (every trace's sink pinned).
    profiles = [sink_profile(d, block_tokens) for d in dense]
    sizes = [anchor_size(p, block_tokens, sink_ratio) for p in profiles]
    found = [s["anchor_zone_size"] for s in sizes if s["anchor_zone_size"] is not None]
    anchor = max(found) if found else base.anchor_zone_size
    report["anchor"] = {
        "evidence": "Measured",
        "ratio": sink_ratio,
        "per_trace": [{**p, **s} for p, s in zip(profiles, sizes, strict=True)],
        "anchor_zone_size": anchor,
        "fitted": bool(found),
        "seed": base.anchor_zone_size,
    }
    cfg = cfg.with_(anchor_zone_size=anchor)

    # keep by the SLO (the strictest over traces), then evict by the managed replay.
    per_keep = [slo_keep(t.scores, t.reads, t.present, slo) for t in trajs]
    per_mass = [slo_keep(t.scores, t.reads, t.present, slo, weights=t.weights) for t in trajs]
    keeps = [k["keep"] for k in per_keep]
    keep = min(keeps) if all(k is not None for k in keeps) else None
    seed_rows = [hot_set_curve(t.scores, t.reads, t.present, [base.keep_threshold]) for t in trajs]
    report["keep"] = {
        "evidence": "Measured attention, Analytical model of threshold placement",
        "alpha": cfg.alpha,
        "per_trace": per_keep,
        "per_trace_by_mass": per_mass,
        "keep_threshold": keep,
        "seed": {"keep": base.keep_threshold, "per_trace": [r[0] for r in seed_rows]},
    }
    tick()
    if keep is not None:
        # The same rule one tier down: the smallest CXL DRAM set (keep > score ≥ evict)
        # serving ``slo`` of the reads HBM's hot set misses; the rest sink to NVMe.
        tails = [slo_keep(t.scores, t.reads, t.present & (t.scores < keep), slo) for t in trajs]
        evs = [e["keep"] for e in tails]
        evict = min(evs) if all(e is not None for e in evs) else 0.0
        m = managed_sweep(
            dense, cfg, sorted({keep, base.keep_threshold}),
            sorted({evict, base.evict_threshold}), budget_tokens, block_tokens,
            read_threshold, entry_bytes,
        )  # fmt: skip
        report["evict"] = {
            "evidence": "Measured attention, Analytical model of threshold placement; the "
            "replay rows Simulated (tier counts) and Analytical model (latency)",
            "per_trace": tails,
            "evict_threshold": evict,
            "seed": base.evict_threshold,
            "managed": m,
        }
        cfg = cfg.with_(keep_threshold=keep, evict_threshold=evict)
    tick()

    # (R, E, N) weights and the P cuts.
    capacity = (budget_tokens // block_tokens) * trajs[0].layers * trajs[0].heads
    wr = calibrate_weights(
        trajs, cfg.beta, cfg.anchor_zone_size, slo, cfg.pinned_fraction,
        tuple(base.placement_weights), capacity=capacity,
    )  # fmt: skip
    seed_cuts = [
        _cuts_at(t, tuple(base.placement_weights), tuple(base.placement_cuts), cfg) for t in trajs
    ]
    wr["seed"]["cuts"] = {"cuts": list(base.placement_cuts), "per_trace": seed_cuts}
    report["weights"] = wr
    if wr["fit"]["weights"] is not None and wr.get("cuts") is not None:
        cfg = cfg.with_(placement_weights=_simplex(wr["fit"]["weights"]), placement_cuts=wr["cuts"])
    tick()

    # Prefetch: scale, window, depth, blend.
    pr = calibrate_prefetch(trajs, cfg, limit=prefetch_limit, breakeven=breakeven, tick=tick)
    curve = pr["curve"]
    share = np.array([np.nan if x is None else x for x in curve["read_share"]])
    pairs = np.asarray(curve["pairs"])
    ok = pairs > 0
    seed_r2 = _r2_at_scale(np.asarray(curve["distance_tokens"])[ok], share[ok], pairs[ok],
                           base.prefetch_distance_scale)  # fmt: skip
    wb = base.prefetch_window // block_tokens
    pr["seed"] = {
        "prefetch_window": base.prefetch_window,
        "ring_read_share_at_window": None if wb >= share.size else _nan_none(share[wb]),
        "prefetch_distance_scale": base.prefetch_distance_scale,
        "hyperbola_r2_at_scale": seed_r2,
        "prefetch_depth": base.prefetch_depth,
        "prefetch_blend": list(base.prefetch_blend),
    }
    report["prefetch"] = pr
    cfg = cfg.with_(**{k: v for k, v in pr["fitted"].items()})
    report["not_fitted"] = NOT_FITTED
    report["config"] = cfg.to_dict()
    return report


def _simplex(w: Sequence[float]) -> list[float]:
    """Weights rounded to 6 decimals that still sum to exactly 1 (PolicyConfig checks 1e-9)."""
    r = [round(float(x), 6) for x in w[:-1]]
    return [*r, round(1.0 - sum(r), 6)]


def _nan_none(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def _r2_at_scale(d: NDArray, y: NDArray, w: NDArray, scale: float) -> float:
    """R² of the hyperbola at a given scale (amplitude in closed form), for the seed's 100."""
    f = np.asarray(rope_factor(d, scale))
    c = float((w * f * y).sum() / (w * f * f).sum())
    sse = float((w * (y - c * f) ** 2).sum())
    mean = float((w * y).sum() / w.sum())
    sst = float((w * (y - mean) ** 2).sum())
    return 1 - sse / sst if sst > 0 else float("nan")


def _cuts_at(t: Any, weights: tuple, cuts: tuple, cfg: PolicyConfig) -> dict[str, float]:
    """Hot set and reads served by the seed's weights and cuts (P ≥ low wants HBM)."""
    from .calibrate_weights import _p_grid

    p = _p_grid(t, weights, cfg.beta, cfg.anchor_zone_size)
    hot = t.present & (p >= cuts[0])
    read = t.present & t.reads
    return {
        "hot_set_fraction": float(hot.sum() / max(int(t.present.sum()), 1)),
        "read_hit_rate": float((hot & read).sum() / max(int(read.sum()), 1)),
    }


def write_toml(report: dict[str, Any], path: str | Path) -> PolicyConfig:
    """The fitted configuration as TOML (``PolicyConfig.save`` plus a header), read back
    through ``PolicyConfig.load`` so that a file ``--config`` would refuse is never left."""
    cfg = PolicyConfig.from_mapping(report["config"])
    path = Path(path)
    cfg.save(path)
    header = (
        "# kvcxl calibrate: the design's section K.7 parameters fitted on "
        + ", ".join(report["traces"])
        + "\n# (each by its method; the evidence is in calibration.json, docs/calibration.md)\n"
    )
    path.write_text(header + path.read_text())
    back = PolicyConfig.load(path)
    if back != cfg:
        raise RuntimeError(f"{path}: the written configuration does not read back equal")
    return cfg


def print_k7(r: dict[str, Any]) -> None:
    """The human-readable summary: per parameter the fit's evidence and the seed beside it."""
    ab = r["alpha_beta"]
    g, h = ab["gain_over_base"]
    print(f"\n§K.7 parameters on {len(r['traces'])} traces, SLO {r['slo']:.0%} of reads")
    print(
        f"  α × β (Simulated hit rate): best α={ab['best']['alpha']:g} β={ab['best']['beta']:g} "
        f"{ab['best']['hit_rate']:.4f}, base α={ab['base']['alpha']:g} β={ab['base']['beta']:g} "
        f"{ab['base']['hit_rate']:.4f}; gain {g:+.5f} ± {h:.5f} (95 % paired), grid spread "
        f"{ab['spread']:.2g} → {'fitted' if ab['identifiable'] else 'not identifiable, base kept'}"
    )
    a = r["anchor"]
    print(
        f"  anchor_zone_size (Measured, sink ≥ {a['ratio']:g}× background): {a['anchor_zone_size']}"
        f" tokens (seed {a['seed']})"
    )
    for name, p in zip(r["traces"], a["per_trace"], strict=True):
        lead = ", ".join("-" if m is None else f"{m:.3f}" for m in p["block_mean"][:6])
        print(
            f"    {name:<14} leading blocks {lead}  background {_g(p['background'])}"
            f"  → {p['anchor_zone_size']}"
        )
    k = r["keep"]
    print(
        f"  keep_threshold (smallest hot set serving {r['slo']:.0%} of reads, α={k['alpha']:g}): "
        f"{_g(k['keep_threshold'])}"
    )
    for name, p, m, s in zip(
        r["traces"], k["per_trace"], k["per_trace_by_mass"], k["seed"]["per_trace"], strict=True
    ):
        print(
            f"    {name:<14} keep {_g(p['keep'])} hot set "
            f"{p.get('hot_set_fraction', float('nan')):.3f}"
            f" | by mass keep {_g(m['keep'])} | seed keep {s['keep']:g}: hot set "
            f"{s['hot_set_fraction']:.3f} reads {s['read_hit_rate']:.3f}"
        )
    e = r.get("evict")
    if e:
        print(
            f"  evict_threshold (the same rule one tier down: the smallest CXL DRAM set serving "
            f"{r['slo']:.0%} of the reads HBM misses): {_g(e['evict_threshold'])}"
            f" (seed {e['seed']:g})"
        )
        print(
            "    under managed tiers (Simulated hit rate / NVMe reads; latency Analytical model):"
        )
        for row in e["managed"]["rows"]:
            pt = row["per_trace"]
            print(
                f"    keep {row['keep']:<9.4g} evict {row['evict']:<9.4g} hit "
                f"{_join(pt, 'hit_rate', '.3f')}  NVMe {_join(pt, 'nvme_read_fraction', '.3f')}"
                f"  latency ns {_join(pt, 'effective_latency_ns', ',.0f')}"
            )
    w = r["weights"]
    f = w["fit"]
    print("  placement weights: reuse ≈ c0 + cR·R + cE·E + cN·N (non-negative least squares)")
    print(
        f"    c0 {f['intercept']:+.4f}  cR {f['coefficients'][0]:.4f}  "
        f"cE {f['coefficients'][1]:.4f}"
        f"  cN {f['coefficients'][2]:.4f}  R² {f['r2']:.4f}  n {f['samples']:,}"
    )
    if f["weights"] is not None:
        ws = "/".join(f"{x:.3f}" for x in f["weights"])
        print(
            f"    weights (R, E, N) {ws}  AUC {f['auc']:.4f}; seed "
            f"{'/'.join(f'{x:g}' for x in w['seed']['weights'])} AUC {w['seed']['auc']:.4f}; "
            f"simplex sweep best {'/'.join(f'{x:g}' for x in w['sweep']['best']['weights'])} "
            f"AUC {w['sweep']['best']['auc']:.4f}"
        )
        for name, p in zip(r["traces"], w["per_trace_fit"], strict=True):
            pw = "-" if p["weights"] is None else "/".join(f"{x:.3f}" for x in p["weights"])
            print(f"    {name:<14} weights {pw}  R² {p['r2']:.4f}  AUC {p['auc']:.4f}")
    if w.get("cuts"):
        print(
            f"    cuts (low by the SLO, high at pinned_fraction of the HBM set): "
            f"{w['cuts'][0]:.4f} / {w['cuts'][1]:.4f}; seed {w['seed']['cuts']['cuts']}"
        )
    bh = w.get("budget_hit_rate")
    if bh:
        print(
            f"    hit rate, top {bh['capacity_entries']} entries by P (Analytical model): "
            + "; ".join(
                f"{k} {' / '.join(f'{x:.3f}' for x in bh[k])}" for k in ("fit", "sweep", "seed")
            )
        )
    p = r["prefetch"]
    hy = p["hyperbola"]
    print(f"  prefetch (limit {p['limit']} per batch, break-even read share {p['breakeven']:g}):")
    print(
        "    read share by distance: "
        + " ".join("-" if x is None else f"{x:.2f}" for x in p["curve"]["read_share"][:17])
    )
    print(
        f"    hyperbola c/(1 + d/scale): scale {hy['scale']:.4g} tokens, c {hy['amplitude']:.3f},"
        f" R² {hy['r2']:.3f}; seed scale {p['seed']['prefetch_distance_scale']:g}: R² "
        f"{p['seed']['hyperbola_r2_at_scale']:.3f}"
    )
    fit = p["fitted"]
    print(
        f"    window {fit['prefetch_window']} tokens (seed {p['seed']['prefetch_window']}); depth "
        f"{fit['prefetch_depth']} (seed {p['seed']['prefetch_depth']}): read share by layer offset "
        + " ".join(f"{d['read_share']:.2f}" for d in p["depth_rows"])
    )
    print("    blend (rope, score)   precision  recall")
    for row in p["blend_rows"]:
        mark = "  ← fitted" if row["blend"] == fit["prefetch_blend"] else ""
        print(
            f"    {row['blend'][0]:.1f} / {row['blend'][1]:.1f}            {row['precision']:.4f}"
            f"    {row['recall']:.4f}{mark}"
        )
    s, fe = p["seed_eval"], p["fitted_eval"]
    print(
        f"    seed parameters: precision {s['precision']:.4f} recall {s['recall']:.4f}"
        + (
            ""
            if fe is None
            else f"; fitted: precision {fe['precision']:.4f} recall {fe['recall']:.4f}"
        )
    )
    for name, why in r["not_fitted"].items():
        print(f"  {name}: not fitted — {why}")


def _join(rows: list[dict[str, Any]], key: str, fmt: str) -> str:
    return " / ".join(format(r[key], fmt) for r in rows)


def _g(x: float | None) -> str:
    return "none" if x is None else f"{x:.4g}"


__all__ = [
    "NOT_FITTED",
    "choose_alpha_beta",
    "fit_cuts",
    "fit_hyperbola",
    "k7",
    "print_k7",
    "write_toml",
]
