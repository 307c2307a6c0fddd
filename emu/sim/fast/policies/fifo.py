"""FIFO (firmware/policies/fifo.py): the insert's batch time, which only grows (QUEUE)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from ..hooks import Setup

COVERS = (("fifo", "float"),)
QUEUE = True


class State(NamedTuple):
    inserted: NDArray  # batch time of the insert (fill −1)


def build(setup: Setup) -> State:
    return State(setup.column(-1, np.int64))


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return -ps.inserted[e]


@njit(cache=True)
def on_insert(ps, e, t):  # type: ignore[no-untyped-def]
    ps.inserted[e] = t


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    return False  # a read does not move it


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.inserted[e] = -1
