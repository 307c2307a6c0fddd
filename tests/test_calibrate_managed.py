"""The keep/evict replay under managed tiers (model/managed.py).

Where each read was served from is checked against a second book kept here from the
decisions the session hands back (victims and their tiers, the step boundary's moves,
admissions), not from the session's own tier array that the module reads.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.formulas import TIER_CXL, TIER_HBM, TIER_NVME
from kvcxl.firmware.session import FirmwareSession
from kvcxl.model.managed import managed_sweep, replay_tiers

BT, BUDGET, THR, EB = 4, 8, 0.01, 4096


def _weights(seed: int = 0, steps: int = 48, layers: int = 2, heads: int = 2) -> np.ndarray:
    """(steps, layers, heads, blocks) dense weights: a few hot blocks and a decaying tail."""
    rng = np.random.default_rng(seed)
    nb = steps // BT
    w = rng.gamma(0.3, 0.02, size=(steps, layers, heads, nb))
    w[:, :, :, 0] += 0.2  # a sink
    for s in range(steps):
        w[s, :, :, s // BT] += 0.3  # the recent block
        w[s, :, :, (s // BT) + 1 :] = 0.0  # not yet written
    return w


def _books(weights: np.ndarray, config: PolicyConfig) -> dict[int, int]:
    """Reads per serving tier from the decisions alone (a plain dict of tiers)."""
    S, L, H, NB = weights.shape
    fw = FirmwareSession("ema", (BUDGET // BT) * L * H, config, block_tokens=BT)
    fw.ensure(NB * L * H)
    lay, hd = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    lay, hd = lay.ravel(), hd.ravel()
    flat = weights.transpose(0, 3, 1, 2).reshape(S, NB * L * H)
    tier: dict[int, int] = {}
    served = {TIER_HBM: 0, TIER_CXL: 0, TIER_NVME: 0}

    def apply(d) -> None:  # type: ignore[no-untyped-def]
        # In the order they happened: the call's admissions, its victims, then the moves.
        for i in d.admitted.tolist():
            tier[i] = TIER_HBM
        for i, t in zip(d.victims.tolist(), d.tiers.tolist(), strict=True):
            tier[i] = t
        for ids, _src, dst in d.moves:
            for i in ids.tolist():
                tier[i] = dst

    for s in range(S):
        fw.at(s)
        apply(fw.take_decisions())  # the boundary's moves, before this step's reads
        fw.lengths(0, s + 1)
        if s % BT == 0:
            new = fw.describe(np.zeros(L * H, np.int64), lay, hd, np.full(L * H, s // BT))
            apply(fw.write(s, new))
            for i in new.tolist():
                tier.setdefault(i, TIER_HBM)
        w = flat[s, : fw.table.n]
        ids = np.flatnonzero(w >= THR)
        src = [tier[i] for i in ids.tolist()]
        hit, d = fw.read(s, ids, w[ids])
        for h, t in zip(hit.tolist(), src, strict=True):
            served[TIER_HBM if h else t] += 1
        apply(d)
    return served


@pytest.mark.parametrize("evict", [0.001, 0.02, 0.2])
def test_reads_by_tier_match_a_book_kept_from_the_decisions(evict: float) -> None:
    w = _weights()
    cfg = PolicyConfig(tier_management="managed", keep_threshold=0.3, evict_threshold=evict)
    got = replay_tiers(w, cfg, BUDGET, BT, THR, EB)
    want = _books(w, cfg)
    reads = sum(want.values())
    assert got["reads"] == reads
    assert got["hit_rate"] == pytest.approx(want[TIER_HBM] / reads)
    assert got["cxl_read_fraction"] == pytest.approx(want[TIER_CXL] / reads)
    assert got["nvme_read_fraction"] == pytest.approx(want[TIER_NVME] / reads)


def test_the_evict_threshold_decides_what_reaches_nvme() -> None:
    w = _weights(1)
    base = PolicyConfig(tier_management="managed", keep_threshold=0.3)
    low = replay_tiers(w, base.with_(evict_threshold=1e-9), BUDGET, BT, THR, EB)
    high = replay_tiers(w, base.with_(evict_threshold=0.2), BUDGET, BT, THR, EB)
    none = replay_tiers(w, base.with_(evict_threshold=0.2, background_moves=0), BUDGET, BT, THR, EB)
    assert low["nvme_read_fraction"] == 0.0 and none["nvme_read_fraction"] == 0.0
    assert high["nvme_read_fraction"] > 0.0
    assert high["effective_latency_ns"] > low["effective_latency_ns"]


def test_sweep_skips_pairs_the_config_refuses_and_names_the_lowest_latency() -> None:
    w = [_weights(2)]
    r = managed_sweep(w, PolicyConfig(), [0.05, 0.3], [0.01, 0.1], BUDGET, BT, THR, EB)
    pairs = [(x["keep"], x["evict"]) for x in r["rows"]]
    assert pairs == [(0.05, 0.01), (0.3, 0.01), (0.3, 0.1)]  # keep > evict only
    lat = {(x["keep"], x["evict"]): x["per_trace"][0]["effective_latency_ns"] for x in r["rows"]}
    best = (r["best_by_latency"]["keep"], r["best_by_latency"]["evict"])
    assert lat[best] == min(lat.values())
