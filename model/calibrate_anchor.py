"""anchor_zone_size by where the attention-sink mass stops.

The design (docs/design.md, "Uncalibrated parameters", anchor_zone_size): "Measure where
attention-sink mass actually stops on the target model — the sink is a property of the
trained weights, so this is measurable once per model and then fixed".

For each of the first ``probe`` blocks, its mean weight over the steps where it lies
outside the recent window (at least ``recent_blocks`` blocks behind the query's own
block), over every layer and KV head; beside it, the background: the mean weight of the
other far blocks (past the probed ones) at the same steps.  The sink is the leading run
of blocks whose mean is at least ``ratio`` times the background; the anchor zone covers
it: ``anchor_zone_size = blocks × block_tokens`` (the firmware pins first token < size).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


def sink_profile(
    weights: NDArray, block_tokens: int, probe: int = 16, recent_blocks: int = 4
) -> dict[str, Any]:
    """Mean far weight of each leading block and of the background (dense capture weights,
    (steps, layers, kv_heads, blocks))."""
    S = weights.shape[0]
    per = weights.mean(axis=(1, 2))  # (steps, blocks): mean over layers and heads
    q = np.arange(S) // block_tokens  # the query's own block
    lead_sum = np.zeros(probe)
    lead_n = np.zeros(probe, dtype=np.int64)
    back_sum = 0.0
    back_n = 0
    for t in range(S):
        far = q[t] - recent_blocks  # blocks 0 … far are outside the recent window
        if far < 0:
            continue
        n = min(far + 1, probe)
        lead_sum[:n] += per[t, :n]
        lead_n[:n] += 1
        if far >= probe:
            back_sum += float(per[t, probe : far + 1].sum())
            back_n += int(far + 1 - probe)
    lead = np.where(lead_n > 0, lead_sum / np.maximum(lead_n, 1), np.nan)
    return {
        "block_mean": [None if np.isnan(x) else float(x) for x in lead],
        "steps": lead_n.tolist(),
        "background": back_sum / back_n if back_n else None,  # JSON has no NaN
        "background_samples": back_n,
    }


def anchor_size(profile: dict[str, Any], block_tokens: int, ratio: float = 2.0) -> dict[str, Any]:
    """The leading blocks at or above ``ratio`` × background, and the anchor zone they need."""
    if ratio <= 0:
        raise ValueError(f"ratio = {ratio!r}: must be > 0")
    bg = profile["background"]
    if bg is None or bg <= 0:
        return {"anchor_zone_size": None, "reason": "no background: the trace is too short"}
    n = 0
    for m in profile["block_mean"]:
        if m is None or m < ratio * bg:
            break
        n += 1
    if n == len(profile["block_mean"]):
        return {
            "anchor_zone_size": None,
            "reason": f"every probed block is above {ratio}× background: probe further",
        }
    return {"anchor_zone_size": n * block_tokens, "sink_blocks": n, "ratio": ratio}
