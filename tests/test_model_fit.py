"""Calibration statistics and the synthetic-attention fit (no model run: fast)."""

from __future__ import annotations

import numpy as np
import pytest
from kvcxl.emu.model.calibrate import ci95, threshold_sweep
from kvcxl.emu.model.fit import fit, fitted_params


def _synthetic(params, layers=8, kv_heads=2, tokens=320, seed=0):
    from kvcxl.emu.attention import AttentionModel, ContextAttention
    from kvcxl.emu.shape import ModelShape

    shape = ModelShape("t", layers, 2 * kv_heads, kv_heads, 64, 2, 16, tokens)
    am = AttentionModel(shape, params, "mean", seed)
    rng = np.random.default_rng(seed)
    ctx = ContextAttention(shape, params, rng)
    nb = -(-tokens // 16)
    w = np.zeros((tokens, layers, kv_heads, nb), dtype=np.float32)
    for s in range(tokens):
        a = am.weights(ctx, s + 1, rng)
        w[s, :, :, : a.shape[-1]] = a
    return w


def test_fit_recovers_the_sink_profile_of_the_generator() -> None:
    from kvcxl.emu.attention import AttentionParams

    true = AttentionParams(sink_mass_first=0.1, sink_mass_last=0.5, recent_mass=0.3,
                           retrieval_fraction=0.0, group_sigma=0.0)  # fmt: skip
    params, ev = fit([_synthetic(true)], 16)
    assert params["sink_mass_first"] == pytest.approx(0.1, abs=0.05)
    assert params["sink_mass_last"] == pytest.approx(0.5, abs=0.05)
    assert params["retrieval_fraction"] == 0.0
    assert ev["sink_linear_fit_rmse"] < 0.05
    AttentionParams().with_(**params)  # valid generator parameters


def test_fitted_params_are_valid() -> None:
    from kvcxl.emu.attention import AttentionParams

    p = fitted_params()
    assert isinstance(p, AttentionParams)
    assert p.sink_mass_last > p.sink_mass_first  # SmolLM2's sink grows with depth


def test_ci95() -> None:
    m, h = ci95([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(4.303 * 1.0 / np.sqrt(3), rel=1e-3)
    assert np.isnan(ci95([1.0])[1])


def test_threshold_sweep_is_monotone() -> None:
    rng = np.random.default_rng(3)
    w = rng.dirichlet(np.ones(6), size=(96, 2, 2)).astype(np.float32)
    w[:, :, :, :] *= np.arange(6)[None, None, None, :] <= (np.arange(96) // 16)[:, None, None, None]
    r = threshold_sweep(w, 0.2, [0.01, 0.05, 0.2], [0.001, 0.01, 0.05], 0.01, 16)
    hot = [k["hot_set_fraction"] for k in r["keep"]]
    hit = [k["read_hit_rate"] for k in r["keep"]]
    nv = [e["nvme_read_fraction"] for e in r["evict"]]
    assert hot == sorted(hot, reverse=True) and hit == sorted(hit, reverse=True)
    assert nv == sorted(nv)
