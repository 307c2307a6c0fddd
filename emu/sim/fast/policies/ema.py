"""The seed's EMA in float mode (firmware/policies/ema.py): reads keep each entry's largest
weight of the step and a touch resets its idle count; at the step's end every described
entry's score takes the EMA step.  Priority ``(1 − score)·r`` with ``r`` from a table of
``formulas.recency_decay`` over every idle count the replay can reach.  The two formulas
below are compared bit for bit with the firmware's (tests/test_sim_fast.py).  A run with the
EMA's own rules off their defaults goes to :mod:`.ema_rules` (``variant``)."""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.firmware.formulas import recency_decay

from ..formulas import ema_float, priority_float
from ..hooks import Setup

COVERS = (("ema", "float"),)
STATIC = True  # a key moves by a touch or at a step's end (the heap is rebuilt)


class State(NamedTuple):
    score: NDArray  # float64, fill 0
    w_step: NDArray  # the step's largest weight (the stream's float32, or float64)
    idle: NDArray  # steps since the last touch (int32)
    touched: NDArray
    decay: NDArray  # recency_decay of every reachable idle count
    alpha: float
    touch: float


def build(setup: Setup) -> State:
    cfg = setup.config
    n_steps = int(np.count_nonzero(np.diff(setup.plan["step"]))) + 2  # one per step boundary
    decay = np.asarray(recency_decay(np.arange(n_steps, dtype=np.int64), cfg.beta), np.float64)
    # The step's largest weight in the loop's weights' dtype (float32 widens exactly where
    # the EMA step reads it); idle counts stay below the steps (int32).
    return State(
        setup.column(0.0, np.float64), setup.column(0.0, setup.plan["w"].dtype),
        setup.column(0, np.int32), setup.column(False, np.bool_), decay,
        float(cfg.alpha), float(cfg.touch_threshold),
    )  # fmt: skip


def variant(policy):  # type: ignore[no-untyped-def]
    """The module that replays this policy's rules: this one for the seed's (the id
    tie-break, a touch zeroes idle), else :mod:`.ema_rules`."""
    if (policy.tie_break, policy.resets_idle) == ("id", True):
        return sys.modules[__name__]
    from . import ema_rules

    return ema_rules


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return priority_float(ps.score[e], ps.decay[ps.idle[e]])


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if w > ps.w_step[e]:  # (float32 weights widen exactly)
        ps.w_step[e] = w
    touch = w >= ps.touch
    if touch:
        ps.touched[e] = True
        ps.idle[e] = 0
    return touch


@njit(cache=True)
def end_step(ps, n):  # type: ignore[no-untyped-def]
    for e in range(n):
        ps.score[e] = ema_float(ps.score[e], ps.w_step[e], ps.alpha)
        ps.idle[e] = 0 if ps.touched[e] else ps.idle[e] + 1
        ps.w_step[e] = 0.0
        ps.touched[e] = False


@njit(cache=True)
def score(ps, e):  # type: ignore[no-untyped-def]
    return ps.score[e]


@njit(cache=True)
def idle_steps(ps, e):  # type: ignore[no-untyped-def]
    return ps.idle[e]


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.score[e] = 0.0
    ps.w_step[e] = 0.0
    ps.idle[e] = 0
    ps.touched[e] = False
