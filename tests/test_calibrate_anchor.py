"""anchor_zone_size by where the sink stops (model/calibrate_anchor.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.model.calibrate_anchor import anchor_size, sink_profile

BT = 4


def _sink(blocks: int, steps: int = 200, sink: float = 0.2, seed: int = 0) -> np.ndarray:
    """Dense weights: the first ``blocks`` blocks draw ``sink`` each, the rest background."""
    rng = np.random.default_rng(seed)
    nb = steps // BT
    w = rng.uniform(0.005, 0.015, (steps, 2, 3, nb))
    w[:, :, :, :blocks] = sink
    for t in range(steps):
        w[t, :, :, t // BT + 1 :] = 0.0
    return w


@pytest.mark.parametrize("blocks", [0, 1, 3])
def test_the_zone_covers_exactly_the_sink_blocks(blocks: int) -> None:
    prof = sink_profile(_sink(blocks), BT, probe=8)
    assert prof["background"] == pytest.approx(0.01, rel=0.05)
    r = anchor_size(prof, BT, ratio=2.0)
    assert r["anchor_zone_size"] == blocks * BT


def test_a_sink_wider_than_the_probe_or_a_short_trace_is_not_sized() -> None:
    r = anchor_size(sink_profile(_sink(8), BT, probe=8), BT)
    assert r["anchor_zone_size"] is None and "probe further" in r["reason"]
    r = anchor_size(sink_profile(_sink(1, steps=24), BT, probe=8), BT)
    assert r["anchor_zone_size"] is None and "too short" in r["reason"]
    with pytest.raises(ValueError, match="ratio = 0"):
        anchor_size(sink_profile(_sink(1), BT), BT, ratio=0)


def test_recent_blocks_are_not_counted_as_sink() -> None:
    # A block draws weight only while it is recent: not a sink.
    w = _sink(0)
    for t in range(w.shape[0]):
        w[t, :, :, t // BT] = 0.5
    prof = sink_profile(w, BT, probe=8)
    assert anchor_size(prof, BT)["anchor_zone_size"] == 0
