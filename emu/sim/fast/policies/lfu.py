"""LFU (firmware/policies/lfu.py): the read count, ties by ``lfu_tie_break``: ``lru`` the
least recently read first (count·span + last read), ``index`` the lower id alone."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.firmware.policies.lfu import _TIME_SPAN

from ..hooks import Setup

COVERS = (("lfu", "float"),)
STATIC = True


class State(NamedTuple):
    count: NDArray  # reads (fill 0)
    last: NDArray  # batch time of the last read (fill 0)
    span: int  # the count's weight in the priority
    minor: int  # the last read's (0: ties to the lower id alone)


def build(setup: Setup) -> State:
    by_time = setup.policy.params.lfu_tie_break == "lru"
    span, minor = (_TIME_SPAN, 1) if by_time else (1, 0)
    return State(setup.column(0, np.int64), setup.column(0, np.int64), span, minor)


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return -(ps.count[e] * ps.span + ps.last[e] * ps.minor)


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    ps.count[e] += 1  # np.add.at: every record
    ps.last[e] = t
    return True


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.count[e] = 0
    ps.last[e] = 0
