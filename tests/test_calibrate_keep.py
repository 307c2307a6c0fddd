"""keep by the SLO (model/calibrate_keep.py): the largest keep whose hot set serves the SLO.

The rule is checked on scores whose answer is known by construction, and against a
brute-force search over every candidate keep (a second, plain implementation).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.model.calibrate_keep import hot_set_curve, slo_keep


def _brute(scores, reads, present, slo, weights=None):
    """The largest distinct score value k > 0 whose hot set (score ≥ k) serves ≥ slo."""
    read = present & reads
    m = np.ones(scores.shape) if weights is None else weights
    total = m[read].sum()
    best = None
    for k in np.unique(scores[read]):
        if k > 0 and m[read & (scores >= k)].sum() >= slo * total - 1e-12:
            best = k
    return best


def test_keep_is_the_third_percentile_of_the_read_scores() -> None:
    # 100 reads scoring 0.01 … 1.00: 97 of them score ≥ 0.04, 98 ≥ 0.03.
    scores = (np.arange(1, 101) / 100.0)[None, :]
    reads = np.ones_like(scores, dtype=bool)
    present = np.ones_like(reads)
    r = slo_keep(scores, reads, present, 0.97)
    assert r["keep"] == pytest.approx(0.04)
    assert r["read_hit_rate"] == pytest.approx(0.97)
    assert r["hot_set_fraction"] == pytest.approx(0.97)


def test_unread_entries_grow_the_hot_set_not_the_served_share() -> None:
    # 100 read entries as above plus 100 unread ones scoring 0.5: the same keep, a hot set
    # of 97 + 100 of 200 entries.
    scores = np.concatenate([np.arange(1, 101) / 100.0, np.full(100, 0.5)])[None, :]
    reads = np.concatenate([np.ones(100, bool), np.zeros(100, bool)])[None, :]
    r = slo_keep(scores, reads, np.ones_like(reads), 0.97)
    assert r["keep"] == pytest.approx(0.04)
    assert r["hot_set_fraction"] == pytest.approx(197 / 200)


def test_entries_written_in_the_step_do_not_count() -> None:
    scores = np.array([[0.0, 0.5, 0.6, 0.7]])
    reads = np.ones_like(scores, dtype=bool)
    present = np.array([[False, True, True, True]])  # the score-0 entry was just written
    assert slo_keep(scores, reads, present, 1.0)["keep"] == pytest.approx(0.5)
    assert slo_keep(scores, reads, np.ones_like(present), 1.0)["keep"] is None


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slo", [0.5, 0.9, 0.97, 1.0])
def test_against_a_brute_force_search(seed: int, slo: float) -> None:
    rng = np.random.default_rng(seed)
    scores = np.round(rng.gamma(0.5, 0.05, size=(20, 30)), 3)  # ties on purpose
    scores[rng.random(scores.shape) < 0.01] = 0.0
    reads = rng.random(scores.shape) < 0.3 + scores
    present = rng.random(scores.shape) < 0.9
    weights = rng.random(scores.shape)
    for w in (None, weights):
        got = slo_keep(scores, reads, present, slo, weights=w)["keep"]
        want = _brute(scores, reads, present, slo, w)
        assert (got is None and want is None) or got == pytest.approx(want)


def test_unreachable_slo_and_bad_input() -> None:
    scores = np.array([[0.0, 0.0, 0.3, 0.4]])
    reads = np.ones_like(scores, dtype=bool)
    r = slo_keep(scores, reads, np.ones_like(reads), 0.97)
    assert r["keep"] is None and "exceed" in r["reason"]
    with pytest.raises(ValueError, match="slo = 0"):
        slo_keep(scores, reads, np.ones_like(reads), 0)
    with pytest.raises(ValueError, match="no reads"):
        slo_keep(scores, ~reads, np.ones_like(reads), 0.97)


def test_the_curve_shrinks_as_keep_grows() -> None:
    rng = np.random.default_rng(1)
    scores = rng.random((10, 10))
    rows = hot_set_curve(scores, scores > 0.3, np.ones_like(scores, bool), [0.1, 0.5, 0.9])
    hot = [r["hot_set_fraction"] for r in rows]
    assert hot == sorted(hot, reverse=True) and hot[0] > hot[-1]
