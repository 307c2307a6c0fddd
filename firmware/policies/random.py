"""Random eviction, seeded and reproducible.

The random key of an entry is a hash of (seed, batch time, entry id), so the
audit can recompute it and two runs with one seed evict the same entries.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..policy_params import SEED
from .base import Policy, Tick, register

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: NDArray) -> NDArray:
    """The SplitMix64 finaliser, vectorised (wrapping uint64 arithmetic)."""
    z = np.asarray(x, dtype=np.uint64) + _GOLD
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@register
class RandomPolicy(Policy):
    name = "random"
    not_audited = "its key is a random draw per entry: an input, not history"
    summary = "uniformly random victims (seeded)"
    parameters = {"seed": SEED}

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        with np.errstate(over="ignore"):
            base = splitmix64(np.uint64(self.params.seed) * _GOLD + np.uint64(tick.time))
            key = splitmix64(np.asarray(ids, dtype=np.uint64) ^ base)
        return (key >> np.uint64(11)).astype(np.int64)  # 53 bits: exact as int64
