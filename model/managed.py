"""The keep/evict pair replayed under managed tiers: what the thresholds decide on real traces.

Stage 2 of :mod:`.calibrate` reads the thresholds off the EMA's score trajectories
(an Analytical model of threshold placement: which entries *would* be hot or cold).
With managed tiers (docs/policy.md, "Tiers below HBM") the thresholds decide residency
in the firmware session itself, so this replays each capture through the session
(:class:`~kvcxl.firmware.session.FirmwareSession`, the ``ema`` policy, threshold
placement, ``tier_management = "managed"``) at every (keep, evict) pair and counts
where each read was served from: HBM, CXL DRAM or NVMe (Simulated).  The effective
access latency weights those counts with :class:`~kvcxl.emu.timing.TierTiming`'s
per-access cost of one entry (an Analytical model on Simulated counts).

The read set and the one-step-per-position order are those of
:func:`.calibrate.replay_hit_rate`; CXL DRAM has room for everything (NVMe is reached
only by the step boundary's demotions), so what sinks is the evict threshold's doing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.emu.timing import TierTiming
from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM, TIER_NVME

from .positions import position_steps, session_for


def replay_tiers(
    weights: NDArray,
    config: Any,
    budget_tokens: int,
    block_tokens: int,
    read_threshold: float,
    entry_bytes: int,
    timing: TierTiming | None = None,
    *,
    audit: bool = True,
) -> dict[str, float]:
    """Reads served by each tier when the EMA replays dense capture ``weights`` with
    ``config``'s tier rules (placement by the policy); shares of all reads."""
    fw = session_for(
        weights, "ema", config, budget_tokens, block_tokens, audit=audit, placement="policy"
    )
    served = {TIER_HBM: 0, TIER_CXL: 0, TIER_NVME: 0}
    held = 0.0  # share of HBM's entries at or above keep, summed over steps
    steps = 0
    for s, ids, w in position_steps(fw, weights, block_tokens, read_threshold):
        before = fw.lower.where(ids)  # where a miss is served from, before it moves up
        hit, _ = fw.read(s, ids, w)
        served[TIER_HBM] += int(hit.sum())
        for t in (TIER_CXL, TIER_NVME):
            served[t] += int(np.count_nonzero(~hit & (before == t)))
        res = np.flatnonzero(fw.resident())
        if res.size:
            held += float(np.mean(fw.policy.score(res) >= config.keep_threshold))
        steps += 1
    au = fw.audit
    if au is not None and au.faults:
        raise RuntimeError(f"eviction audit failed under managed tiers: {au.as_dict()}")
    reads = sum(served.values())
    if reads != fw.cache.stats.hits + fw.cache.stats.misses:
        raise RuntimeError("a miss was served from no lower tier: the tier books disagree")
    tm = timing or TierTiming()
    lat = sum(n * tm.access_ns(t, entry_bytes) for t, n in served.items())
    share = {t: n / reads if reads else 0.0 for t, n in served.items()}
    return {
        "hit_rate": share[TIER_HBM],
        "cxl_read_fraction": share[TIER_CXL],
        "nvme_read_fraction": share[TIER_NVME],
        "held_fraction": held / steps if steps else 0.0,
        "effective_latency_ns": lat / reads if reads else 0.0,
        "reads": reads,
        "audited_victims": au.checked if au else 0,
    }


def managed_sweep(
    dense: Sequence[NDArray],
    config: Any,
    keeps: Sequence[float],
    evicts: Sequence[float],
    budget_tokens: int,
    block_tokens: int,
    read_threshold: float,
    entry_bytes: int,
) -> dict[str, Any]:
    """Every (keep, evict) pair with keep > evict, each replayed on every trace under
    managed tiers; per pair the per-trace rows (keys of :func:`replay_tiers`)."""
    base = config.with_(tier_management="managed", placement_mode="thresholds")
    rows = []
    for k in keeps:
        for e in evicts:
            if not k > e:  # keep_threshold must exceed evict_threshold (PolicyConfig)
                continue
            cfg = base.with_(keep_threshold=k, evict_threshold=e)
            per = [
                replay_tiers(d, cfg, budget_tokens, block_tokens, read_threshold, entry_bytes)
                for d in dense
            ]
            rows.append({"keep": k, "evict": e, "per_trace": per})
    best = min(rows, key=lambda r: np.mean([p["effective_latency_ns"] for p in r["per_trace"]]))
    return {
        "evidence": "Simulated (tier counts); Analytical model (latency: TierTiming defaults)",
        "alpha": config.alpha,
        "beta": config.beta,
        "background_moves": config.background_moves,
        "rows": rows,
        "best_by_latency": {"keep": best["keep"], "evict": best["evict"]},
    }
