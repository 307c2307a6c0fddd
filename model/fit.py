"""Fit the synthetic attention generator (kvcxl.emu.workloads.attention) to real traces.

Statistics are taken from per-position captures (dense block weights, combined
over the GQA group as the trace says), on steps whose context has at least
``min_blocks`` blocks, so that the sink block, the recent blocks and the far blocks
are distinct.  The generator's shares are fractions of *each query head's* softmax
mass, so the mass statistics come from ``mean``-aggregated captures (the group
mean of per-head fractions); a retrieval head shows in one query head, so the
retrieval statistics come from ``max``-aggregated captures when given:

* **sink per layer** — the mean weight of block 0 above the background (the mean
  far block at the same step) at each layer: ``sink_profile``
  (and, for the line form, the least-squares line ``sink_mass_first … last``).
* **recent window per layer** — at each layer, the mean weight by block distance
  from the query's block (block 0 excluded), minus the layer's background (median
  weight 4 or more blocks back), summed over the 4 newest blocks:
  ``recent_profile`` (capped at 1 − sink; pooled over layers: ``recent_mass``).
  ``recent_tokens`` is the e-folding distance of the pooled excess.
* **retrieval heads** — a (layer, head) whose largest far block (≥ 4 blocks back,
  not block 0) holds on average ≥ ``retrieval_cut`` of its mass; their share of all
  heads is ``retrieval_fraction``; ``retrieval_mass`` is their mean far-peak mass
  times the generator's ``needles`` (it splits the mass over them).
* **background spread** — on far blocks (≥ 4 blocks back at that step), each
  weight taken relative to that step's mean far block (the per-block share falls
  as the context grows): ``relevance_sigma`` is the σ of the log time-averaged
  relative weight within a head; ``jitter_sigma`` the σ over steps of the log
  relative weight around each block's own mean (both σ from the median absolute
  deviation).

``group_sigma`` (spread between the query heads of one group) cannot be seen after
aggregation and keeps its default; ``needles`` likewise.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.common.figures import figure
from kvcxl.common.jsonout import wrote
from kvcxl.common.progress import progress as progress_bar
from kvcxl.emu.shape import ModelShape
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads.attention import (
    FIT_FILE,
    AttentionModel,
    AttentionParams,
    ContextAttention,
    format_fit,
)

# The committed fit (MEASURED: the statistics the generator must reproduce; FITTED: its
# parameters) is data, emu/workloads/attention_fit.toml, read by kvcxl.emu.workloads.attention
# for the presets; re-exported here beside the code that produces it (`kvcxl trace fit
# --write` writes one).
from kvcxl.emu.workloads.attention import FITTED as FITTED
from kvcxl.emu.workloads.attention import MEASURED as MEASURED
from kvcxl.emu.workloads.attention import fitted_params as fitted_params


def trace_stats(w: NDArray, block_tokens: int, min_blocks: int = 8) -> dict[str, Any]:
    """Statistics of one capture's dense weights (steps, layers, kv_heads, blocks)."""
    S, L, H, _ = w.shape
    steps = np.arange(S)
    qblock = steps // block_tokens
    use = steps[qblock + 1 >= min_blocks]
    if use.size == 0:
        raise ValueError(f"no step has {min_blocks} blocks of context: capture a longer sequence")
    # Sink: block 0's weight above the background share any block gets (the mean far block,
    # >= 4 blocks back, at the same step).
    sink_steps = np.zeros((use.size, L))
    for i, s in enumerate(use):
        qb = int(qblock[s])
        bg_now = w[s, :, :, 1 : max(qb - 3, 2)].mean(-1)
        sink_steps[i] = np.clip(w[s, :, :, 0] - bg_now, 0.0, None).mean(-1)
    sink = sink_steps.mean(axis=0)  # (L,)
    # Mean weight by layer and block distance from the query's block (0 = own block).
    maxd = int(qblock[use].max())
    prof = np.zeros((L, maxd + 1))
    cnt = np.zeros(maxd + 1)
    far_peak = np.zeros((L, H))
    n_far = 0
    logs_rel, logs_jit = [], []
    for s in use:
        qb = int(qblock[s])
        d = qb - np.arange(1, qb + 1)  # blocks 1 … qb
        prof[:, d] += w[s, :, :, 1 : qb + 1].mean(axis=1)
        cnt[d] += 1
        far = w[s, :, :, 1 : max(qb - 3, 1)]
        if far.shape[-1]:
            far_peak += far.max(-1)
            n_far += 1
    prof = prof / np.maximum(cnt, 1)
    far_peak /= max(n_far, 1)
    # Background spread: far blocks of the last step, within each head.
    s_last = int(use[-1])
    qb = int(qblock[s_last])
    if qb > 5:
        far_all = w[use][:, :, :, 1 : qb - 3]
        # Only (step, block) pairs where the block is far (>= 4 blocks back) at that step:
        # a block that was recent earlier would add the recency trend to the jitter.
        far_at = np.arange(1, qb - 3)[None, :] <= (qblock[use] - 4)[:, None]
        valid = (far_all > 0) & far_at[:, None, None, :]
        mean_b = np.where(valid, far_all, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            # Relative to the step's mean far block: the background's share per block falls
            # as 1/n while the context grows, which is not jitter.
            mean_b = mean_b / np.nanmean(mean_b, axis=-1, keepdims=True)
            tm = np.nanmean(mean_b, axis=0)  # (L, H, blocks)
            lr = np.log(tm)
            logs_rel = (lr - np.nanmean(lr, axis=-1, keepdims=True))[np.isfinite(lr)]
            lj = np.log(mean_b / tm[None])
            logs_jit = lj[np.isfinite(lj)]
    return {
        "sink_by_layer": sink,
        "distance_profile_by_layer": prof,
        "distance_profile": prof.mean(axis=0),
        "far_peak": far_peak,
        "log_relevance": np.asarray(logs_rel),
        "log_jitter": np.asarray(logs_jit),
        "steps_used": int(use.size),
    }


NEEDLES = AttentionParams().needles  # the generator's default, which the fit keeps
RECENT_BLOCKS = 4  # the newest blocks whose excess over background is the recent window


def _excess(prof: NDArray, n: int) -> tuple[NDArray, NDArray]:
    """Background (median weight ≥ RECENT_BLOCKS back) and excess over it, on the last axis."""
    k = RECENT_BLOCKS
    bg = np.median(prof[..., min(k, n - 1) :], axis=-1) if n > k else prof.min(axis=-1)
    return bg, np.clip(prof[..., :n] - bg[..., None], 0.0, None)


def _floor4(values: Sequence[float]) -> list[float]:
    """Rounded down to 4 decimals, so that rounded profiles still satisfy sink + recent <= 1."""
    return [float(np.floor(float(v) * 1e4) / 1e4) for v in values]


def _robust_sigma(x: NDArray) -> float:
    """σ from the median absolute deviation (consistent for normal logs, blind to a few
    near-zero weights, e.g. a head whose whole mass is on sink, window and needles)."""
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def fit(
    weights: Sequence[NDArray],
    block_tokens: int,
    retrieval_cut: float = 0.3,
    retrieval_weights: Sequence[NDArray] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fitted AttentionParams fields and the statistics behind them, pooled over traces.

    ``weights`` give the mass statistics (best: mean-aggregated captures);
    ``retrieval_weights`` (best: max-aggregated captures of the same prompts), when
    given, give the retrieval statistics instead of ``weights``.
    """
    stats = [trace_stats(w, block_tokens) for w in weights]
    ret_stats = stats
    if retrieval_weights is not None:
        ret_stats = [trace_stats(w, block_tokens) for w in retrieval_weights]
    L = stats[0]["sink_by_layer"].size
    sink = np.mean([s["sink_by_layer"] for s in stats], axis=0)
    x = np.arange(L) / max(L - 1, 1)
    slope, icpt = np.polyfit(x, sink, 1)
    first = float(np.clip(icpt, 0.0, 1.0))
    last = float(np.clip(icpt + slope, 0.0, 1.0))
    # Distance profiles pooled over traces (shortest common length).
    n = min(s["distance_profile"].size for s in stats)
    prof_l = np.mean([s["distance_profile_by_layer"][:, :n] for s in stats], axis=0)  # (L, n)
    prof = prof_l.mean(axis=0)
    bg, excess = _excess(prof, n)
    bg_l, excess_l = _excess(prof_l, n)
    d_tok = np.arange(n) * block_tokens
    k = max(2, min(RECENT_BLOCKS, n))
    slope_r, _ = np.polyfit(d_tok[:k], np.log(np.clip(excess[:k], 1e-9, None)), 1)
    tau = float(np.clip(-1.0 / slope_r if slope_r < 0 else 1e3, 1.0, 1e4))
    recent_mass = float(np.clip(excess[:k].sum(), 0.0, 1.0 - max(first, last)))
    recent_l_raw = excess_l[:, :k].sum(axis=1)
    recent_l = np.minimum(recent_l_raw, 1.0 - sink)
    far_peak = np.mean([s["far_peak"] for s in ret_stats], axis=0)
    ret = far_peak >= retrieval_cut
    rel = np.concatenate([s["log_relevance"] for s in stats])
    jit = np.concatenate([s["log_jitter"] for s in stats])
    params: dict[str, Any] = {
        "sink_mass_first": round(first, 4),
        "sink_mass_last": round(last, 4),
        "recent_mass": round(recent_mass, 4),
        "recent_tokens": round(tau, 2),
        "relevance_sigma": round(_robust_sigma(rel) if rel.size else 1.2, 4),
        "jitter_sigma": round(_robust_sigma(jit) if jit.size else 0.3, 4),
        "retrieval_fraction": round(float(ret.mean()), 4),
        # The generator splits a retrieval head's mass over its needles: per-needle = peak.
        "retrieval_mass": round(
            min(1.0, float(far_peak[ret].mean()) * NEEDLES) if ret.any() else 0.0, 4
        ),
        "sink_profile": _floor4(sink),
        "recent_profile": _floor4(recent_l),
    }
    evidence = {
        "evidence": "Measured",
        "sink_by_layer": [round(float(v), 4) for v in sink],
        "sink_linear_fit_rmse": round(float(np.sqrt(np.mean((icpt + slope * x - sink) ** 2))), 4),
        "recent_by_layer_uncapped": [round(float(v), 4) for v in recent_l_raw],
        "recent_layers_capped": int((recent_l_raw > 1.0 - sink).sum()),
        "distance_profile_first_blocks": [round(float(v), 5) for v in prof[:8]],
        "background_per_block": round(float(bg), 5),
        "background_per_block_by_layer": [round(float(v), 5) for v in bg_l],
        "retrieval_heads": [[int(a), int(b)] for a, b in np.argwhere(ret)],
        "steps_used": [s["steps_used"] for s in stats],
    }
    if retrieval_weights is not None:
        # The sink as the retrieval view (max over the group) sees it: for sink_max_ratio.
        evidence["retrieval_view_sink_profile"] = _floor4(
            np.mean([s["sink_by_layer"] for s in ret_stats], axis=0)
        )
    return params, evidence


def generate_dense(
    params: AttentionParams, shape: Any, tokens: int, seed: int, aggregation: str
) -> NDArray:
    """The generator's dense weights (steps, layers, kv_heads, blocks) for one context of
    ``tokens`` positions, one step per position, as a capture records them."""
    am = AttentionModel(shape, params, aggregation, seed)
    rng = np.random.default_rng(seed)
    ctx = ContextAttention(shape, params, rng)
    nb = -(-tokens // shape.block_tokens)
    w = np.zeros((tokens, shape.layers, shape.kv_heads, nb), dtype=np.float32)
    for s in range(tokens):
        a = am.weights(ctx, s + 1, rng)
        w[s, :, :, : a.shape[-1]] = a
    return w


SPLIT_GRID = tuple(round(0.1 * i, 1) for i in range(13))  # split_sigma candidates 0 … 1.2
REFINE_ROUNDS = 3  # profile corrections after split_sigma is chosen
REFINE_PASSES = 2  # (choose split_sigma, correct the profiles) passes


def sink_max_ratio(mean_sink: Sequence[float], max_sink: Sequence[float]) -> float:
    """Mean over layers with a real sink (mean view > 0.1) of max-view / mean-view sink: how
    differently the query heads of one group split their mass (1 = all alike)."""
    a, b = np.asarray(mean_sink, dtype=float), np.asarray(max_sink, dtype=float)
    sel = a > 0.1
    return round(float((b[sel] / a[sel]).mean()), 4) if sel.any() else 1.0


def generated_stats(
    params: dict[str, Any], shape: Any, lengths: Sequence[int]
) -> tuple[dict[str, Any], float]:
    """The generator at ``params`` on ``shape``, one context per length (seeds 0, 1, …):
    the mean-view statistics (as :func:`fit` gives them, retrieval from the max view) and
    the max/mean sink ratio."""
    p = AttentionParams().with_(**params)
    mean = [generate_dense(p, shape, n, seed, "mean") for seed, n in enumerate(lengths)]
    mx = [generate_dense(p, shape, n, seed, "max") for seed, n in enumerate(lengths)]
    got, ev = fit(mean, shape.block_tokens, retrieval_weights=mx)
    return got, sink_max_ratio(got["sink_profile"], ev["retrieval_view_sink_profile"])


def refine(
    params: dict[str, Any],
    measured: dict[str, Any],
    shape: Any,
    lengths: Sequence[int],
    progress: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Indirect inference: generator inputs whose generated statistics match the measured ones.

    Each of :data:`REFINE_PASSES` passes chooses ``split_sigma`` on :data:`SPLIT_GRID` so
    that the generator's max/mean sink ratio matches the captures' (interpolated between
    grid points), then corrects the sink and recent profiles :data:`REFINE_ROUNDS` times
    by the difference between the measured and the generated profile (the split and the
    renormalisation move them).
    """
    p = dict(params)
    target = float(measured["sink_max_ratio"])
    sink = np.asarray(p["sink_profile"], dtype=float)
    recent = np.asarray(p["recent_profile"], dtype=float)
    ratios: list[float] = []
    runs = REFINE_PASSES * (len(SPLIT_GRID) + REFINE_ROUNDS) + 1
    bar, _ = progress_bar(runs, "refine", "run", off=not progress)

    def stats(q: dict[str, Any]) -> tuple[dict[str, Any], float]:
        bar.update(1)
        return generated_stats(q, shape, lengths)

    for _ in range(REFINE_PASSES):
        ratios = [stats({**p, "split_sigma": s})[1] for s in SPLIT_GRID]
        mono = np.maximum.accumulate(ratios)
        p["split_sigma"] = round(float(np.interp(target, mono, SPLIT_GRID)), 3)
        for _ in range(REFINE_ROUNDS):
            got, _ratio = stats(p)
            sink = np.clip(sink + np.subtract(measured["sink_profile"], got["sink_profile"]), 0, 1)
            recent = np.clip(
                recent + np.subtract(measured["recent_profile"], got["recent_profile"]), 0, 1
            )
            recent = np.minimum(recent, 1.0 - sink)
            p["sink_profile"] = _floor4(sink)
            p["recent_profile"] = _floor4(recent)
    got, ratio = stats(p)
    bar.close()
    report = {
        "evidence": "Simulated",
        "split_grid_ratios": [round(float(r), 4) for r in ratios],
        "sink_max_ratio": ratio,
        "profile_rmse": _rmse(got, measured),
    }
    return p, report


def _rmse(got: dict[str, Any], want: dict[str, Any]) -> dict[str, float]:
    return {
        name: round(float(np.sqrt(np.mean(np.subtract(got[name], want[name]) ** 2))), 4)
        for name in ("sink_profile", "recent_profile")
    }


def main(
    paths: Sequence[str], refine_generator: bool = True, progress: bool = False
) -> dict[str, Any]:
    """Fit from trace files; returns {"params", "measured", "evidence"} (docs/model.md).

    Given captures of both aggregations, the mass statistics come from the ``mean``
    ones and the retrieval statistics from the ``max`` ones; given one kind, from it.
    ``measured`` holds the statistics the generator must reproduce; with both kinds and
    ``refine_generator``, ``params`` are refined (:func:`refine`) to reproduce them.
    """
    # lazy: `kvcxl --help` imports this module; .calibrate (+ .quality) adds ~5 ms
    from .calibrate import dense_weights

    if not paths:
        raise ValueError("no trace given: pass one or more captured traces (.npz)")
    traces = [Trace.load(p) for p in paths]
    bts = {t.shape.block_tokens for t in traces}
    if len(bts) != 1:
        raise ValueError(f"all traces must share one block size (got {sorted(bts)})")
    bt = bts.pop()
    by_agg = {a: [t for t in traces if t.aggregation == a] for a in ("mean", "max")}
    mass = by_agg["mean"] or by_agg["max"]
    ret = by_agg["max"] if by_agg["mean"] and by_agg["max"] else None
    mass_w = [dense_weights(t) for t in mass]
    ret_w = None if ret is None else [dense_weights(t) for t in ret]
    params, evidence = fit(mass_w, bt, retrieval_weights=ret_w)
    measured: dict[str, Any] = {
        "sink_profile": params["sink_profile"],
        "recent_profile": params["recent_profile"],
    }
    evidence["mass_aggregation"] = mass[0].aggregation
    evidence["retrieval_aggregation"] = (ret or mass)[0].aggregation
    evidence["lengths"] = [int(w.shape[0]) for w in mass_w]
    evidence["shape"] = mass[0].shape.to_dict()
    if ret_w is not None:
        max_sink = evidence["retrieval_view_sink_profile"]
        measured["sink_max_ratio"] = sink_max_ratio(params["sink_profile"], max_sink)
        if refine_generator:
            shape = ModelShape(**{**evidence["shape"], "name": "fit"})
            params, evidence["refine"] = refine(
                params, measured, shape, evidence["lengths"], progress
            )
    AttentionParams().with_(**params)  # the fitted values are valid generator parameters
    return {"params": params, "measured": measured, "evidence": evidence}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``kvcxl trace fit`` (the parser is created by the trace command)."""
    p.description = (
        "Fit the synthetic attention generator (sink and recent-window share per layer, "
        "recent-window length, background spread, retrieval heads) to per-position captures "
        "from `kvcxl trace capture`. Give mean-aggregated captures for the mass statistics "
        "and max-aggregated ones of the same prompts for the retrieval heads. Prints the "
        "fitted values beside the committed ones that the ci and smollm2 presets use "
        f"({FIT_FILE.name}, beside kvcxl.emu.workloads.attention; --write writes a file of "
        "that form). With "
        "both kinds of capture the parameters are then refined by running the generator "
        "(indirect inference) until its statistics match the captures', and checked so."
    )
    p.epilog = (
        "example (the committed fit, docs/model.md):\n"
        "  for p in chat long-doc code; do\n"
        "    kvcxl trace capture --prompt $p --steps 32 --aggregation mean -o $p-mean.npz\n"
        "    kvcxl trace capture --prompt $p --steps 32 -o $p-max.npz; done\n"
        "  kvcxl trace fit *-mean.npz *-max.npz --plot fit.png --json fit.json \\\n"
        f"    --write emu/workloads/{FIT_FILE.name}   "
        "# in a source checkout: update the committed fit"
    )
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("traces", nargs="+", metavar="TRACE", help="captured traces (.npz)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write params and evidence")
    p.add_argument(
        "--write",
        metavar="FILE.toml",
        help=f"write the measured statistics and fitted parameters as an attention fit file, "
        f"the form of the committed {FIT_FILE.name} that the ci and smollm2 presets read",
    )
    p.add_argument(
        "--plot", metavar="FILE.png", help="per-layer sink and recent share: measured vs generator"
    )
    p.add_argument(
        "--no-refine",
        action="store_true",
        help="keep the direct statistics as the parameters (skip the ~15 s of generator runs "
        "that choose split_sigma and correct the profiles)",
    )
    p.add_argument(
        "--no-check", action="store_true", help="skip running the generator at the fitted values"
    )


def check(
    params: dict[str, Any],
    measured: dict[str, Any],
    shape: Any,
    lengths: Sequence[int],
    mass_aggregation: str,
    retrieval_aggregation: str,
) -> dict[str, Any]:
    """The generator at ``params``, fitted again as the captures were: its statistics, their
    profile RMSE against ``measured`` and (mean and max captures) its max/mean sink ratio."""
    if (mass_aggregation, retrieval_aggregation) == ("mean", "max"):
        got, ratio = generated_stats(params, shape, lengths)
    else:
        p = AttentionParams().with_(**params)
        w = [generate_dense(p, shape, n, seed, mass_aggregation) for seed, n in enumerate(lengths)]
        got, ratio = fit(w, shape.block_tokens)[0], None
    return {
        "evidence": "Simulated",
        "generated": got,
        "profile_rmse": _rmse(got, measured),
        "sink_max_ratio": ratio,
    }


def cli(args: argparse.Namespace) -> int:
    """Handler of ``kvcxl trace fit``."""

    out = main(args.traces, refine_generator=not args.no_refine, progress=True)
    params, measured, ev = out["params"], out["measured"], out["evidence"]
    print(
        f"fit over {len(ev['lengths'])} capture(s) of {ev['lengths']} positions; mass from "
        f"{ev['mass_aggregation']}, retrieval from {ev['retrieval_aggregation']} "
        "aggregation  (Measured)"
    )
    if ev["mass_aggregation"] == "max":
        print(
            "note: mass statistics from max-aggregated captures overstate each query head's "
            "shares; capture with --aggregation mean as well (see --help)"
        )
    if "refine" in ev:
        print(
            f"refined by running the generator: split_sigma {params['split_sigma']} for a "
            f"max/mean sink ratio of {measured['sink_max_ratio']}, profiles corrected "
            f"{REFINE_ROUNDS} times  (Simulated)"
        )
    print(f"{'parameter':<22}{'fitted':>10}{'committed':>11}")
    for name, v in params.items():
        c = FITTED.get(name)
        if isinstance(v, list):
            d = np.abs(np.subtract(v, c)).max() if c is not None and len(c) == len(v) else None
            note = "" if d is None else f"max |diff| {d:.4f}"
            print(f"{name:<22}{'(' + str(len(v)) + ' layers)':>10}{'':>11}  {note}")
        else:
            print(f"{name:<22}{v:>10.4f}{'' if c is None else f'{c:>11.4f}'}")
    print(f"sink line RMSE over layers: {ev['sink_linear_fit_rmse']}  (the profile replaces it)")
    generated = None
    if not args.no_check:
        shape = ModelShape(**{**ev["shape"], "name": "fit-check"})
        out["check"] = check(
            params, measured, shape, ev["lengths"], ev["mass_aggregation"],
            ev["retrieval_aggregation"],
        )  # fmt: skip
        generated = out["check"]["generated"]
        rmse, ratio = out["check"]["profile_rmse"], out["check"]["sink_max_ratio"]
        print(
            "check (generator at the fitted values vs the captures; Simulated): "
            f"sink RMSE {rmse['sink_profile']}, recent RMSE {rmse['recent_profile']}, "
            f"jitter {generated['jitter_sigma']} vs {params['jitter_sigma']}, relevance "
            f"{generated['relevance_sigma']} vs {params['relevance_sigma']}, retrieval heads "
            f"{generated['retrieval_fraction']} vs {params['retrieval_fraction']}"
            + ("" if ratio is None else f", max/mean sink {ratio} vs {measured['sink_max_ratio']}")
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2))
        wrote(args.json_out)
    if args.write:
        note = (
            f"Written by `kvcxl trace fit` from {len(ev['lengths'])} capture(s) of "
            f"{ev['lengths']} positions ({ev['mass_aggregation']} mass, "
            f"{ev['retrieval_aggregation']} retrieval).\n"
            "[measured]: the statistics the generator must reproduce; [fitted]: its parameters "
            "(AttentionParams fields).\n"
            f"Read by kvcxl.emu.workloads.attention.load_fit; the committed fit is {FIT_FILE.name}."
        )
        Path(args.write).write_text(format_fit(measured, params, note))
        wrote(args.write)
    if args.plot:
        _plot(measured, generated, args.plot)
        wrote(args.plot)
    return 0


def _plot(measured: dict[str, Any], regen: dict[str, Any] | None, path: str) -> None:
    with figure(path, dpi=120, tight=True, ncols=2, figsize=(10, 3.6), sharex=True) as (_, axes):
        _draw(measured, regen, axes)


def _draw(measured: dict[str, Any], regen: dict[str, Any] | None, axes: Any) -> None:
    panels = (("sink_profile", "sink share (block 0)"), ("recent_profile", "recent-window share"))
    for ax, (name, title) in zip(axes, panels, strict=True):
        layers = np.arange(len(measured[name]))
        ax.plot(layers, measured[name], "o", label="captures (Measured)")
        if regen is not None:
            ax.plot(layers, regen[name], "-", label="generator at the fit (Simulated)")
        ax.set_title(title)
        ax.set_xlabel("layer")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of a head's attention")
    axes[0].legend(fontsize=8)


if __name__ == "__main__":  # python -m kvcxl.model.fit TRACE...
    import json
    import sys

    print(json.dumps(main(sys.argv[1:]), indent=2))
