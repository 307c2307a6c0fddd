"""The prefetch parameters by precision and recall (model/calibrate_prefetch.py).

The distance curve is checked against a brute-force pair count, the hyperbola fit on a
curve of known scale, the ring rule on known shares, and the blend on two traces built
so that one ranking must win: reads that follow the score (retrieval) and reads that
follow distance while the scores point elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.firmware.config import PolicyConfig
from kvcxl.model import calibrate_prefetch as cp
from kvcxl.model.trajectory import Trajectory, trajectory


def _random_traj(seed: int, steps: int = 14, layers: int = 3, heads: int = 2, bt: int = 2):
    rng = np.random.default_rng(seed)
    nb = -(-steps // bt)
    w = rng.random((steps, layers, heads, nb)) * (rng.random((steps, layers, heads, nb)) < 0.5)
    for t in range(steps):
        w[t, :, :, t // bt + 1 :] = 0.0
    return trajectory(w, 0.2, 0.3, 0.1, bt)


def _brute_curve(tr: Trajectory, th: float, K: int, d: int):
    pairs = np.zeros(K + 1, int)
    hits = np.zeros(K + 1, int)
    L, H, bt = tr.layers, tr.heads, tr.block_tokens
    for t in range(tr.steps):
        nb = (t + bt - 1) // bt
        w = tr.weights[t].reshape(-1, L, H)
        r = tr.reads[t].reshape(-1, L, H)
        for b in range(w.shape[0]):
            for layer in range(L - d):
                for h in range(H):
                    if not (r[b, layer, h] and w[b, layer, h] >= th):
                        continue
                    for b2 in range(nb):
                        k = abs(b2 - b)
                        if k <= K:
                            pairs[k] += 1
                            hits[k] += int(r[b2, layer + d, h])
    return pairs, hits


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("offset", [1, 2])
def test_distance_curve_counts_every_pair(seed: int, offset: int) -> None:
    tr = _random_traj(seed)
    got = cp.distance_curve(tr, 0.3, 5, layer_offset=offset)
    pairs, hits = _brute_curve(tr, 0.3, 5, offset)
    np.testing.assert_array_equal(got["pairs"], pairs)
    np.testing.assert_array_equal(got["hits"], hits)


def test_hyperbola_fit_recovers_a_known_scale() -> None:
    d = np.arange(0, 65) * 16.0
    y = 0.7 / (1 + d / 37.0)
    fit = cp.fit_hyperbola(d, y)
    assert fit["scale"] == pytest.approx(37.0, rel=0.005)
    assert fit["amplitude"] == pytest.approx(0.7, rel=0.005)
    assert fit["r2"] > 0.9999 and not fit["at_grid_edge"]
    # A weighted fit is the fit of the points repeated by their weights (pairs).
    rng = np.random.default_rng(0)
    yn = y + rng.normal(0, 0.05, y.size)
    reps = rng.integers(1, 6, y.size)
    a = cp.fit_hyperbola(d, yn, reps)
    b = cp.fit_hyperbola(np.repeat(d, reps), np.repeat(yn, reps))
    assert a["scale"] == b["scale"] and a["amplitude"] == pytest.approx(b["amplitude"])
    # A point with no pairs does not pull the fit.
    y2 = y.copy()
    y2[10] = 5.0
    w = np.ones_like(y)
    w[10] = 0
    assert cp.fit_hyperbola(d, y2, w)["scale"] == pytest.approx(37.0, rel=0.005)


def test_grow_stops_before_the_first_ring_that_does_not_pay() -> None:
    assert cp.grow(np.array([0.9, 0.8, 0.6, 0.4, 0.7]), 0.5) == 2
    assert cp.grow(np.array([0.4, 0.9]), 0.5) == -1
    assert cp.grow(np.array([0.6, 0.6]), 0.5) == 1


def _two_sets(retrieval: bool, steps: int = 40, layers: int = 2) -> np.ndarray:
    """bt = 1.  Retrieval: from step 24 even layers read A = {20, 21, 22} (their touches
    are the sources) and odd layers read B = {2, 5, 8}, far from A, whose scores are high.
    Otherwise odd layers read C = {2, 5, 8} heavily until step 30 (a score that goes
    stale) and from step 30, when even layers start reading A, read A and its neighbours
    {19 … 23}: rope reaches them first, the score points at C."""
    w = np.zeros((steps, layers, 1, steps))
    for t in range(24 if retrieval else 0, steps):
        for layer in range(layers):
            if layer % 2 == 0:
                if retrieval or t >= 30:
                    w[t, layer, 0, [20, 21, 22]] = 0.3
            elif retrieval:
                w[t, layer, 0, [2, 5, 8]] = 0.3
            elif t < 30:
                w[t, layer, 0, [2, 5, 8]] = 1.0
            else:
                w[t, layer, 0, 19:24] = 0.3
    return w


def test_blend_follows_the_score_on_retrieval_reads() -> None:
    tr = trajectory(_two_sets(True), 0.2, 0.01, 0.01, 1)
    base = PolicyConfig(prefetch_window=64, prefetch_depth=1, prefetch_distance_scale=10.0)
    score = cp.evaluate(tr, base.with_(prefetch_blend=[0.0, 1.0]), limit=3)
    rope = cp.evaluate(tr, base.with_(prefetch_blend=[1.0, 0.0]), limit=3)
    assert score["precision"] > 0.9 and rope["precision"] < 0.1
    assert score["recall"] > rope["recall"]


def test_blend_follows_distance_when_the_score_is_stale() -> None:
    tr = trajectory(_two_sets(False), 0.01, 0.01, 0.01, 1)  # α small: C's score stays high
    base = PolicyConfig(prefetch_window=64, prefetch_depth=1, prefetch_distance_scale=1.0)
    score = cp.evaluate(tr, base.with_(prefetch_blend=[0.0, 1.0]), limit=4)
    rope = cp.evaluate(tr, base.with_(prefetch_blend=[1.0, 0.0]), limit=4)
    assert rope["precision"] == 1.0 and score["precision"] <= 0.25


def test_depth_zero_fetches_nothing_and_reads_still_count() -> None:
    tr = trajectory(_two_sets(True), 0.2, 0.01, 0.01, 1)
    r = cp.evaluate(tr, PolicyConfig(prefetch_depth=0), limit=8)
    assert r["fetched"] == 0 and r["reads"] > 0 and r["recall"] == 0.0


def test_blend_sweep_picks_the_score_on_retrieval_reads() -> None:
    tr = trajectory(_two_sets(True), 0.2, 0.01, 0.01, 1)
    cfg = PolicyConfig(prefetch_window=64, prefetch_depth=1, prefetch_distance_scale=10.0)
    rows, blend = cp.blend_sweep([tr], cfg, 3, (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), 0.6)
    assert blend[0] <= 0.2  # score-led blends fetch B, rope-led ones A's rings
    assert max(r["precision"] for r in rows) > 0.9  # all but the first step (scores still 0)


def test_a_window_does_not_pay_for_retrieval_reads() -> None:
    # The design: "retrieval heads are poorly served by a distance window at any W".
    tr = trajectory(_two_sets(True), 0.2, 0.01, 0.01, 1)
    r = cp.calibrate_prefetch([tr], PolicyConfig(), limit=3, breakeven=0.5, max_blocks=24)
    assert r["fitted"]["prefetch_window"] == 0 and r["fitted"]["prefetch_depth"] == 0
    assert r["curve"]["read_share"][0] == 0.0  # the touched block's own neighbour is never read
    with pytest.raises(ValueError, match="breakeven = 0"):
        cp.calibrate_prefetch([tr], PolicyConfig(), limit=3, breakeven=0)


def test_a_window_pays_for_local_reads() -> None:
    tr = trajectory(_two_sets(False), 0.01, 0.01, 0.01, 1)
    r = cp.calibrate_prefetch([tr], PolicyConfig(), limit=4, breakeven=0.5, max_blocks=8)
    # Layer 1 reads A and its neighbours, 19 … 23, around A = {20, 21, 22}: distances 0 and 1
    # are read, distance 2 is half read (from 21: 19 and 23; from 20: 22 and 18), 3 is not.
    assert r["fitted"]["prefetch_depth"] == 1
    assert r["fitted"]["prefetch_window"] in (1, 2)
    assert r["fitted_eval"]["precision"] >= r["seed_eval"]["precision"]
