"""The fused attention kernel (emu/workloads/attention_kernel.py) against the numpy
formulation of the weights written out pass by pass (a second, plain implementation): every
weight equal bit for bit, on every preset's attention, both aggregations, contexts of every
length class; and its pairwise sum against numpy's own."""

from __future__ import annotations

import numpy as np
import pytest

from kvcxl.emu.shape import PRESETS
from kvcxl.emu.workloads.attention import (
    AttentionModel,
    ContextAttention,
    attention_for,
)
from kvcxl.emu.workloads.attention_kernel import pairwise_sum


def numpy_weights(self, ctx, n_tokens, rng):
    """The weights as the numpy formulation computes them, a pass per operation."""
    s, p = self.shape, self.params
    nb = -(-n_tokens // s.block_tokens)
    ctx.grow(nb)
    L, H, G = s.layers, s.kv_heads, s.group_size
    rel = ctx.rel[:, :, :nb]
    jitter = rng.lognormal(0.0, p.jitter_sigma, size=(1, H, nb)).astype(np.float32)
    bg = rel * jitter
    bg /= bg.sum(axis=2, keepdims=True)
    # Recent window: exponential in the distance (tokens) of the block's last token.
    last_tok = np.minimum((np.arange(nb) + 1) * s.block_tokens, n_tokens) - 1
    dist = (n_tokens - 1 - last_tok).astype(np.float32)
    rec = np.exp(-dist / np.float32(max(p.recent_tokens, 1e-6)))
    rec /= rec.sum()
    ret_mass = np.where(self.retrieval, p.retrieval_mass, 0.0).astype(np.float32)
    needles = ctx.needle_blocks
    if needles is None or needles.size == 0:
        ret_mass[:] = 0.0
    sink = self.sink[:, None] * (1.0 - ret_mass)  # a retrieval head's mass goes to needles
    bg_mass = np.clip(1.0 - sink - self.recent[:, None] - ret_mass, 0.0, None)
    out = None
    for g in range(G):
        gain = rng.lognormal(0.0, p.group_sigma, size=(L, H, 1)).astype(np.float32)
        if self.split is None:
            w = bg * (bg_mass[:, :, None] * gain)
            w += (self.recent[:, None] * rec[None, :])[:, None, :]
            w[:, :, 0] += sink
        else:
            # The normalisation below renormalises the three shares: a composition.
            sink_g = sink * self.split[0, g]
            recent_g = self.recent[:, None] * self.split[1, g]  # (L, H)
            bg_g = bg_mass * self.split[2, g]
            w = bg * (bg_g[:, :, None] * gain)
            w += recent_g[:, :, None] * rec[None, None, :]
            w[:, :, 0] += sink_g
        if needles is not None and needles.size:
            w[:, :, needles[needles < nb]] += (ret_mass / max(needles.size, 1))[:, :, None]
        w /= w.sum(axis=2, keepdims=True)
        if out is None:
            out = w
        elif self.aggregation == "max":
            np.maximum(out, w, out=out)
        else:
            out += w
    assert out is not None
    if self.aggregation == "mean" and G > 1:
        out /= G
    return out


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 130, 255, 256, 257,
                               1000, 1023, 1024, 1025, 4097, 7374])  # fmt: skip
def test_the_pairwise_sum_is_numpys(n):
    rng = np.random.default_rng(n)
    for a in (rng.lognormal(0, 2, n).astype(np.float32), rng.random(n, dtype=np.float32)):
        rows = np.stack([a, a[::-1].copy()])
        for row, want in zip(rows, rows.sum(axis=1), strict=True):
            assert pairwise_sum(row) == want
        assert pairwise_sum(a) == a.sum()


@pytest.mark.parametrize("aggregation", ["max", "mean"])
@pytest.mark.parametrize(("preset", "attention"), [("ci", None), ("s1", None), ("s1", "fit")])
def test_the_kernel_is_the_numpy_formulation_bit_for_bit(preset, attention, aggregation):
    shape = PRESETS[preset].with_(layers=4, context_tokens=8192)
    p = attention_for(shape, attention)
    model = AttentionModel(shape, p, aggregation, seed=3)
    seen_needles = False
    for n_tokens in (1, 15, 16, 17, 200, 1000, 8000):
        ctx_a, ctx_b = (ContextAttention(shape, p, np.random.default_rng([7, n_tokens]))
                        for _ in range(2))  # fmt: skip
        rng_a, rng_b = np.random.default_rng(11), np.random.default_rng(11)
        for step in range(3):  # a context that grows: rel holds more blocks than are read
            got = model.weights(ctx_a, n_tokens + 40 * step, rng_a)
            want = numpy_weights(model, ctx_b, n_tokens + 40 * step, rng_b)
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        seen_needles |= ctx_a.needle_blocks is not None and ctx_a.needle_blocks.size > 0
        assert rng_a.random() == rng_b.random()  # the same draws, in the same order
    assert seen_needles
