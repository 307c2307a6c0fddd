"""The entry table: identity and position of every KV entry, as columns of numpy arrays.

An entry is one block of one KV head of one layer of one context (docs/design.md).  Entry
ids are dense integers handed out in insertion order; every per-entry array in the
engine (policy metadata, residency, tiers) is indexed by them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray


def grow(arr: NDArray, n: int, fill: object = 0) -> NDArray:
    """``arr`` with room for at least ``n`` items (doubling), new items set to ``fill``."""
    if arr.size >= n:
        return arr
    new = np.full(max(n, 2 * arr.size, 16), fill, dtype=arr.dtype)
    new[: arr.size] = arr
    return new


_BITMAP_FROM = 1 << 12  # batches at least this large may use the bitmap path


def unique_ids(ids: NDArray) -> NDArray:
    """Sorted distinct ids. Same result as ``np.unique``, whose hash-based path in numpy 2.4
    is ~50× slower than a sort on large int64 batches (1.9 s vs 0.04 s for 655 k ids).

    Entry ids are dense, so a large batch whose ids span at most 8× its size is deduplicated
    by marking a bitmap: O(n + span) instead of a sort (0.13 s vs 0.41 s for 4.9 M ids).
    """
    a = np.asarray(ids, dtype=np.int64)
    if a.size >= _BITMAP_FROM:
        lo, hi = int(a.min()), int(a.max())
        if hi - lo < 8 * a.size:
            seen = np.zeros(hi - lo + 1, dtype=bool)
            seen[a - lo] = True
            out = np.flatnonzero(seen)
            return out + lo if lo else out
    s = np.sort(a)
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


class EntryTable:
    """Columns ``ctx``, ``layer``, ``head``, ``block`` for ``n`` entries plus context lengths."""

    def __init__(self, block_tokens: int = 16, capacity: int = 1024) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens = {block_tokens} is out of range: must be >= 1")
        self.block_tokens = block_tokens
        self.n = 0
        self.ctx = np.zeros(capacity, dtype=np.int32)
        self.layer = np.zeros(capacity, dtype=np.int32)
        self.head = np.zeros(capacity, dtype=np.int32)
        self.block = np.zeros(capacity, dtype=np.int32)
        self.ctx_tokens = np.zeros(16, dtype=np.int64)  # current length of each context
        # Called with every length report (contexts, tokens): the audit's history listens.
        self.observers: list[Callable[[NDArray, NDArray], None]] = []

    def append(
        self, ctx: ArrayLike, layer: ArrayLike, head: ArrayLike, block: ArrayLike
    ) -> NDArray:
        """Add entries (broadcast together); returns their new ids."""
        c, lay, h, b = np.broadcast_arrays(
            np.asarray(ctx), np.asarray(layer), np.asarray(head), np.asarray(block)
        )
        for name, v in (("context", c), ("layer", lay), ("kv_head", h), ("block", b)):
            if v.size and v.min() < 0:
                raise ValueError(f"negative {name} id {int(v.min())}")
        k = c.size
        ids = np.arange(self.n, self.n + k, dtype=np.int64)
        end = self.n + k
        self.ctx = grow(self.ctx, end)
        self.layer = grow(self.layer, end)
        self.head = grow(self.head, end)
        self.block = grow(self.block, end)
        self.ctx[self.n : end] = c.ravel()
        self.layer[self.n : end] = lay.ravel()
        self.head[self.n : end] = h.ravel()
        self.block[self.n : end] = b.ravel()
        self.n = end
        if k:  # a context is at least as long as its last block's first token + 1
            self.raise_lengths(c.ravel(), b.ravel().astype(np.int64) * self.block_tokens + 1)
        return ids

    def raise_lengths(self, ctx: ArrayLike, tokens: ArrayLike) -> None:
        """Contexts ``ctx`` are now at least ``tokens`` long (a context never shrinks)."""
        c = np.asarray(ctx, dtype=np.int64)
        t = np.asarray(tokens, dtype=np.int64)
        if c.size == 0:
            return
        self.ctx_tokens = grow(self.ctx_tokens, int(c.max()) + 1)
        np.maximum.at(self.ctx_tokens, c, t)
        for observe in self.observers:
            observe(c, t)

    def set_context_tokens(self, ctx: int, tokens: int) -> None:
        """Context ``ctx`` now holds ``tokens`` tokens (a shorter report leaves it as it was)."""
        self.raise_lengths([ctx], [tokens])

    def first_token(self, ids: NDArray) -> NDArray:
        """Token position of each entry's first token."""
        return self.block[ids].astype(np.int64) * self.block_tokens

    def age_tokens(self, ids: NDArray) -> NDArray:
        """How far behind its context's newest token each entry's last token is."""
        last = self.first_token(ids) + self.block_tokens - 1
        return np.maximum(self.ctx_tokens[self.ctx[ids]] - 1 - last, 0)
