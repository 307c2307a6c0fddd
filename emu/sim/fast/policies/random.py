"""Random victims (firmware/policies/random.py): an entry's priority is a hash of (seed,
batch time, id), so it moves with the pass's time (no heap).  SplitMix64 below is compared
bit for bit with the firmware's (tests/test_sim_fast.py)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from kvcxl.firmware.policies import random as fw_random

from ..hooks import Setup

COVERS = (("random", "float"),)
_GOLD, _M1, _M2 = fw_random._GOLD, fw_random._M1, fw_random._M2


@njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """policies.random.splitmix64 (wrapping uint64 arithmetic)."""
    z = x + _GOLD
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def random_base(seed: np.uint64, time: int) -> np.uint64:
    """RandomPolicy.priority's per-call base: splitmix64(seed·GOLD + time)."""
    return splitmix64(seed * _GOLD + np.uint64(time))


@njit(cache=True, inline="always")
def random_priority(base: np.uint64, e: int) -> int:
    """RandomPolicy.priority of entry ``e``: the top 53 bits of splitmix64(id ^ base)."""
    return np.int64(splitmix64(np.uint64(e) ^ base) >> np.uint64(11))


class State(NamedTuple):
    seed: np.uint64


def build(setup: Setup) -> State:
    return State(np.uint64(setup.policy.params.seed))


@njit(cache=True)
def now(ps, t):  # type: ignore[no-untyped-def]
    return random_base(ps.seed, t)  # once per pass, not per entry


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return random_priority(now, e)


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    return False
