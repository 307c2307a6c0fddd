"""The top-k blocks of every (layer, KV head) row of a step's weights, by radix.

A top-k read (Quest-style sparse attention) reads each row's k heaviest blocks. The
stream builder took them with ``np.argpartition`` over every row, a boolean mask over
every block and a gather: 20.4 s of a 16-user S1 top-256 stream's 35 s (Measured). This
kernel counts a row's weights by the top bits of their order-preserving integer keys,
walks the counts down from the heaviest to the bucket holding the k-th weight (a crowded
bucket split again by the next bits), sorts that bucket alone, and then takes the blocks
at or above the k-th weight in block order, their ids and weights with them.

A row with more blocks at or above its k-th weight than k (the k-th weight tied, or a
signed zero) or with NaN is given to ``np.argpartition``, whose choice it is, so every
row's blocks are exactly the ones the argpartition formulation reads.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

_SHIFT = 20  # a key's top 12 bits: sign, exponent and 3 bits of mantissa (an 8th binade)
_BUCKETS = 1 << (32 - _SHIFT)
_SHIFT2 = _SHIFT - (32 - _SHIFT)  # a crowded bucket's keys by their next 12 bits
_SORTED = 256  # a bucket of more keys than this is split by them before it is sorted


@njit(cache=True, inline="always")
def _key(u: int) -> int:
    """A float32's bits as an unsigned key in the floats' order (negatives reversed)."""
    return u + 0x80000000 if u < 0x80000000 else 0xFFFFFFFF - u


@njit(cache=True)
def _walk(counts, top: int, need: int) -> tuple[int, int]:
    """From bucket ``top`` down, the bucket holding the ``need``-th largest key, and how
    many keys lie in the buckets above it."""
    b, above = top, 0
    while above + counts[b] < need:
        above += counts[b]
        b -= 1
    return b, above


@njit(cache=True)
def _rows_topk(w, wu, ids, k: int, counts, keys, vals, out_ids, out_w, tied) -> None:
    """Row r's k largest weights' ids and weights, in block order, into ``out_ids[r]`` and
    ``out_w[r]``; or ``tied[r]`` (``wu``: ``w``'s bits; ``counts``: room for the buckets;
    ``keys``, ``vals``: for one row)."""
    rows, n = w.shape
    mask = _BUCKETS - 1
    for r in range(rows):
        counts[:] = 0
        nan = False
        for i in range(n):
            counts[_key(np.int64(wu[r, i])) >> _SHIFT] += 1
            nan |= w[r, i] != w[r, i]
        if nan:
            tied[r] = True
            continue
        b, above = _walk(counts, _BUCKETS - 1, k)
        need = k - above  # the need-th largest of bucket b is the row's k-th
        m = 0
        for i in range(n):
            key = _key(np.int64(wu[r, i]))
            if key >> _SHIFT == b:
                keys[m] = key
                vals[m] = w[r, i]
                m += 1
        if m > _SORTED:  # a crowded bucket (a row of near-equal weights): the next bits
            counts[:] = 0
            for j in range(m):
                counts[(keys[j] >> _SHIFT2) & mask] += 1
            b, above = _walk(counts, _BUCKETS - 1, need)
            need -= above
            mm = 0
            for j in range(m):
                if (keys[j] >> _SHIFT2) & mask == b:
                    vals[mm] = vals[j]
                    mm += 1
            m = mm
        v = np.sort(vals[:m])[m - need]  # the k-th largest
        j = 0
        for i in range(n):
            if w[r, i] >= v:
                if j == k:  # more than k at or above it: tied
                    tied[r] = True
                    break
                out_ids[r, j] = ids[r, i]
                out_w[r, j] = w[r, i]
                j += 1
        if j < k:  # (cannot be: k weights are at or above the k-th; kept honest)
            tied[r] = True


def topk_read(weights: NDArray, ids: NDArray, k: int) -> tuple[NDArray, NDArray]:
    """The ids and weights of each row's ``k`` largest weights (last axis), in block
    order: two arrays of ``weights``' shape with k in place of its last axis
    (``ids``: the blocks' ids, of ``weights``' shape; 1 <= k < the blocks)."""
    n = weights.shape[-1]
    if not 1 <= k < n:
        raise ValueError(f"top-k = {k}: must be in [1, {n - 1}] for rows of {n} blocks")
    if ids.shape != weights.shape:
        raise ValueError(f"ids of shape {ids.shape} for weights of shape {weights.shape}")
    w = np.ascontiguousarray(weights).reshape(-1, n)
    i2 = ids.reshape(-1, n)  # (a view where the rows' axes merge, as a grid's do)
    out_ids = np.empty((w.shape[0], k), ids.dtype)
    out_w = np.empty((w.shape[0], k), w.dtype)
    if w.dtype == np.float32:
        tied = np.zeros(w.shape[0], bool)
        room = (np.empty(_BUCKETS, np.int64), np.empty(n, np.int64), np.empty(n, np.float32))
        _rows_topk(w, w.view(np.uint32), i2, k, *room, out_ids, out_w, tied)
    else:  # (the keys are float32's; other weights are argpartition's alone)
        tied = np.ones(w.shape[0], bool)
    for r in np.flatnonzero(tied):
        at = np.sort(np.argpartition(-w[r], k - 1)[:k])
        out_ids[r], out_w[r] = i2[r, at], w[r, at]
    shape = (*weights.shape[:-1], k)
    return out_ids.reshape(shape), out_w.reshape(shape)


def topk_blocks(weights: NDArray, k: int) -> NDArray:
    """The blocks (last axis) of each row's ``k`` largest weights, ascending."""
    blocks = np.broadcast_to(np.arange(weights.shape[-1]), weights.shape)
    return topk_read(weights, blocks, k)[0]
