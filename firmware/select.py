"""Exact victim selection and the brute-force reference ranking it is audited against.

Order (the contract shared with the RTL): priority descending, then entry index
ascending.  A policy may put a key of its own between the two (``tie``: ascending first
among equal priorities, e.g. the EMA's ``ema_tie_break``); the entry index still decides
what that key leaves equal.  :func:`select_victims` is O(n) (``np.partition`` plus the tie-break);
:func:`reference_order` is the plain full sort the eviction audit recomputes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_SAMPLE_FROM = 1 << 18  # tables at least this large use the sampled threshold for small k
_SAMPLE_SIZE = 1 << 14
_FAST_FROM = 1 << 12  # selections at least this large check for ascending ids (the fast path)


def _signed(priority: NDArray) -> NDArray:
    """Priorities in a dtype that negates safely (unsigned integers widen to int64)."""
    p = np.asarray(priority)
    return p.astype(np.int64) if p.dtype.kind == "u" else p


def reference_order(ids: NDArray, priority: NDArray, tie: NDArray | None = None) -> NDArray:
    """All ``ids`` sorted by (priority descending, ``tie`` ascending when given, id
    ascending): the brute-force ranking."""
    ids = np.asarray(ids, dtype=np.int64)
    keys = (ids, -_signed(priority)) if tie is None else (ids, np.asarray(tie), -_signed(priority))
    return ids[np.lexsort(keys)]


def _select_tied(ids: NDArray, priority: NDArray, tie: NDArray, k: int, ordered: bool) -> NDArray:
    """:func:`select_victims` with a policy's key between priority and id: every entry above
    the k-th largest priority goes, those at it are ranked by (tie, id)."""
    tie = np.asarray(tie)
    kth = np.partition(priority, ids.size - k)[ids.size - k]
    near = np.flatnonzero(priority >= kth)
    chosen = reference_order(ids[near], priority[near], tie[near])[:k]
    return chosen if ordered else np.sort(chosen)


def _order_ascending_ids(ids: NDArray, priority: NDArray) -> NDArray:
    """:func:`reference_order` for ``ids`` already ascending: a stable sort on priority alone
    keeps the id order among ties.  Integer priorities spanning < 2**16 values sort as
    uint16 keys (numpy's radix sort: ~7× faster than a lexsort on millions of victims)."""
    p = _signed(priority)
    if p.dtype.kind == "i" and p.size:
        hi = int(p.max())
        if hi - int(p.min()) < 1 << 16:
            return ids[np.argsort((hi - p).astype(np.uint16), kind="stable")]
    return ids[np.argsort(-p, kind="stable")]


def select_victims(
    ids: NDArray, priority: NDArray, k: int, ordered: bool = True, tie: NDArray | None = None
) -> NDArray:
    """The first ``k`` of :func:`reference_order`, in that order, without sorting everything.

    ``ordered=False`` returns the same set in no particular order: a caller that removes a
    pass's victims together (the simulator) skips ordering them, which on a thrashing S1
    step is most of the selection's cost.  ``tie``: the policy's key among equal
    priorities (ascending first), before the entry index.
    """
    ids = np.asarray(ids, dtype=np.int64)
    priority = np.asarray(priority)
    n = ids.size
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return reference_order(ids, priority, tie) if ordered else ids.copy()
    if tie is not None:
        return _select_tied(ids, _signed(priority), tie, k, ordered)
    if n >= _SAMPLE_FROM and k * 64 <= n:
        # Few victims from many entries: a threshold from a strided sample keeps only a
        # small candidate set.  Exact whenever at least k entries pass it (then the k-th
        # largest priority is >= the threshold, so the whole top-k passes); else fall back.
        stride = n // _SAMPLE_SIZE
        sample = np.sort(priority[::stride])
        rank = min(sample.size, 4 * (k * sample.size) // n + 16)
        cand = np.flatnonzero(priority >= sample[sample.size - rank])
        if k <= cand.size <= n // 4:  # (many ties at the threshold: no gain, fall back)
            return select_victims(ids[cand], priority[cand], k, ordered)
    kth = np.partition(priority, n - k)[n - k]  # the k-th largest priority
    above = priority > kth
    tied = np.flatnonzero(priority == kth)
    need = k - int(np.count_nonzero(above))
    if n >= _FAST_FROM and bool(np.all(ids[1:] > ids[:-1])):
        # Ids ascending (the cache passes its eligible entries so): the lower-index ties
        # are the first ones, and the chosen positions in order keep ids ascending.
        above[tied[:need]] = True
        chosen = np.flatnonzero(above)
        if not ordered:
            return ids[chosen]
        return _order_ascending_ids(ids[chosen], priority[chosen])
    tied_ids = ids[tied]
    if need < tied_ids.size:
        # Among equal priorities the lower entry index goes first.
        keep = np.argpartition(tied_ids, need - 1)[:need]
        tied = tied[keep]
    chosen = np.concatenate([np.flatnonzero(above), tied])
    if not ordered:
        return ids[chosen]
    return reference_order(ids[chosen], priority[chosen])
