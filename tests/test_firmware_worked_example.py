"""The design's worked example (docs/design.md), both as printed there and computed exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvcxl.firmware import ema_update, eviction_priority, recency_decay
from kvcxl.firmware import fixedpoint as fx

ALPHA, BETA = 0.2, 0.001
WEIGHTS = [0.45, 0.12, 0.30, 0.08, 0.35]


def r3(x: float) -> float:
    return round(x + 1e-12, 3)


def test_seed_table_with_3dp_rounding_of_every_intermediate():
    score, seen = 0.0, []
    for w in WEIGHTS:
        score = r3(ema_update(score, w, ALPHA))
        seen.append(score)
    assert seen == [0.090, 0.096, 0.137, 0.126, 0.171]
    decay_a, decay_b = r3(recency_decay(50, BETA)), r3(recency_decay(2000, BETA))
    assert (decay_a, decay_b) == (0.049, 0.865)
    assert r3((1 - 0.171) * decay_a) == 0.041  # token A: kept
    assert r3((1 - 0.08) * decay_b) == 0.796  # token B: evicted


def test_exact_public_api():
    score, seen = 0.0, []
    for w in WEIGHTS:
        score = ema_update(score, w, ALPHA)
        seen.append(score)
    assert seen == pytest.approx([0.09, 0.096, 0.1368, 0.12544, 0.170352], abs=1e-12)
    assert [r3(s) for s in seen] == [0.090, 0.096, 0.137, 0.125, 0.170]
    p_a = eviction_priority(seen[-1], 50, BETA)
    p_b = eviction_priority(0.08, 2000, BETA)
    assert p_a == pytest.approx((1 - 0.170352) * (1 - math.exp(-0.05)), rel=1e-12)
    assert (r3(p_a), r3(p_b)) == (0.040, 0.795)
    assert p_b > p_a  # higher evicts sooner: B goes, A stays


def test_public_api_accepts_arrays():
    s = ema_update(np.zeros(3), np.array([0.45, 0.0, 1.0]), ALPHA)
    assert isinstance(s, np.ndarray) and s.tolist() == pytest.approx([0.09, 0.0, 0.2])
    p = eviction_priority(np.array([0.170352, 0.08]), np.array([50, 2000]), BETA)
    assert p.shape == (2,) and p[1] > p[0]


def test_integer_mode_ema_within_one_lsb():
    a_q = fx.alpha_to_q16(ALPHA)
    s_q, s = 0, 0.0
    for w in WEIGHTS:
        s_q = fx.ema_update_q16(s_q, fx.to_q16(w), a_q)
        s = ema_update(s, w, ALPHA)
        assert abs(s_q - s * fx.Q_ONE) <= 1.0


def test_integer_mode_priorities_within_derived_bound():
    shift = 4
    table = fx.decay_table(BETA, shift)
    bound = fx.priority_error_bound_lsb(BETA, shift, score_error_lsb=1.0)
    for score, idle in ((0.170352, 50), (0.08, 2000)):
        p_int = fx.eviction_priority_q16(fx.to_q16(score), idle, table, shift)
        p = eviction_priority(score, idle, BETA)
        assert abs(p_int - p * fx.Q_ONE) <= bound
    # The decision survives quantisation: B still evicts before A.
    p_a = fx.eviction_priority_q16(fx.to_q16(0.170352), 50, table, shift)
    p_b = fx.eviction_priority_q16(fx.to_q16(0.08), 2000, table, shift)
    assert p_b > p_a
