"""Exact victim selection and the brute-force reference ranking it is audited against.

Order (the contract shared with the RTL): priority descending, then entry index
ascending.  :func:`select_victims` is O(n) (``np.partition`` plus the tie-break);
:func:`reference_order` is the plain full sort the eviction audit recomputes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def reference_order(ids: NDArray, priority: NDArray) -> NDArray:
    """All ``ids`` sorted by (priority descending, id ascending): the brute-force ranking."""
    ids = np.asarray(ids, dtype=np.int64)
    order = np.lexsort((ids, -np.asarray(priority)))
    return ids[order]


def select_victims(ids: NDArray, priority: NDArray, k: int) -> NDArray:
    """The first ``k`` of :func:`reference_order`, in that order, without sorting everything."""
    ids = np.asarray(ids, dtype=np.int64)
    priority = np.asarray(priority)
    n = ids.size
    if k <= 0 or n == 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return reference_order(ids, priority)
    kth = np.partition(priority, n - k)[n - k]  # the k-th largest priority
    above = priority > kth
    tied = np.flatnonzero(priority == kth)
    need = k - int(np.count_nonzero(above))
    tied_ids = ids[tied]
    if need < tied_ids.size:
        # Among equal priorities the lower entry index goes first.
        keep = np.argpartition(tied_ids, need - 1)[:need]
        tied = tied[keep]
    chosen = np.concatenate([np.flatnonzero(above), tied])
    return reference_order(ids[chosen], priority[chosen])
