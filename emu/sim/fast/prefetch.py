"""RoPE-locality prefetch for the compiled loop: the firmware's candidates, rank and order
(:meth:`kvcxl.firmware.session.FirmwareSession.prefetch_candidates`, docs/policy.md).

After a read batch the loop calls :func:`gather` (the batch's ``limit`` strongest touches,
ties to the lower entry id, propose blocks ``b − Wb … b + Wb`` of the same head in layers
``l+1 … l+depth``; each described, non-resident entry once, at its smallest distance),
ranks each candidate with its policy's score (:func:`rank_float` or :func:`rank_q16`)
and takes the fetch order from :func:`order` (rank descending, id ascending).  The
window, the RoPE terms and the blend come from the firmware (``fixedpoint.window_blocks``,
``formulas.rope_factor``, ``fixedpoint.rope_table``, ``fixedpoint.blend_to_q16``);
the two rank expressions below are compared bit for bit with the firmware's
(tests/test_sim_fast_prefetch.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import rope_factor

from ...workloads.stream import ReadStream
from .formulas import blend_float, blend_q16

# The loop's prefetch counts: entries prefetched, later hit while marked, evicted while
# marked, and the useful ones by the end of the warm-up (the simulator's pf_* figures).
TOTAL, USEFUL, WASTED, USEFUL_WARM = range(4)


class Prefetch(NamedTuple):
    """The run's prefetch parameters, the stream's identity grid and the scratch arrays
    (``on`` False: every array empty, the loop never asks)."""

    on: bool
    int_mode: bool  # the session ranks in Q0.16 (the EMA's integer mode)
    limit: int
    depth: int
    wb: int  # the window in whole blocks
    touch: float
    rope: NDArray  # formulas.rope_factor at every block distance 0 … wb (float mode)
    rope_q: NDArray  # fixedpoint.rope_table (int mode)
    b_rope: float
    b_score: float
    bq_rope: int
    bq_score: int
    e_layer: NDArray
    e_head: NDArray
    # Per context: its grid's offset into ``grid`` and extent (layers, heads, blocks),
    # and its shared prefix (parent context, −1 for none, and how many blocks).
    g_off: NDArray
    g_nl: NDArray
    g_nh: NDArray
    g_nb: NDArray
    parent: NDArray
    p_blocks: NDArray
    grid: NDArray  # (context, layer, head, block) → entry id, −1 for none
    # scratch
    src_w: NDArray  # the batch's touches: −weight, and the plan record of each
    src_j: NDArray
    cand: NDArray  # the candidates of one call, their distances, rank and the call's stamp
    dist: NDArray
    rank: NDArray
    seen: NDArray
    tick: NDArray  # [the call's stamp]


def build(
    stream: ReadStream, config: PolicyConfig, *, on: bool, int_mode: bool, limit: int,
    max_batch: int,
) -> Prefetch:  # fmt: skip
    """The prefetch state of one replay (empty arrays when ``on`` is False)."""
    if not on:  # (the loop never asks; the grid's numpy passes cost a short replay ~5 %)
        return _off(int_mode, int(limit))
    bt = int(stream.shape.block_tokens)
    wb = fx.window_blocks(config.prefetch_window, bt)
    n = stream.n_entries
    i64 = np.int64
    e_ctx = np.asarray(stream.e_ctx, i64)[:n]
    lay, head, blk = (np.asarray(a, i64)[:n] for a in (stream.e_layer, stream.e_head,
                                                        stream.e_block))  # fmt: skip
    prefixes = stream.prefixes
    n_ctx = max([int(e_ctx.max(initial=-1)) + 1, *(max(c, p) + 1 for c, p, _ in prefixes)])
    nl, nh, nb = (np.zeros(n_ctx, i64) for _ in range(3))
    for ext, col in ((nl, lay), (nh, head), (nb, blk)):
        np.maximum.at(ext, e_ctx, col + 1)
    size = nl * nh * nb
    g_off = np.concatenate([[0], np.cumsum(size)]).astype(i64)
    grid = np.full(int(g_off[-1]), -1, i64)
    slot = g_off[e_ctx] + (lay * nh[e_ctx] + head) * nb[e_ctx] + blk
    if np.unique(slot).size != slot.size:
        raise ValueError(
            "two entries share one (context, layer, head, block): the fast engine's "
            "prefetch needs unique identities; use --engine numpy"
        )
    grid[slot] = np.arange(n, dtype=i64)
    parent = np.full(n_ctx, -1, i64)
    p_blocks = np.zeros(n_ctx, i64)
    for c, p, k in prefixes:  # (FirmwareSession.share_prefix: the last word wins)
        parent[c], p_blocks[c] = p, k
    dists = np.arange(wb + 1, dtype=np.float64) * bt  # block distances in tokens
    bq = fx.blend_to_q16(config.prefetch_blend)
    return Prefetch(
        on, int_mode, int(limit), int(config.prefetch_depth), int(wb),
        float(config.touch_threshold),
        np.asarray(rope_factor(dists, config.prefetch_distance_scale), np.float64),
        np.asarray(fx.rope_table(wb, bt, config.prefetch_distance_scale), i64),
        float(config.prefetch_blend[0]), float(config.prefetch_blend[1]), int(bq[0]), int(bq[1]),
        lay, head, g_off[:-1].copy(), nl, nh, nb, parent, p_blocks, grid,
        np.empty(max_batch, np.float64), np.empty(max_batch, i64),
        np.empty(n, i64), np.empty(n, i64), np.empty(n, np.float64), np.full(n, -1, i64),
        np.zeros(1, i64),
    )  # fmt: skip


def _off(int_mode: bool, limit: int) -> Prefetch:
    """:func:`build`'s state with prefetching off: every array empty, of the types the on
    state has (one compiled loop serves both)."""
    i, f = np.zeros(0, np.int64), np.zeros(0, np.float64)
    return Prefetch(False, int_mode, limit, 0, 0, 0.0, f, i, 0.0, 0.0, 0, 0,
                    i, i, i, i, i, i, i, i, i, f, i, i, i, f, i, np.zeros(1, np.int64))  # fmt: skip


@njit(cache=True, inline="always")
def rank_float(pf, d, s):  # type: ignore[no-untyped-def]
    """formulas.prefetch_rank at block distance ``d``: b_rope·rope + b_score·score."""
    return blend_float(pf.b_rope, pf.rope[d], pf.b_score, s)


@njit(cache=True, inline="always")
def rank_q16(pf, d, s):  # type: ignore[no-untyped-def]
    """fixedpoint.prefetch_rank_q16: (b_rope·RoPE[k] + b_score·score + 32768) >> 16."""
    return blend_q16(pf.bq_rope, pf.rope_q[d], pf.bq_score, s)


@njit(cache=True)
def lookup(pf, c, layer, head, block, n_desc):  # type: ignore[no-untyped-def]
    """FirmwareSession._lookup: the described entry at (layer, head, block) of context
    ``c``, else of its prefix's parent for a shared block (−1: none)."""
    while c >= 0:
        if layer < pf.g_nl[c] and head < pf.g_nh[c] and block < pf.g_nb[c]:
            e = pf.grid[pf.g_off[c] + (layer * pf.g_nh[c] + head) * pf.g_nb[c] + block]
            if 0 <= e < n_desc:
                return e
        if block >= pf.p_blocks[c]:
            return -1
        c = pf.parent[c]
    return -1


@njit(cache=True)
def gather(pf, p_ids, p_w, a, z, e_ctx, e_block, n_desc, resident):  # type: ignore[no-untyped-def]
    """The candidates of the read batch ``p_ids[a:z]`` into ``pf.cand[:m]`` (each once, its
    smallest distance in ``pf.dist[e]``), returning m."""
    if pf.depth == 0:
        return 0
    ns = 0
    for j in range(a, z):
        if p_w[j] >= pf.touch:  # (float32 weights widen exactly)
            pf.src_w[ns] = -float(p_w[j])
            pf.src_j[ns] = j
            ns += 1
    if ns == 0:
        return 0
    if ns > pf.limit:  # the strongest, ties to the lower entry id (two stable sorts)
        ids = np.empty(ns, np.int64)
        for q in range(ns):
            ids[q] = p_ids[pf.src_j[q]]
        by_id = np.argsort(ids, kind="mergesort")
        o = np.argsort(pf.src_w[:ns][by_id], kind="mergesort")[: pf.limit]
        pf.src_j[: pf.limit] = pf.src_j[:ns][by_id][o]
        ns = pf.limit
    pf.tick[0] += 1
    tick = pf.tick[0]
    m = 0
    for q in range(ns):
        e = p_ids[pf.src_j[q]]
        c, h, b = e_ctx[e], pf.e_head[e], e_block[e]
        for dl in range(1, pf.depth + 1):
            layer = pf.e_layer[e] + dl
            for db in range(-pf.wb, pf.wb + 1):
                cb = b + db
                if cb < 0:
                    continue
                x = lookup(pf, c, layer, h, cb, n_desc)
                if x < 0 or resident[x]:
                    continue
                d = abs(db)
                if pf.seen[x] != tick:
                    pf.seen[x] = tick
                    pf.cand[m] = x
                    pf.dist[x] = d
                    m += 1
                elif d < pf.dist[x]:
                    pf.dist[x] = d
    return m


@njit(cache=True)
def order(pf, m, out):  # type: ignore[no-untyped-def]
    """prefetch.order of ``pf.cand[:m]`` ranked in ``pf.rank[:m]``: the first ``limit`` by
    rank descending, id ascending, into ``out``; returns how many."""
    by_id = np.argsort(pf.cand[:m])
    ids = pf.cand[:m][by_id]
    neg = np.empty(m, np.float64)
    for q in range(m):
        neg[q] = -pf.rank[by_id[q]]
    o = np.argsort(neg, kind="mergesort")  # stable: ties keep the ascending ids
    k = min(m, pf.limit)
    for q in range(k):
        out[q] = ids[o[q]]
    return k
