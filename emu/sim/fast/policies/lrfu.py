"""LRFU (firmware/policies/lrfu.py): log2 of the CRF at the last read, decayed by
``lrfu_lambda`` per batch since.  Its update is numpy's ``logaddexp2`` (below, compared bit
for bit in tests/test_sim_fast.py), applied once per entry and batch (ONCE)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from ..hooks import Setup

COVERS = (("lrfu", "float"),)
ONCE = True
LOG2E = 1.4426950408889634074  # numpy's NPY_LOG2E


@njit(cache=True, inline="always")
def logaddexp2(x: float, y: float) -> float:
    """numpy's logaddexp2 (npy_logaddexp2: log2(2^x + 2^y) without overflow)."""
    if x == y:
        return x + 1.0
    tmp = x - y
    if tmp > 0:
        return x + LOG2E * math.log1p(2.0 ** (-tmp))
    if tmp <= 0:
        return y + LOG2E * math.log1p(2.0**tmp)
    return tmp


class State(NamedTuple):
    log_crf: NDArray  # fill −inf
    last: NDArray  # batch time of the last read (fill 0)
    lam: float


def build(setup: Setup) -> State:
    return State(
        setup.column(-np.inf, np.float64), setup.column(0, np.int64),
        float(setup.policy.params.lrfu_lambda),
    )  # fmt: skip


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return -(ps.log_crf[e] - ps.lam * (now - ps.last[e]))


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    ps.log_crf[e] = logaddexp2(ps.log_crf[e] - ps.lam * (t - ps.last[e]), 0.0)
    ps.last[e] = t
    return True


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.log_crf[e] = -np.inf
    ps.last[e] = 0
