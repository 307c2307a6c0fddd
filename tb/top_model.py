"""The small PolicyEngine the cocotb test of the top runs (shape, configuration, design)."""

from __future__ import annotations

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig

LAYERS, HEADS, BLOCKS, LANES, BATCH = 2, 2, 4, 4, 4
N = LAYERS * HEADS * BLOCKS
BASE = 4 << 30  # HDM base: entry e's first line is HPA BASE + 64·e (entry_shift 6)
BLOCK_TOKENS = 16


def config() -> PolicyConfig:
    return PolicyConfig().with_(prefetch_window=32, prefetch_depth=1)


def params() -> dict:
    """``kvcxl.rtl.export.build("top", **params())``: one line per entry, 64 B entries."""
    from kvcxl.rtl.export import default_decay  # lazy: amaranth is the optional 'hdl' extra

    cfg = config()
    return {
        "layers": LAYERS, "heads": HEADS, "blocks": BLOCKS, "lanes": LANES, "batch": BATCH,
        "lines": N, "entry_shift": 6, "decay_init": default_decay(cfg),
        "rope_init": fx.rope_table(2, BLOCK_TOKENS, cfg.prefetch_distance_scale),
    }  # fmt: skip


def build():
    from kvcxl.rtl.export import build as build_design  # lazy: amaranth (as above)

    return build_design("top", **params())
