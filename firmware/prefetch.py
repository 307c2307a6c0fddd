"""RoPE-locality prefetch (docs/policy.md): which blocks a touch proposes, and their rank.

A touch of block b of (layer l, KV head h) proposes blocks b − Wb … b + Wb of head
h in layers l+1 … l+depth, where Wb = W // block_tokens.  Candidates are ranked by
``b_rope · 1/(1 + d/scale) + b_score · score`` (float) or its Q0.16 counterpart,
highest first, ties to the lower entry id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from . import fixedpoint as fx
from .config import PolicyConfig
from .formulas import prefetch_rank
from .select import reference_order


@dataclass(frozen=True)
class Candidates:
    """Proposed blocks (deduplicated, each with its smallest distance in blocks)."""

    layer: NDArray
    head: NDArray
    block: NDArray
    distance_blocks: NDArray


def propose(
    layer: NDArray,
    head: NDArray,
    block: NDArray,
    *,
    n_layers: int,
    n_blocks: int,
    block_tokens: int,
    config: PolicyConfig,
) -> Candidates:
    """Candidates for a set of touches of one context (arrays of equal length)."""
    wb = fx.window_blocks(config.prefetch_window, block_tokens)
    layer = np.asarray(layer, dtype=np.int64)
    head = np.asarray(head, dtype=np.int64)
    block = np.asarray(block, dtype=np.int64)
    if config.prefetch_depth == 0 or layer.size == 0:
        z = np.empty(0, dtype=np.int64)
        return Candidates(z, z, z, z)
    dl = np.arange(1, config.prefetch_depth + 1, dtype=np.int64)
    db = np.arange(-wb, wb + 1, dtype=np.int64)
    cl = (layer[:, None, None] + dl[None, :, None]) + 0 * db[None, None, :]
    cb = block[:, None, None] + db[None, None, :] + 0 * dl[None, :, None]
    ch = np.broadcast_to(head[:, None, None], cl.shape)
    dist = np.broadcast_to(np.abs(db)[None, None, :], cl.shape)
    ok = (cl < n_layers) & (cb >= 0) & (cb < n_blocks)
    cl, ch, cb, dist = cl[ok], ch[ok], cb[ok], dist[ok]
    # Deduplicate (layer, head, block), keeping the smallest distance.
    key = (cl * (int(ch.max(initial=0)) + 1) + ch) * n_blocks + cb
    order = np.lexsort((dist, key))
    key, first = key[order], np.ones(order.size, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    pick = order[first]
    return Candidates(cl[pick], ch[pick], cb[pick], dist[pick])


def rank(
    distance_blocks: NDArray,
    score: NDArray,
    block_tokens: int,
    config: PolicyConfig,
    mode: str = "float",
) -> NDArray:
    """Prefetch rank of candidates (higher first) from their distance and their entry's score.

    ``score`` is a float score in float mode and a Q0.16 integer in int mode.
    """
    if mode == "int":
        table = fx.rope_table(
            fx.window_blocks(config.prefetch_window, block_tokens),
            block_tokens,
            config.prefetch_distance_scale,
        )
        return np.asarray(
            fx.prefetch_rank_q16(
                distance_blocks, score, fx.blend_to_q16(config.prefetch_blend), table
            )
        )
    d = np.asarray(distance_blocks, dtype=np.float64) * block_tokens
    return np.asarray(
        prefetch_rank(d, score, config.prefetch_blend, config.prefetch_distance_scale)
    )


def order(ids: NDArray, ranks: NDArray) -> NDArray:
    """Candidate entry ids in fetch order: rank descending, id ascending."""

    return reference_order(ids, ranks)
