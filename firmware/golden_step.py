"""The integer golden step: one decode step of the Q0.16 contract, composed once.

State in (each entry's Q0.16 score and idle counter), the step's weights and reads in,
the new state, every entry's eviction priority and the pass's victims out:

    touched  = read ∧ weight ≥ touch_q
    score'   = ema_update_q16(score, weight, α)          (the caller gives an unread entry 0)
    idle'    = idle_next(idle, touched)
    priority = eviction_priority_q16(score', idle', decay table, shift)
    victims  = select_victims(eligible ids, priority, k)  (priority ↓, index ↑)

The firmware's integer mode (``EmaPolicy(mode="int")``), the board host's check
(``rtl/host.py``) and every RTL scoreboard (``tb/policy_uvm.py``, ``tb/cocotb_top.py``,
``tests/test_rtl_top.py``) call this module, so they cannot drift apart: a change here
moves all of them together.  The formulas themselves are :mod:`kvcxl.firmware.fixedpoint`'s;
the order is :mod:`kvcxl.firmware.select`'s.  The eviction audit's history
(:mod:`kvcxl.firmware.history`) stays independent of it on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import fixedpoint as fx
from .config import PolicyConfig
from .select import select_victims


@dataclass(frozen=True)
class IntParams:
    """The integer mode's parameters, as the RTL's registers hold them."""

    alpha_q: int
    touch_q: int
    shift: int
    table: NDArray = field(repr=False)

    @classmethod
    def from_config(cls, config: PolicyConfig, touch_q: int | None = None) -> IntParams:
        """``config`` in Q0.16; ``touch_q`` overrides the touch threshold (0: a read alone
        is a touch, as the PolicyEngine top's tests drive it)."""
        return cls(
            alpha_q=fx.alpha_to_q16(config.alpha),
            touch_q=int(fx.to_q16(config.touch_threshold)) if touch_q is None else touch_q,
            shift=config.decay_shift,
            table=np.asarray(fx.decay_table(config.beta, config.decay_shift), dtype=np.int64),
        )


@dataclass(frozen=True)
class StepResult:
    """What one step leaves: the new state, every entry's priority, the pass's victims."""

    score: NDArray
    idle: NDArray
    priority: NDArray
    victims: NDArray

    def pairs(self) -> list[tuple[int, int]]:
        """The victims as (index, priority), in eviction order (what the RTL streams out)."""
        return [(int(i), int(self.priority[i])) for i in self.victims]


def touches(weights: ArrayLike, read: ArrayLike, touch_q: int) -> NDArray:
    """Which entries the step touched: read with a weight ≥ the touch threshold."""
    return np.asarray(read, dtype=bool) & (np.asarray(weights) >= touch_q)


def advance(
    score: ArrayLike, idle: ArrayLike, weights: ArrayLike, touched: ArrayLike, alpha_q: int
) -> tuple[NDArray, NDArray]:
    """The state at the step boundary: (score', idle'); keeps the operands' dtype family."""
    return (
        np.asarray(fx.ema_update_q16(score, weights, alpha_q)),
        np.asarray(fx.idle_next(idle, touched)),
    )


def priorities(score: ArrayLike, idle: ArrayLike, params: IntParams) -> NDArray:
    """Every entry's Q0.16 eviction priority (higher evicts sooner)."""
    return np.asarray(fx.eviction_priority_q16(score, idle, params.table, params.shift))


def victims(priority: NDArray, eligible: ArrayLike, k: int) -> NDArray:
    """The first ``k`` eligible entries by (priority descending, index ascending)."""
    ids = np.flatnonzero(np.asarray(eligible, dtype=bool))
    return select_victims(ids, np.asarray(priority)[ids], k)


def step(
    score: ArrayLike,
    idle: ArrayLike,
    weights: ArrayLike,
    read: ArrayLike,
    eligible: ArrayLike,
    k: int,
    params: IntParams,
) -> StepResult:
    """One whole step: update every entry, rank them, choose up to ``k`` victims."""
    w = np.asarray(weights, dtype=np.int64)
    s, i = advance(
        np.asarray(score, dtype=np.int64),
        np.asarray(idle, dtype=np.int64),
        w,
        touches(w, read, params.touch_q),
        params.alpha_q,
    )
    prio = np.asarray(priorities(s, i, params), dtype=np.int64)
    return StepResult(s.astype(np.int64), i.astype(np.int64), prio, victims(prio, eligible, k))


def evaluate(
    score: ArrayLike,
    idle: ArrayLike,
    weights: ArrayLike,
    read: ArrayLike,
    eligible: ArrayLike,
    k: int,
    params: IntParams,
) -> StepResult:
    """A ranking within the step, nothing written back: the score as stored and the idle
    counter 0 where the step already touched (the RTL's ``hold`` sweep).  The state
    returned is the state given."""
    s = np.asarray(score, dtype=np.int64)
    i = np.asarray(idle, dtype=np.int64)
    touched = touches(weights, read, params.touch_q)
    prio = np.asarray(priorities(s, np.where(touched, 0, i), params), dtype=np.int64)
    return StepResult(s, i, prio, victims(prio, eligible, k))
