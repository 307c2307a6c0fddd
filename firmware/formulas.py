"""The policy's formulas in float reference mode (docs/policy.md). Each is defined here once.

The integer Q0.16 counterparts that the RTL matches bit for bit are in
:mod:`kvcxl.firmware.fixedpoint`, beside the error bounds that relate the two.
All functions accept Python floats or numpy arrays.  The ``*_step`` kernels are the
formulas themselves, in the plain arithmetic that numpy, a Python float and numba all
run: the fast engine compiles these same functions (``njit(formulas.ema_step)``), so
no second copy exists to drift (tests/test_one_definition.py).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

# Tier codes shared by placement, the simulator and the device.
TIER_HBM_PINNED = 0
TIER_HBM = 1
TIER_CXL = 2
TIER_NVME = 3
TIER_NAMES = ("hbm-pinned", "hbm", "cxl", "nvme")


def _out(x: NDArray) -> float | NDArray:
    return float(x) if np.ndim(x) == 0 else x


def ema_step(score, weight, alpha):  # type: ignore[no-untyped-def]  (numba compiles it)
    """The EMA kernel: α·w + (1 − α)·score (floats or arrays; numba-compilable)."""
    return alpha * weight + (1.0 - alpha) * score


def priority_step(score, decay):  # type: ignore[no-untyped-def]  (numba compiles it)
    """The eviction-priority kernel: (1 − score) · r, given r = recency_decay(idle)."""
    return (1.0 - score) * decay


def blend_step(a, x, b, y):  # type: ignore[no-untyped-def]  (numba compiles it)
    """A two-term blend a·x + b·y (the prefetch rank: b_rope·rope + b_score·score)."""
    return a * x + b * y


def ema_update(
    score: ArrayLike, weight: ArrayLike, alpha: float, out: NDArray | None = None
) -> float | NDArray:
    """score[t] = α·w[t] + (1 − α)·score[t−1]; an entry not read in a step has w = 0.

    ``out`` (a float64 array, usually ``score`` itself): the result is written there.
    """
    s = np.asarray(score, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    if out is not None:
        out[...] = ema_step(s, w, alpha)
        return out
    return _out(ema_step(s, w, alpha))


def ema_decay(score: ArrayLike, steps: ArrayLike, alpha: float) -> float | NDArray:
    """``steps`` zero-weight EMA steps at once: score · (1 − α)^steps (the closed form of
    ``ema_step(score, 0, α)`` applied ``steps`` times; rounding may differ in the last bits)."""
    s = np.asarray(score, dtype=np.float64)
    return _out(s * (1.0 - alpha) ** np.maximum(np.asarray(steps), 0))


_LOOKUP_MIN_SIZE = 1 << 14  # integer idle arrays at least this large use a lookup
_LOOKUP_MAX_IDLE = 1 << 22


def recency_decay(steps_since_access: ArrayLike, beta: float) -> float | NDArray:
    """r = 1 − exp(−β · steps_since_access): 0 when just touched, → 1 when long idle."""
    raw = np.asarray(steps_since_access)
    if raw.dtype.kind in "iu" and raw.size >= _LOOKUP_MIN_SIZE:
        top = int(raw.max()) if raw.size else 0
        if 0 <= int(raw.min()) and top < _LOOKUP_MAX_IDLE:
            # Idle counts are small integers: evaluate expm1 once per distinct value and
            # gather (bit-identical to the element-wise form, an order of magnitude faster).
            table = -np.expm1(-beta * np.arange(top + 1, dtype=np.float64))
            return table[raw]
    idle = raw.astype(np.float64)
    return _out(-np.expm1(-beta * idle))


def eviction_priority(
    score: ArrayLike, steps_since_access: ArrayLike, beta: float
) -> float | NDArray:
    """p = (1 − score) · r. Higher evicts sooner."""
    s = np.asarray(score, dtype=np.float64)
    return _out(priority_step(s, np.asarray(recency_decay(steps_since_access, beta))))


def placement_thresholds(score: ArrayLike, keep: float, evict: float) -> int | NDArray:
    """Threshold placement: score ≥ keep → HBM, score < evict → NVMe, else CXL DRAM."""
    s = np.asarray(score, dtype=np.float64)
    tier = np.where(s >= keep, TIER_HBM, np.where(s < evict, TIER_NVME, TIER_CXL))
    return int(tier) if tier.ndim == 0 else tier.astype(np.uint8)


def placement_value(
    score: ArrayLike,
    steps_since_access: ArrayLike,
    anchor: ArrayLike,
    beta: float,
    weights: tuple[float, float, float],
) -> float | NDArray:
    """Weighted placement value P = wR·R + wE·E + wN·N with R = 1 − r, E = score, N = anchor."""
    w_r, w_e, w_n = weights
    recency = 1.0 - np.asarray(recency_decay(steps_since_access, beta))
    e = np.asarray(score, dtype=np.float64)
    n = np.asarray(anchor, dtype=np.float64)
    return _out(w_r * recency + w_e * e + w_n * n)


def placement_weighted(
    score: ArrayLike,
    steps_since_access: ArrayLike,
    anchor: ArrayLike,
    beta: float,
    weights: tuple[float, float, float],
    cuts: tuple[float, float],
) -> int | NDArray:
    """Weighted placement: P < low → CXL DRAM, low ≤ P < high → HBM, P ≥ high → pinned HBM."""
    p = np.asarray(placement_value(score, steps_since_access, anchor, beta, weights))
    low, high = cuts
    tier = np.where(p >= high, TIER_HBM_PINNED, np.where(p >= low, TIER_HBM, TIER_CXL))
    return int(tier) if tier.ndim == 0 else tier.astype(np.uint8)


def rope_factor(distance_tokens: ArrayLike, scale: float) -> float | NDArray:
    """RoPE locality term 1 / (1 + distance / scale): 1 at the touched block, ½ at `scale`."""
    d = np.asarray(distance_tokens, dtype=np.float64)
    return _out(1.0 / (1.0 + d / scale))


def prefetch_rank(
    distance_tokens: ArrayLike, score: ArrayLike, blend: tuple[float, float], scale: float
) -> float | NDArray:
    """Prefetch candidate rank = b_rope · rope + b_score · score (higher is fetched first)."""
    b_rope, b_score = blend
    rope = np.asarray(rope_factor(distance_tokens, scale))
    return _out(blend_step(b_rope, rope, b_score, np.asarray(score, dtype=np.float64)))
