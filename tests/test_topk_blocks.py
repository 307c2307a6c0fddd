"""A top-k read's blocks (emu/workloads/topk.py) against the plain formulation the stream
builder used: ``np.argpartition`` of the negated weights, the k first, ascending, and the
ids and weights gathered at them."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.workloads.attention import sparse_mask
from kvcxl.emu.workloads.topk import topk_blocks, topk_read


def _plain(w: np.ndarray, k: int) -> np.ndarray:
    return np.sort(np.argpartition(-w, k - 1, axis=-1)[..., :k], axis=-1)


def _weights(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    if kind == "continuous":  # the model's kind: no two weights of a row alike
        return rng.lognormal(0.0, 1.0, shape).astype(np.float32)
    if kind == "few values":  # the k-th weight tied in most rows
        return rng.integers(0, 4, shape).astype(np.float32)
    if kind == "crowded":  # distinct, but all within an 8th of a binade (one bucket)
        n = int(np.prod(shape))
        return (1.0 + rng.permutation(n).reshape(shape) * 2.0**-20).astype(np.float32)
    w = rng.random(shape).astype(np.float32)  # signed zeros, infinities and NaN
    flat = w.reshape(-1)
    at = rng.integers(0, flat.size, (4, max(1, flat.size // 20)))
    flat[at[0]], flat[at[1]], flat[at[2]], flat[at[3]] = 0.0, -0.0, np.inf, np.nan
    return w


@pytest.mark.parametrize("kind", ["continuous", "few values", "crowded", "specials"])
def test_topk_blocks_are_the_argpartition_formulations(kind):
    rng = np.random.default_rng(3)
    for shape in [(5, 3, 40), (2, 700), (1, 2)]:
        w = _weights(rng, kind, shape)
        for k in sorted({1, 2, shape[-1] // 3 + 1, shape[-1] - 1} - {shape[-1]}):
            got = topk_blocks(w, k)
            assert got.shape == (*shape[:-1], k)
            assert np.array_equal(got, _plain(w, k)), (kind, shape, k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_top_k_read_gathers_a_grids_ids_and_the_weights(dtype):
    """As the builder calls it: a context's grid wider than its blocks (rows strided),
    float32 weights (the radix path) and float64 (argpartition's alone)."""
    rng = np.random.default_rng(9)
    grid = rng.integers(0, 2**40, (6, 4, 90))[:, :, :70]
    for kind in ("continuous", "few values"):
        w = _weights(rng, kind, grid.shape).astype(dtype)
        for k in (1, 9, 69):
            ids, got_w = topk_read(w, grid, k)
            at = _plain(w, k)
            assert np.array_equal(ids, np.take_along_axis(grid, at, -1))
            assert got_w.dtype == dtype
            assert np.array_equal(got_w, np.take_along_axis(w, at, -1))
    with pytest.raises(ValueError, match=r"ids of shape \(2, 5\)"):
        topk_read(np.ones((2, 6), np.float32), np.ones((2, 5), np.int64), 3)


def test_a_top_k_mask_marks_those_blocks():
    w = _weights(np.random.default_rng(5), "few values", (3, 4, 50))
    mask = sparse_mask(w, "topk", 7)
    want = np.zeros(w.shape, bool)
    np.put_along_axis(want, _plain(w, 7), True, axis=-1)
    assert np.array_equal(mask, want) and (mask.sum(-1) == 7).all()


@pytest.mark.parametrize("k", [0, 5, 9])
def test_topk_blocks_refuses_a_k_outside_the_row(k):
    with pytest.raises(ValueError, match=f"top-k = {k}: must be in \\[1, 4\\]"):
        topk_blocks(np.ones((2, 5), np.float32), k)


def test_the_radix_answers_every_untied_row_itself(monkeypatch):
    """argpartition is the fallback for tied rows alone: with no two weights of a row
    alike, no row is handed to it (else the kernel's answer is never the one read)."""
    from kvcxl.emu.workloads import topk as topk_mod

    def refuse(*a, **kw):
        raise AssertionError("argpartition called for an untied row")

    rng = np.random.default_rng(2)
    rows = [_weights(rng, kind, (8, 3, 500)) for kind in ("continuous", "crowded")]
    want = [_plain(w, k) for w in rows for k in (40, 300)]
    monkeypatch.setattr(topk_mod.np, "argpartition", refuse)
    got = [topk_blocks(w, k) for w in rows for k in (40, 300)]
    assert all(np.array_equal(g, x) for g, x in zip(got, want, strict=True))
