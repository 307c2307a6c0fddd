"""Fit the synthetic attention generator (`AttentionParams` of kvcxl.emu.attention) to real traces.

Statistics are taken from per-position captures (dense block weights, combined
over the GQA group as the trace says), on steps whose context has at least
``min_blocks`` blocks, so that the sink block, the recent blocks and the far blocks
are distinct:

* **sink mass per layer** — the weight of block 0; fitted by least squares to the
  generator's linear profile ``sink_mass_first … sink_mass_last`` over layers.
* **recent window** — the mean weight by block distance from the query's block
  (block 0 excluded) is fitted as background + ``A·exp(−distance_tokens / τ)``;
  ``recent_tokens = τ`` and ``recent_mass`` is the mass above background.
* **retrieval heads** — a (layer, head) whose largest far block (≥ 4 blocks back,
  not block 0) holds on average ≥ ``retrieval_cut`` of its mass; their share of all
  heads is ``retrieval_fraction`` and their mean far-peak mass ``retrieval_mass``.
* **background spread** — ``relevance_sigma``: the σ of log time-averaged far-block
  weights within a head; ``jitter_sigma``: the σ over steps of log weight around
  each block's own mean.

``group_sigma`` (spread between the query heads of one group) cannot be seen after
aggregation and keeps its default; ``needles`` likewise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

# Fitted on the three committed prompts (chat, long-doc, code), 32 generated tokens each,
# 16-token blocks, max aggregation: `kvcxl.emu.model.fit.main` / docs/model.md. Measured.
FITTED: dict[str, float] = {
    "sink_mass_first": 0.0089,
    "sink_mass_last": 0.8626,
    "recent_mass": 0.1374,
    "recent_tokens": 16.46,
    "relevance_sigma": 0.839,
    "jitter_sigma": 1.9296,
    "retrieval_fraction": 0.0667,
    "retrieval_mass": 0.316,
}


def fitted_params() -> Any:
    """The generator's parameters fitted to SmolLM2-135M (docs/model.md), for the ci preset."""
    from ..attention import AttentionParams

    return AttentionParams().with_(**FITTED) if FITTED else AttentionParams()


def trace_stats(w: NDArray, block_tokens: int, min_blocks: int = 8) -> dict[str, Any]:
    """Statistics of one capture's dense weights (steps, layers, kv_heads, blocks)."""
    S, L, H, _ = w.shape
    steps = np.arange(S)
    qblock = steps // block_tokens
    use = steps[qblock + 1 >= min_blocks]
    if use.size == 0:
        raise ValueError(f"no step has {min_blocks} blocks of context: capture a longer sequence")
    sink = w[use, :, :, 0].mean(axis=(0, 2))  # (L,)
    # Mean weight by block distance from the query's block (distance 0 = own block).
    maxd = int(qblock[use].max())
    prof = np.zeros(maxd + 1)
    cnt = np.zeros(maxd + 1)
    far_peak = np.zeros((L, H))
    n_far = 0
    logs_rel, logs_jit = [], []
    for s in use:
        qb = int(qblock[s])
        d = qb - np.arange(1, qb + 1)  # blocks 1 … qb
        prof[d] += w[s, :, :, 1 : qb + 1].mean(axis=(0, 1))
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
        far_all = w[use][:, :, :, 1 : qb - 3]  # blocks existing at every used step? keep valid
        valid = far_all > 0
        mean_b = np.where(valid, far_all, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            tm = np.nanmean(mean_b, axis=0)  # (L, H, blocks)
            lr = np.log(tm)
            logs_rel = (lr - np.nanmean(lr, axis=-1, keepdims=True))[np.isfinite(lr)]
            lj = np.log(mean_b / tm[None])
            logs_jit = lj[np.isfinite(lj)]
    return {
        "sink_by_layer": sink,
        "distance_profile": prof,
        "far_peak": far_peak,
        "log_relevance": np.asarray(logs_rel),
        "log_jitter": np.asarray(logs_jit),
        "steps_used": int(use.size),
    }


def fit(
    weights: Sequence[NDArray], block_tokens: int, retrieval_cut: float = 0.3
) -> tuple[dict[str, float], dict[str, Any]]:
    """Fitted AttentionParams fields and the statistics behind them, pooled over traces."""
    stats = [trace_stats(w, block_tokens) for w in weights]
    L = stats[0]["sink_by_layer"].size
    sink = np.mean([s["sink_by_layer"] for s in stats], axis=0)
    x = np.arange(L) / max(L - 1, 1)
    slope, icpt = np.polyfit(x, sink, 1)
    first = float(np.clip(icpt, 0.0, 1.0))
    last = float(np.clip(icpt + slope, 0.0, 1.0))
    # Distance profile pooled over traces (shortest common length).
    n = min(s["distance_profile"].size for s in stats)
    prof = np.mean([s["distance_profile"][:n] for s in stats], axis=0)
    bg = float(np.median(prof[min(4, n - 1) :])) if n > 4 else float(prof.min())
    excess = np.clip(prof - bg, 1e-9, None)
    d_tok = np.arange(n) * block_tokens
    k = max(2, min(4, n))
    slope_r, _ = np.polyfit(d_tok[:k], np.log(excess[:k]), 1)
    tau = float(np.clip(-1.0 / slope_r if slope_r < 0 else 1e3, 1.0, 1e4))
    recent_mass = float(np.clip(excess[:k].sum(), 0.0, 1.0 - max(first, last)))
    far_peak = np.mean([s["far_peak"] for s in stats], axis=0)
    ret = far_peak >= retrieval_cut
    rel = np.concatenate([s["log_relevance"] for s in stats])
    jit = np.concatenate([s["log_jitter"] for s in stats])
    params = {
        "sink_mass_first": round(first, 4),
        "sink_mass_last": round(last, 4),
        "recent_mass": round(recent_mass, 4),
        "recent_tokens": round(tau, 2),
        "relevance_sigma": round(float(rel.std()) if rel.size else 1.2, 4),
        "jitter_sigma": round(float(jit.std()) if jit.size else 0.3, 4),
        "retrieval_fraction": round(float(ret.mean()), 4),
        "retrieval_mass": round(float(far_peak[ret].mean()) if ret.any() else 0.0, 4),
    }
    evidence = {
        "evidence": "Measured",
        "sink_by_layer": [round(float(v), 4) for v in sink],
        "sink_linear_fit_rmse": round(float(np.sqrt(np.mean((icpt + slope * x - sink) ** 2))), 4),
        "distance_profile_first_blocks": [round(float(v), 5) for v in prof[:8]],
        "background_per_block": round(bg, 5),
        "retrieval_heads": [[int(a), int(b)] for a, b in np.argwhere(ret)],
        "steps_used": [s["steps_used"] for s in stats],
    }
    return params, evidence


def main(paths: Sequence[str]) -> dict[str, Any]:
    """Fit from trace files; returns {"params": …, "evidence": …} (used by docs/model.md)."""
    from ..trace import Trace
    from .calibrate import dense_weights

    traces = [Trace.load(p) for p in paths]
    bts = {t.shape.block_tokens for t in traces}
    if len(bts) != 1:
        raise ValueError("all traces must share one block size")
    params, evidence = fit([dense_weights(t) for t in traces], bts.pop())
    from ..attention import AttentionParams

    AttentionParams().with_(**params)  # the fitted values are valid generator parameters
    return {"params": params, "evidence": evidence}


if __name__ == "__main__":  # python -m kvcxl.emu.model.fit TRACE...
    import json
    import sys

    print(json.dumps(main(sys.argv[1:]), indent=2))
