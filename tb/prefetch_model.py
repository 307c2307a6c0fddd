"""What the PrefetchEngine must answer: the firmware's candidates, int-mode ranks and order.

The expected candidates of one touch come from :mod:`kvcxl.firmware.prefetch`
(``propose``, ``rank(mode="int")``, ``order``), not from the RTL.  Used by the
Amaranth-simulator test and by the cocotb test on Verilator and Icarus.
"""

from __future__ import annotations

import random

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware import prefetch
from kvcxl.firmware.config import PolicyConfig

LAYERS, HEADS, BLOCKS, BLOCK_TOKENS = 6, 2, 12, 16


def configs() -> list[PolicyConfig]:
    """Window 0…2 blocks, depth 0…2, blend all-RoPE, all-score and default, RoPE scale 10."""
    base = PolicyConfig()
    return [
        base.with_(prefetch_window=32, prefetch_depth=2),
        base.with_(prefetch_window=16, prefetch_depth=1, prefetch_blend=(1.0, 0.0)),
        base.with_(
            prefetch_window=32,
            prefetch_depth=2,
            prefetch_blend=(0.0, 1.0),
            prefetch_distance_scale=10.0,
        ),
        base.with_(prefetch_window=0, prefetch_depth=2),
        base.with_(prefetch_depth=0, prefetch_window=32),
    ]


def params() -> dict:
    """``kvcxl.rtl.export.build("prefetch", **params())``: sized for every config's window
    and depth."""
    max_w, max_d = sizes(configs())
    return {"layers": LAYERS, "heads": HEADS, "blocks": BLOCKS, "max_window": max_w,
            "max_depth": max_d}  # fmt: skip


def entry_id(layer, head, block) -> NDArray:
    return (np.asarray(layer) * HEADS + np.asarray(head)) * BLOCKS + np.asarray(block)


def random_scores(rng: random.Random) -> NDArray:
    """Per-entry Q0.16 scores with the corners (0, 7, Q_MAX) among them."""
    return np.array(
        [
            rng.choice([0, 7, fx.Q_MAX, rng.randrange(fx.Q_ONE)])
            for _ in range(LAYERS * HEADS * BLOCKS)
        ]
    )


def sizes(cfgs: list[PolicyConfig]) -> tuple[int, int]:
    """(max window in blocks, max depth) the engine is built for."""
    w = max(fx.window_blocks(c.prefetch_window, BLOCK_TOKENS) for c in cfgs)
    return w, max(c.prefetch_depth for c in cfgs)


def registers(cfg: PolicyConfig, max_window: int) -> tuple[list[int], dict[str, int]]:
    """The RoPE table to write and the level inputs (window, depth, blend_rope) of ``cfg``."""
    table = [int(v) for v in fx.rope_table(max_window, BLOCK_TOKENS, cfg.prefetch_distance_scale)]
    return table, {
        "window": fx.window_blocks(cfg.prefetch_window, BLOCK_TOKENS),
        "depth": cfg.prefetch_depth,
        "blend_rope": fx.blend_to_q16(cfg.prefetch_blend)[0],
    }


def expected(touch: tuple[int, int, int], scores: NDArray, cfg: PolicyConfig) -> list:
    """[(entry id, rank)] in fetch order for one touch (layer, head, block)."""
    c = prefetch.propose(
        [touch[0]], [touch[1]], [touch[2]],
        n_layers=LAYERS, n_blocks=BLOCKS, block_tokens=BLOCK_TOKENS, config=cfg,
    )  # fmt: skip
    ids = entry_id(c.layer, c.head, c.block)
    ranks = prefetch.rank(c.distance_blocks, scores[ids], BLOCK_TOKENS, cfg, mode="int")
    order = prefetch.order(ids, ranks)
    by_id = dict(zip(ids.tolist(), ranks.tolist(), strict=True))
    return [(int(i), int(by_id[int(i)])) for i in order]
