"""The attention weights of one decode step, fused: every (layer, KV head) row is built,
normalised and aggregated over its query heads while it sits in cache.

:meth:`~kvcxl.emu.workloads.attention.AttentionModel.weights` draws the random numbers
and forms the per-(layer, head) coefficients; this kernel does the per-block arithmetic
the numpy formulation did in about seven passes over every (layer, head, block) per query
head (91 ms a step for one S1 context, Measured).  It is the same float32 arithmetic in
the same order, and a row's sum is numpy's pairwise sum (:func:`pairwise_sum`), so the
weights are equal bit for bit (tests/test_attention_kernel.py holds it to the numpy
formulation written out).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: numpy's pairwise summation: runs of at most this many values are summed with eight
#: accumulators; longer ones are halved (numpy/_core/src/umath/loops_utils.h.src).
PW_BLOCKSIZE = 128
#: Every operation is rounded to float32 as numpy's float32 loops round it: numba may
#: otherwise carry a chain of them in float64.
f32 = np.float32


@njit(cache=True)
def _leaf(a, lo: int, n: int):
    if n < 8:
        res = np.float32(0.0)
        for i in range(lo, lo + n):
            res = f32(res + a[i])
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    end = n - n % 8
    while i < end:
        r0 = f32(r0 + a[lo + i])
        r1 = f32(r1 + a[lo + i + 1])
        r2 = f32(r2 + a[lo + i + 2])
        r3 = f32(r3 + a[lo + i + 3])
        r4 = f32(r4 + a[lo + i + 4])
        r5 = f32(r5 + a[lo + i + 5])
        r6 = f32(r6 + a[lo + i + 6])
        r7 = f32(r7 + a[lo + i + 7])
        i += 8
    res = f32(f32(f32(r0 + r1) + f32(r2 + r3)) + f32(f32(r4 + r5) + f32(r6 + r7)))
    while i < n:
        res = f32(res + a[lo + i])
        i += 1
    return res


@njit(cache=True)
def _pairwise(a, lo: int, n: int):
    """numpy's recursion (halve, rounded down to a multiple of 8; sum left + right), on an
    explicit stack: a recursive compiled function is not cached reliably."""
    if n <= PW_BLOCKSIZE:
        return _leaf(a, lo, n)
    los = np.empty(64, np.int64)
    ns = np.empty(64, np.int64)
    stage = np.zeros(64, np.int8)
    vals = np.empty(64, np.float32)
    top, nv = 0, 0
    los[0], ns[0] = lo, n
    while top >= 0:
        m = ns[top]
        if m <= PW_BLOCKSIZE:
            vals[nv] = _leaf(a, los[top], m)
            nv += 1
            top -= 1
            continue
        n2 = m // 2
        n2 -= n2 % 8
        if stage[top] == 2:  # both halves summed: left + right
            vals[nv - 2] = f32(vals[nv - 2] + vals[nv - 1])
            nv -= 1
            top -= 1
            continue
        first = stage[top] == 0
        stage[top] += 1
        top += 1
        stage[top] = 0
        los[top] = los[top - 1] if first else los[top - 1] + n2
        ns[top] = n2 if first else m - n2
    return vals[0]


@njit(cache=True)
def pairwise_sum(a):
    """``a.sum()`` of a contiguous float32 row as numpy's reduction computes it: the
    pairwise sum of every value, onto the identity 0."""
    return f32(f32(0.0) + _pairwise(a, 0, a.size))


@njit(cache=True)
def fused_weights(rel, jitter, coef, recent, sink, rec, needles, needle_add, mean, out):
    """Fill ``out`` (layers, heads, blocks) float32 with one step's aggregated weights.

    ``rel`` (layers, heads, ≥ blocks) block relevance and ``jitter`` (heads, blocks) make
    the background, normalised per row; per query head g, ``coef[g]``, ``recent[g]`` and
    ``sink[g]`` (each (layers, heads)) weigh the background, the recent window ``rec``
    (blocks) and block 0; ``needle_add`` (layers, heads) goes to each block of ``needles``;
    each row is normalised, then the rows of the query heads are combined by max (or
    summed and divided by their count when ``mean``).
    """
    G, L, H = coef.shape
    nb = rec.size
    bg = np.empty(nb, np.float32)
    w = np.empty(nb, np.float32)
    for layer in range(L):
        for h in range(H):
            for b in range(nb):
                bg[b] = f32(rel[layer, h, b] * jitter[h, b])
            s = pairwise_sum(bg)
            for b in range(nb):
                bg[b] = f32(bg[b] / s)
            o = out[layer, h]
            for g in range(G):
                c = coef[g, layer, h]
                r = recent[g, layer, h]
                for b in range(nb):
                    w[b] = f32(f32(bg[b] * c) + f32(r * rec[b]))
                w[0] = f32(w[0] + sink[g, layer, h])
                add = needle_add[layer, h]
                for k in range(needles.size):
                    w[needles[k]] = f32(w[needles[k]] + add)
                s = pairwise_sum(w)
                if g == 0:
                    for b in range(nb):
                        o[b] = f32(w[b] / s)
                elif mean:
                    for b in range(nb):
                        o[b] = f32(o[b] + f32(w[b] / s))
                else:
                    for b in range(nb):
                        o[b] = max(o[b], f32(w[b] / s))
            if mean and G > 1:
                n = np.float32(G)
                for b in range(nb):
                    o[b] = f32(o[b] / n)
