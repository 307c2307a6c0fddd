"""The Q0.16 contract: saturation, rounding, tables, and the float ⇄ integer error bounds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.formulas import ema_update, eviction_priority, prefetch_rank


def test_ema_never_overflows_16_bits():
    for a in (1, 13107, 65535, 65536):
        assert fx.ema_update_q16(fx.Q_MAX, fx.Q_MAX, a) == fx.Q_MAX
        assert fx.ema_update_q16(0, 0, a) == 0


def test_alpha_one_is_exact():
    assert fx.alpha_to_q16(1.0) == fx.Q_ONE
    assert fx.ema_update_q16(12345, 777, fx.Q_ONE) == 777


def test_idle_counter_saturates_and_resets():
    idle = np.array([0, 5, fx.IDLE_MAX - 1, fx.IDLE_MAX])
    assert fx.idle_next(idle, [False] * 4).tolist() == [1, 6, fx.IDLE_MAX, fx.IDLE_MAX]
    assert fx.idle_next(idle, [True, False, True, False]).tolist() == [0, 6, 0, fx.IDLE_MAX]


def test_decay_table_shape_and_monotone():
    t = fx.decay_table(0.001, 4)
    assert t.shape == (256,) and t[0] == 0
    assert np.all(np.diff(t) >= 0) and t.max() <= fx.Q_MAX
    assert fx.decay_index(fx.IDLE_MAX + 10**6, 4) == 255  # saturated idle hits the last entry


def test_rope_table_and_blend():
    t = fx.rope_table(8, 16, 100.0)
    assert t[0] == fx.Q_MAX and np.all(np.diff(t) < 0)
    assert sum(fx.blend_to_q16((0.6, 0.4))) == fx.Q_ONE
    assert fx.prefetch_rank_q16(0, fx.Q_MAX, fx.blend_to_q16((0.6, 0.4)), t) == fx.Q_MAX


@settings(max_examples=200, deadline=None)
@given(
    alpha=st.floats(0.01, 1.0),
    weights=st.lists(st.floats(0.0, 0.999), min_size=1, max_size=200),
)
def test_ema_error_within_bound(alpha, weights):
    bound = fx.ema_error_bound_lsb(alpha)
    a_q = fx.alpha_to_q16(alpha)
    s_q, s = 0, 0.0
    for w in weights:
        s_q = fx.ema_update_q16(s_q, fx.to_q16(w), a_q)
        s = ema_update(s, w, alpha)
        assert abs(s_q - s * fx.Q_ONE) <= bound + 1e-9


@settings(max_examples=200, deadline=None)
@given(
    beta=st.floats(1e-5, 0.05),
    shift=st.integers(0, 8),
    score=st.floats(0.0, 0.999),
    idle=st.integers(0, 200_000),
)
def test_priority_error_within_bound(beta, shift, score, idle):
    table = fx.decay_table(beta, shift)
    s_q = fx.to_q16(score)
    p_int = fx.eviction_priority_q16(s_q, min(idle, fx.IDLE_MAX), table, shift)
    p = eviction_priority(score, idle, beta)
    # to_q16 rounds the score by at most half an LSB.
    assert abs(p_int - p * fx.Q_ONE) <= fx.priority_error_bound_lsb(beta, shift, 0.5) + 1e-9


def test_priority_bound_is_not_vacuous():
    # The bound must be of the order of the table resolution, not of the full range.
    b = fx.priority_error_bound_lsb(0.001, 4, 1.0)
    assert b < 0.02 * fx.Q_ONE
    # and it is nearly reached: some idle value errs by more than half of it.
    table = fx.decay_table(0.001, 4)
    idle = np.arange(0, 70_000)
    p_int = fx.eviction_priority_q16(0, np.minimum(idle, fx.IDLE_MAX), table, 4)
    err = np.abs(p_int - eviction_priority(0.0, idle, 0.001) * fx.Q_ONE)
    assert err.max() > 0.5 * b


def test_prefetch_rank_integer_close_to_float():
    t = fx.rope_table(8, 16, 100.0)
    bq = fx.blend_to_q16((0.6, 0.4))
    for k in range(9):
        for s in (0.0, 0.3, 0.999):
            r_int = fx.prefetch_rank_q16(k, fx.to_q16(s), bq, t)
            r = prefetch_rank(k * 16, s, (0.6, 0.4), 100.0)
            assert abs(r_int - r * fx.Q_ONE) <= 2.0
