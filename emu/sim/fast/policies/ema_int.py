"""The seed's EMA in integer mode: the Q0.16 contract the RTL matches (firmware/policies/
ema.py, firmware/fixedpoint.py).  Weights arrive as Q0.16 (``fixedpoint.to_q16`` of the
plan's), the decay as ``fixedpoint.decay_table``.  The two formulas below are compared bit
for bit with the firmware's over every Q0.16 value (tests/test_sim_fast.py)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx

from ..formulas import ema_q16, priority_q16_of_decay
from ..hooks import Setup

COVERS = (("ema", "int"),)
STATIC = True  # a key moves by a touch or at a step's end (the heap is rebuilt)
# the contract's constants, as numba constants
Q_ONE, IDLE_MAX = fx.Q_ONE, fx.IDLE_MAX
LAST = fx.DECAY_TABLE_SIZE - 1


@njit(cache=True, inline="always")
def priority_q16(s: int, idle: int, table: np.ndarray, shift: int) -> int:
    """fixedpoint.eviction_priority_q16: the table index of fixedpoint.decay_index, then
    the firmware's kernel."""
    i = min(idle, IDLE_MAX) >> shift
    return priority_q16_of_decay(s, table[min(i, LAST)])


class State(NamedTuple):
    score: NDArray  # Q0.16 (int64), fill 0
    w_step: NDArray  # the step's largest Q0.16 weight
    idle: NDArray  # 16-bit saturating
    touched: NDArray
    wq: NDArray  # each plan record's weight in Q0.16
    table: NDArray  # the decay table
    shift: int
    alpha_q: int
    touch_q: int


def build(setup: Setup) -> State:
    cfg = setup.config
    w = setup.plan["w"]  # (the loop's weights: float32 or float64)
    return State(
        setup.column(0, np.int64), setup.column(0, np.int64), setup.column(0, np.int64),
        setup.column(False, np.bool_), np.asarray(fx.to_q16(w), np.int64),
        np.asarray(fx.decay_table(cfg.beta, cfg.decay_shift), np.int64), int(cfg.decay_shift),
        int(fx.alpha_to_q16(cfg.alpha)), int(fx.to_q16(cfg.touch_threshold)),
    )  # fmt: skip


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return priority_q16(ps.score[e], ps.idle[e], ps.table, ps.shift)


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    wq = ps.wq[j]
    if wq > ps.w_step[e]:
        ps.w_step[e] = wq
    touch = wq >= ps.touch_q
    if touch:
        ps.touched[e] = True
        ps.idle[e] = 0
    return touch


@njit(cache=True)
def end_step(ps, n):  # type: ignore[no-untyped-def]
    for e in range(n):
        ps.score[e] = ema_q16(ps.score[e], ps.w_step[e], ps.alpha_q)
        ps.idle[e] = 0 if ps.touched[e] else min(ps.idle[e] + 1, IDLE_MAX)
        ps.w_step[e] = 0
        ps.touched[e] = False


@njit(cache=True)
def score(ps, e):  # type: ignore[no-untyped-def]
    return ps.score[e] / float(Q_ONE)  # fixedpoint.from_q16


@njit(cache=True)
def score_q16(ps, e):  # type: ignore[no-untyped-def]
    return ps.score[e]  # (already Q0.16: EmaPolicy.score_q16 in integer mode)


@njit(cache=True)
def idle_steps(ps, e):  # type: ignore[no-untyped-def]
    return ps.idle[e]


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.score[e] = 0
    ps.w_step[e] = 0
    ps.idle[e] = 0
    ps.touched[e] = False
