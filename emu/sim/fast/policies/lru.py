"""LRU (firmware/policies/lru.py), and ``lru-anchor``: the same order, its pins from its
own ``wants_pin``.  The key is the last read's batch time, which only grows (QUEUE)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from ..hooks import Setup

COVERS = (("lru", "float"), ("lru-anchor", "float"))
QUEUE = True
TOUCH = True  # on_access always re-keys


class State(NamedTuple):
    last: NDArray  # batch time of the last read or insert (fill −1)


def build(setup: Setup) -> State:
    return State(setup.column(-1, np.int64))


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return -ps.last[e]


@njit(cache=True)
def on_insert(ps, e, t):  # type: ignore[no-untyped-def]
    ps.last[e] = t


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    ps.last[e] = t
    return True


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.last[e] = -1
