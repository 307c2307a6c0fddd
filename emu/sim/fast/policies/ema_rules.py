"""The seed's EMA in float mode with its own rules moved off their defaults
(firmware/policies/ema.py: ``ema_tie_break``, ``ema_touch_resets_idle``).  ``ema``'s module
hands a run here (its ``variant``) when either is not the default, so the seed's replay
keeps its heap; this one chooses its victims itself (``select``): every entry above the
k-th smallest key goes, those at it are ranked by (tie key, id), as the firmware's
``select_victims`` with the policy's ``tie``.  It covers no pair of its own."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from ..hooks import Setup
from ..kernel import float_key, key_of
from .ema import build as build_ema
from .ema import end_step, idle_steps, priority, score  # (the seed's, on this state)

COVERS: tuple = ()
STATIC = True
__all__ = ["COVERS", "STATIC", "build", "end_step", "forget", "idle_steps", "on_access",
           "on_insert", "priority", "score", "select"]  # fmt: skip
TIES = {"id": 0, "last-touch": 1, "score": 2, "age": 3}


class State(NamedTuple):
    score: NDArray
    w_step: NDArray
    idle: NDArray
    touched: NDArray
    decay: NDArray
    alpha: float
    touch: float
    touch_t: NDArray  # batch time of the last touch (fill −1)
    admit_t: NDArray  # batch time of the last admission (fill 0)
    tie: int  # TIES[ema_tie_break]
    resets: bool  # ema_touch_resets_idle


def build(setup: Setup) -> State:
    p = setup.policy
    return State(
        *build_ema(setup), setup.column(-1, np.int64), setup.column(0, np.int64),
        TIES[p.tie_break], bool(p.resets_idle),  # type: ignore[attr-defined]
    )  # fmt: skip


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    if w > ps.w_step[e]:
        ps.w_step[e] = w
    touch = w >= ps.touch
    if touch:
        ps.touch_t[e] = t
        if ps.resets:
            ps.touched[e] = True
            ps.idle[e] = 0
    return touch


@njit(cache=True)
def on_insert(ps, e, t):  # type: ignore[no-untyped-def]
    ps.admit_t[e] = t
    if not ps.resets:  # an admission zeroes idle, as a touch does otherwise
        ps.touched[e] = True
        ps.idle[e] = 0


@njit(cache=True)
def tie_of(ps, e):  # type: ignore[no-untyped-def]
    """The firmware's ``EmaPolicy.tie`` as an int64 in the same order."""
    if ps.tie == 1:
        return ps.touch_t[e]
    if ps.tie == 2:
        return float_key(ps.score[e])
    if ps.tie == 3:
        return ps.admit_t[e]
    return 0


@njit(cache=True)
def select(ps, tab, cand, m, k, now, out):  # type: ignore[no-untyped-def]
    if k <= 0 or m == 0:
        return 0
    keys = np.empty(m, np.int64)
    for j in range(m):
        keys[j] = key_of(priority(ps, tab, cand[j], now))
    kth = np.max(keys) if k >= m else np.partition(keys.copy(), k - 1)[k - 1]
    near = np.flatnonzero(keys <= kth)  # above the k-th priority, or at it
    c = near.size
    ids = np.empty(c, np.int64)
    ties = np.empty(c, np.int64)
    nk = np.empty(c, np.int64)
    for j in range(c):
        e = cand[near[j]]
        ids[j] = e
        ties[j] = tie_of(ps, e)
        nk[j] = keys[near[j]]
    order = np.argsort(ids)  # then stable by tie, then stable by key: (key, tie, id)
    order = order[np.argsort(ties[order], kind="mergesort")]
    order = order[np.argsort(nk[order], kind="mergesort")]
    got = min(k, c)
    for j in range(got):
        out[j] = ids[order[j]]
    return got


@njit(cache=True)
def forget(ps, e):  # type: ignore[no-untyped-def]
    ps.score[e] = 0.0
    ps.w_step[e] = 0.0
    ps.idle[e] = 0
    ps.touched[e] = False
    ps.touch_t[e] = -1
    ps.admit_t[e] = 0
