"""H2O (firmware/policies/h2o.py): heavy hitters by accumulated attention, the recent
window (age in tokens below ``recent_tokens``) evicted last; sinks pinned by its own
``wants_pin``."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from ..hooks import Setup
from ..kernel import age_tokens

COVERS = (("h2o", "float"),)
BY_AGE = True


class State(NamedTuple):
    acc: NDArray  # accumulated weight (fill 0)
    recent: int


def build(setup: Setup) -> State:
    return State(setup.column(0.0, np.float64), int(setup.policy.params.recent_tokens))


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    if age_tokens(tab, e) < ps.recent:
        return -np.inf
    return -ps.acc[e]


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    ps.acc[e] += w  # np.add.at: every record, in order
    return False


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.acc[e] = 0.0
