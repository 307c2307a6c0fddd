"""The integer Q0.16 mode: the contract the RTL matches bit for bit (docs/policy.md).

Formats
    weights, scores, α, priorities, decay and rope table values: unsigned Q0.16,
    an integer v in [0, 65535] standing for v / 65536.  1.0 saturates to 65535,
    except α, which is in [1, 65536] so that α = 1 is exact.
    steps_since_access ("idle"): unsigned 16-bit, saturating at 65535.
Rounding
    every product is rounded half up: (x + 32768) >> 16.  Conversions from float
    round half to even (numpy's rint) and saturate.
Tables
    recency decay: 256 entries, DECAY[i] = q16(1 − exp(−β · (i << shift))),
    indexed by min(idle >> shift, 255).  rope: RoPE[k] = q16(1 / (1 + k·block_tokens
    / scale)) for a distance of k blocks.  Both are built here and only here; the
    RTL generator and the testbenches call these functions.
Tie-break
    victims in priority-descending, entry-index-ascending order (see select.py).

The float reference mode is in :mod:`kvcxl.firmware.formulas`;
:func:`ema_error_bound_lsb` and :func:`priority_error_bound_lsb` bound how far
the two modes can drift apart (derived in docs/policy.md).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .formulas import recency_decay

FRAC_BITS = 16
Q_ONE = 1 << FRAC_BITS  # 65536 ≙ 1.0 (representable only for α)
Q_MAX = Q_ONE - 1  # 65535, the largest score / weight / priority
HALF = 1 << (FRAC_BITS - 1)  # rounding constant for >> 16
IDLE_BITS = 16
IDLE_MAX = (1 << IDLE_BITS) - 1
DECAY_TABLE_BITS = 8
DECAY_TABLE_SIZE = 1 << DECAY_TABLE_BITS  # 256


def record_fields(q_bits: int = FRAC_BITS, idle_bits: int = IDLE_BITS) -> dict[str, int]:
    """One entry's policy record as the device stores it: field name -> bits.

    The RTL's record layout (``rtl/layouts.py``) and the device's metadata footprint
    (``emu/serving.py``) are both built from this one list.
    """
    return {
        "score": q_bits,
        "idle": idle_bits,
        "pinned": 1,  # anchor zone: never eligible for eviction
        "resident": 1,  # held in the tier being evicted from (HBM)
    }


def _int_out(x: NDArray) -> int | NDArray:
    return int(x) if np.ndim(x) == 0 else x


def to_q16(x: ArrayLike) -> int | NDArray:
    """A float in [0, 1] to Q0.16, rounded half to even and saturated to [0, 65535]."""
    v = np.clip(np.rint(np.asarray(x, dtype=np.float64) * Q_ONE), 0, Q_MAX).astype(np.int64)
    return _int_out(v)


def from_q16(v: ArrayLike) -> float | NDArray:
    """Q0.16 to float."""
    x = np.asarray(v, dtype=np.float64) / Q_ONE
    return float(x) if x.ndim == 0 else x


def alpha_to_q16(alpha: float) -> int:
    """α in (0, 1] to Q0.16 in [1, 65536]."""
    return int(min(max(round(alpha * Q_ONE), 1), Q_ONE))


def _work(x: ArrayLike) -> NDArray:
    """Operands as uint32 when they are narrow unsigned arrays (every intermediate of the
    contract is < 2³²: 65536·65535 + 32768 < 2³²), else int64."""
    a = np.asarray(x)
    if a.dtype in (np.uint16, np.uint32):
        return a.astype(np.uint32, copy=False)
    return a.astype(np.int64, copy=False)


# The Q0.16 kernels: the contract's arithmetic in plain operators, so that numpy integers,
# Python ints, numba (the fast engine compiles these functions) and Amaranth values (the
# RTL generator builds its datapath by calling them on signals) all take the one definition.


def q16_round(x):  # type: ignore[no-untyped-def]
    """A Q0.32 product (or sum of products) back to Q0.16, rounded half up: (x + 32768) >> 16."""
    return (x + HALF) >> FRAC_BITS


def ema_q16_products(score, weight, alpha_q):  # type: ignore[no-untyped-def]
    """The EMA's two products, α·w and (65536 − α)·score (the RTL registers them apart)."""
    return alpha_q * weight, (Q_ONE - alpha_q) * score


def ema_q16_step(score, weight, alpha_q):  # type: ignore[no-untyped-def]
    """The Q0.16 EMA kernel: (α·w + (65536 − α)·score + 32768) >> 16."""
    p_w, p_s = ema_q16_products(score, weight, alpha_q)
    return q16_round(p_w + p_s)


def priority_q16_step(score, decay):  # type: ignore[no-untyped-def]
    """The Q0.16 priority kernel: ((65535 − score) · decay + 32768) >> 16, decay a table value."""
    return q16_round((Q_MAX - score) * decay)


def blend_q16_step(a, x, b, y):  # type: ignore[no-untyped-def]
    """A Q0.16 blend of two Q0.16 values with weights a + b = 65536: (a·x + b·y + 32768) >> 16."""
    return q16_round(a * x + b * y)


def ema_update_q16(score: ArrayLike, weight: ArrayLike, alpha_q: int) -> int | NDArray:
    """score' = (α·w + (65536 − α)·score + 32768) >> 16 — never exceeds 65535."""
    return _int_out(ema_q16_step(_work(score), _work(weight), alpha_q))


def idle_next(idle: ArrayLike, touched: ArrayLike) -> int | NDArray:
    """The idle counter at a step boundary: 0 if touched in the step, else +1 saturating."""
    i = _work(idle)
    kept = ~np.asarray(touched, dtype=bool)
    return _int_out(np.minimum(i + 1, IDLE_MAX) * kept.astype(i.dtype))


def decay_table(beta: float, shift: int) -> NDArray:
    """The 256-entry recency-decay table for β and index shift (uint16 values as int64)."""
    idle = np.arange(DECAY_TABLE_SIZE, dtype=np.float64) * float(1 << shift)
    return np.asarray(to_q16(recency_decay(idle, beta)), dtype=np.int64)


def decay_index(idle: ArrayLike, shift: int) -> int | NDArray:
    """Table index min(idle >> shift, 255) of a (saturated) idle count."""
    i = np.minimum(_work(idle), IDLE_MAX)
    return _int_out(np.minimum(i >> shift, DECAY_TABLE_SIZE - 1))


def eviction_priority_q16(
    score: ArrayLike, idle: ArrayLike, table: NDArray, shift: int
) -> int | NDArray:
    """priority = ((65535 − score) · DECAY[min(idle >> shift, 255)] + 32768) >> 16."""
    s = _work(score)
    d = np.asarray(table).astype(s.dtype)[np.asarray(decay_index(idle, shift))]
    return _int_out(priority_q16_step(s, d))


def window_blocks(window_tokens: int, block_tokens: int) -> int:
    """The prefetch radius W (tokens) in whole blocks: W // block_tokens."""
    return window_tokens // block_tokens


def rope_table(n_blocks: int, block_tokens: int, scale: float) -> NDArray:
    """RoPE[k] = q16(1 / (1 + k·block_tokens/scale)) for block distances k = 0 … n_blocks."""
    k = np.arange(n_blocks + 1, dtype=np.float64)
    return np.asarray(to_q16(1.0 / (1.0 + k * block_tokens / scale)), dtype=np.int64)


def blend_to_q16(blend: tuple[float, float]) -> tuple[int, int]:
    """Prefetch blend weights in Q0.16, summing to exactly 65536."""
    b_rope = int(min(max(round(blend[0] * Q_ONE), 0), Q_ONE))
    return b_rope, Q_ONE - b_rope


def prefetch_rank_q16(
    distance_blocks: ArrayLike, score: ArrayLike, blend_q: tuple[int, int], table: NDArray
) -> int | NDArray:
    """rank = (b_rope·RoPE[k] + b_score·score + 32768) >> 16."""
    k = np.asarray(distance_blocks, dtype=np.int64)
    rope = np.asarray(table, dtype=np.int64)[k]
    s = np.asarray(score, dtype=np.int64)
    return _int_out(blend_q16_step(blend_q[0], rope, blend_q[1], s))


# --- error bounds between the float and the integer modes (docs/policy.md) -------------


def ema_error_bound_lsb(alpha: float) -> float:
    """Largest |S_int − 65536·s_float| in LSB over any run, weights < 1 − 2⁻¹⁷.

    Each step injects at most ½ (rounding of the product) + α'·½ (weight
    quantisation) + 65536·|α' − α| (α quantisation); the error decays by (1 − α')
    per step, so it accumulates to at most the injection / α'.
    """
    a_q = alpha_to_q16(alpha)
    a = a_q / Q_ONE
    inject = 0.5 + 0.5 * a + abs(a - alpha) * Q_ONE
    return inject / a


def decay_bin_error(beta: float, shift: int) -> float:
    """Largest r(idle) − DECAY_float[index(idle)] over all idle ≥ 0 (table resolution).

    Inside the table the error is largest across one bin:
    r(a + 2^s − 1) − r(a) = e^(−βa)(1 − e^(−β(2^s − 1))) ≤ 1 − e^(−β(2^s − 1)).
    Past the last entry (and past the 16-bit saturation of idle) it is
    r(∞) − r(255·2^s) = e^(−β·255·2^s).
    """
    in_table = float(recency_decay(float((1 << shift) - 1), beta))
    past_end = math.exp(-beta * (DECAY_TABLE_SIZE - 1) * (1 << shift))
    return max(in_table, past_end)


def priority_error_bound_lsb(beta: float, shift: int, score_error_lsb: float) -> float:
    """Largest |P_int − 65536·p_float| in LSB when the scores differ by ``score_error_lsb``.

    With T = 65536·r + τ (|τ| ≤ ½ + 65536·D, D = :func:`decay_bin_error`) and
    65535 − S = 65536(1 − s) − 1 − E_s:
        |P − 65536 p| ≤ ½ + |τ| + (1 + |E_s|) + (1 + |E_s|)·|τ| / 65536.
    """
    tau = 0.5 + Q_ONE * decay_bin_error(beta, shift)
    e = 1.0 + abs(score_error_lsb)
    return 0.5 + tau + e + e * tau / Q_ONE
