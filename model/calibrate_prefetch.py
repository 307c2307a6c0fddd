"""The prefetch parameters (distance scale, window, depth, blend) by precision and recall.

A touch of block b of (layer l, KV head h) at step t proposes blocks of head h in
layers l+1 … l+depth (docs/policy.md, prefetch).  Those layers are read later in the
same step, so each proposed block is checked against the blocks actually read next:
it is *useful* when it is read at step t.  Only blocks written before the step are
candidates (the step's own block is in HBM by its write; :mod:`.trajectory`).  Residency
is not modelled: these are prediction figures (Analytical model on Measured attention);
the simulator's prefetch counts are their Simulated counterpart.

Each parameter by the design's method (docs/design.md, "Uncalibrated parameters"):

* **distance scale** — "fit the hyperbola to the measured attention-versus-distance
  curve": the curve is the read probability of a block in layer l+1 at distance d
  tokens from a touched block of layer l (all touches, all pairs), and the fit
  ``c / (1 + d/scale)`` is least squares on the pairs (the curve's points weighted by
  their pair counts), with its R².
* **window** — "the smallest W whose marginal coverage still exceeds its marginal
  bandwidth cost": the ring of blocks at distance k pays when its read share (useful
  fetches per fetch) is at least ``breakeven`` (0.5: an unread fetch costs what a read
  one saves); W grows ring by ring while the next ring pays.
* **depth** — "sweeping depth against measured prediction accuracy": the read share of
  layer offset d inside the window; depth grows while the next layer pays.
* **blend** — "sweep the single free weight …, scored on prefetch precision": the
  firmware's own selection per batch (a layer of a step: its strongest ``limit`` touches
  as sources, the ``limit`` best-ranked candidates fetched; a block fetched earlier in
  the step is not fetched again), precision = useful / fetched and recall = useful /
  the step's reads in layers ≥ 1 (layer 0 is never prefetched within a step).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware import prefetch as pf
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import rope_factor

from .trajectory import Trajectory

SCALE_GRID = np.geomspace(0.1, 1e7, 4001)  # candidate scales (tokens), 0.46 % apart


def _grid(a: NDArray, t: int, tr: Trajectory) -> NDArray:
    """(blocks, layers, heads) view of one step's row."""
    return a[t].reshape(-1, tr.layers, tr.heads)


def touches(tr: Trajectory, touch_threshold: float) -> NDArray:
    """(steps, entries) touches: reads with weight ≥ the touch threshold."""
    return tr.reads & (tr.weights >= touch_threshold)


def distance_curve(
    tr: Trajectory, touch_threshold: float, max_blocks: int, layer_offset: int = 1
) -> dict[str, NDArray]:
    """Per block distance k = 0 … max_blocks: pairs (touch of block b in layer l, present
    block b ± k in layer l + layer_offset, same head) and how many of those were read."""
    K = max_blocks
    pairs = np.zeros(K + 1, dtype=np.int64)
    hits = np.zeros(K + 1, dtype=np.int64)
    touch = touches(tr, touch_threshold)
    d = layer_offset
    if d >= tr.layers:
        return {"pairs": pairs, "hits": hits}
    bt = tr.block_tokens
    for t in range(tr.steps):
        nb = (t + bt - 1) // bt  # blocks present before step t
        if nb == 0:
            continue
        a = _grid(touch, t, tr)[:, : tr.layers - d].astype(np.int64)  # sources, all blocks
        r = _grid(tr.reads, t, tr)[:nb, d:].astype(np.int64)  # targets, present blocks
        na = a.shape[0]
        ones = np.ones_like(r)
        for k in range(min(K, max(na, nb)) + 1):
            # target block = source block + k, and − k (once when k = 0)
            for sign in (1, -1) if k else (1,):
                if sign == 1:
                    n = min(na, nb - k)
                    if n <= 0:
                        continue
                    src, tgt, one = a[:n], r[k : k + n], ones[k : k + n]
                else:
                    n = min(na - k, nb)
                    if n <= 0:
                        continue
                    src, tgt, one = a[k : k + n], r[:n], ones[:n]
                hits[k] += int((src * tgt).sum())
                pairs[k] += int((src * one).sum())
    return {"pairs": pairs, "hits": hits}


def fit_hyperbola(d_tokens: NDArray, y: NDArray, weight: NDArray | None = None) -> dict[str, float]:
    """Least squares ``y ≈ c / (1 + d/scale)`` (weighted), over a log grid of scales with the
    amplitude ``c`` in closed form; R² of the weighted fit."""
    d = np.asarray(d_tokens, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones_like(y) if weight is None else np.asarray(weight, dtype=np.float64)
    ok = w > 0
    d, y, w = d[ok], y[ok], w[ok]
    if y.size < 2:
        raise ValueError("fewer than two distances with data: cannot fit a hyperbola")
    f = np.asarray(rope_factor(d[None, :], SCALE_GRID[:, None]))  # (grid, points)
    fy = (w * f * y).sum(1)
    ff = (w * f * f).sum(1)
    c = fy / ff
    sse = (w * y * y).sum() - c * fy  # at the optimal c: Σw(y − cf)² = Σwy² − c·Σwfy
    i = int(np.argmin(sse))
    mean = float((w * y).sum() / w.sum())
    sst = float((w * (y - mean) ** 2).sum())
    return {
        "scale": float(SCALE_GRID[i]),
        "amplitude": float(c[i]),
        "r2": float(1 - sse[i] / sst) if sst > 0 else float("nan"),
        "at_grid_edge": bool(i in (0, SCALE_GRID.size - 1)),
    }


def grow(shares: NDArray, breakeven: float) -> int:
    """How many leading items pay (share ≥ breakeven), minus one: the last index reached by
    growing one item at a time while the next one pays (−1 when the first does not)."""
    bad = np.flatnonzero(~(np.asarray(shares) >= breakeven))
    return int(bad[0]) - 1 if bad.size else len(shares) - 1


def evaluate(
    tr: Trajectory, config: PolicyConfig, limit: int, touch_threshold: float | None = None
) -> dict[str, float]:
    """Precision and recall of the firmware's prefetch selection under ``config``."""
    th = config.touch_threshold if touch_threshold is None else touch_threshold
    touch = touches(tr, th)
    L, H, bt = tr.layers, tr.heads, tr.block_tokens
    fetched = useful = reads = 0
    for t in range(tr.steps):
        nb = (t + bt - 1) // bt
        if nb == 0:
            continue
        read_t = tr.reads[t]
        reads += int(np.count_nonzero(read_t.reshape(-1, L, H)[:nb, 1:]))
        if config.prefetch_depth == 0:
            continue
        done = np.zeros(tr.entries, dtype=bool)  # fetched earlier in this step
        tt = touch[t].reshape(-1, L, H)
        wt = tr.weights[t].reshape(-1, L, H)
        for layer in range(L - 1):
            b, h = np.nonzero(tt[:, layer, :])
            if b.size == 0:
                continue
            if b.size > limit:  # the strongest, ties to the lower entry id (as the firmware)
                ids = b * L * H + layer * H + h
                pick = np.lexsort((ids, -wt[b, layer, h]))[:limit]
                b, h = b[pick], h[pick]
            cand = pf.propose(
                np.full(b.size, layer), h, b, n_layers=L, n_blocks=nb, block_tokens=bt,
                config=config,
            )  # fmt: skip
            cid = cand.block * L * H + cand.layer * H + cand.head
            keep = ~done[cid]
            cid, dist = cid[keep], cand.distance_blocks[keep]
            if cid.size == 0:
                continue
            ranks = pf.rank(dist, tr.scores[t, cid], bt, config)
            got = pf.order(cid, ranks)[:limit]
            done[got] = True
            fetched += got.size
            useful += int(np.count_nonzero(read_t[got]))
    return {
        "fetched": fetched,
        "useful": useful,
        "reads": reads,
        "precision": useful / fetched if fetched else float("nan"),
        "recall": useful / reads if reads else float("nan"),
    }


def _pool(curves: list[dict[str, NDArray]]) -> tuple[NDArray, NDArray]:
    pairs = np.sum([c["pairs"] for c in curves], axis=0)
    hits = np.sum([c["hits"] for c in curves], axis=0)
    return pairs, hits


def calibrate_prefetch(
    trajs: list[Trajectory],
    base: PolicyConfig,
    *,
    limit: int,
    breakeven: float = 0.5,
    max_blocks: int = 64,
    blends: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    tick: Any = None,
) -> dict[str, Any]:
    """All four prefetch parameters, in the order each one's method needs the others:
    scale (curve fit), window (ring shares), depth (layer shares inside the window), blend
    (precision of the firmware's selection at the fitted scale, window and depth)."""
    if not 0.0 < breakeven <= 1.0:
        raise ValueError(f"breakeven = {breakeven!r}: must be in (0, 1]")
    bt = trajs[0].block_tokens
    th = base.touch_threshold
    tick = tick or (lambda: None)
    pairs, hits = _pool([distance_curve(tr, th, max_blocks) for tr in trajs])
    tick()
    share = np.where(pairs > 0, hits / np.maximum(pairs, 1), np.nan)
    d_tok = np.arange(max_blocks + 1) * bt
    hyper = fit_hyperbola(d_tok, np.nan_to_num(share), pairs)
    k_last = grow(share[pairs > 0], breakeven)
    window = max(k_last, 0) * bt
    depth_rows = []
    for d in range(1, min(16, trajs[0].layers - 1) + 1):
        p_d, h_d = _pool([distance_curve(tr, th, max(k_last, 0), layer_offset=d) for tr in trajs])
        depth_rows.append(
            {
                "layer_offset": d,
                "pairs": int(p_d.sum()),
                "read_share": float(h_d.sum() / max(p_d.sum(), 1)),
            }
        )
        tick()
    depth = (
        0 if k_last < 0 else grow(np.array([r["read_share"] for r in depth_rows]), breakeven) + 1
    )
    scale = float(min(max(hyper["scale"], 1e-9), 1e9))
    fitted = base.with_(prefetch_window=window, prefetch_depth=depth, prefetch_distance_scale=scale)
    blend_rows: list[dict[str, Any]] = []
    blend = list(base.prefetch_blend)
    if depth > 0:
        blend_rows, blend = blend_sweep(trajs, fitted, limit, blends, base.prefetch_blend[0], tick)
    fitted = fitted.with_(prefetch_blend=blend)
    seed_eval = _sum([evaluate(tr, base, limit) for tr in trajs])
    fit_eval = _sum([evaluate(tr, fitted, limit) for tr in trajs]) if depth > 0 else None
    tick()
    return {
        "evidence": "Measured attention, Analytical model of prefetch (residency not modelled)",
        "limit": limit,
        "breakeven": breakeven,
        "curve": {
            "distance_tokens": d_tok.tolist(),
            "pairs": pairs.tolist(),
            "read_share": [None if np.isnan(x) else float(x) for x in share],
        },
        "hyperbola": hyper,
        "depth_rows": depth_rows,
        "blend_rows": blend_rows,
        "fitted": {
            "prefetch_window": window,
            "prefetch_depth": depth,
            "prefetch_distance_scale": scale,
            "prefetch_blend": blend,
        },
        "seed_eval": seed_eval,
        "fitted_eval": fit_eval,
    }


def blend_sweep(
    trajs: list[Trajectory],
    config: PolicyConfig,
    limit: int,
    blends: tuple[float, ...],
    prefer: float,
    tick: Any = None,
) -> tuple[list[dict[str, Any]], list[float]]:
    """Precision and recall at each rope weight; the best by precision, then recall, then
    nearest ``prefer`` (the base's rope weight: ties do not move it)."""
    rows = []
    for b in blends:
        cfg = config.with_(prefetch_blend=[b, 1.0 - b])
        rows.append({"blend": [b, 1.0 - b], **_sum([evaluate(tr, cfg, limit) for tr in trajs])})
        if tick:
            tick()
    best = max(rows, key=lambda r: (r["precision"], r["recall"], -abs(r["blend"][0] - prefer)))
    return rows, best["blend"]


def _sum(rows: list[dict[str, float]]) -> dict[str, float]:
    f = sum(r["fetched"] for r in rows)
    u = sum(r["useful"] for r in rows)
    n = sum(r["reads"] for r in rows)
    return {
        "fetched": f,
        "useful": u,
        "reads": n,
        "precision": u / f if f else float("nan"),
        "recall": u / n if n else float("nan"),
        "per_trace": [{"precision": r["precision"], "recall": r["recall"]} for r in rows],
    }
