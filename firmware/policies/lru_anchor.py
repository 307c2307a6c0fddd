"""LRU with the anchor zone pinned: the second rung of the design's ablation ladder.

The same order as ``lru`` (oldest last read evicted first); entries whose first token
lies below ``anchor_zone_size`` (the attention sink, a system prompt) are pinned as the
EMA pins them, so the rung measures what pinning alone adds to LRU.
"""

from __future__ import annotations

from numpy.typing import NDArray

from .base import register
from .lru import LruHistory, LruPolicy


class LruAnchorHistory(LruHistory):
    """LRU's order; entries starting below ``anchor_zone_size`` claim pins."""

    def anchor(self, ids: NDArray) -> NDArray:
        return self.h.first_token(ids) < self.h.config.anchor_zone_size


@register
class LruAnchorPolicy(LruPolicy):
    name = "lru-anchor"
    summary = "least recently used, anchor zone pinned (the ablation ladder's second rung)"
    ablation = True
    history = LruAnchorHistory

    def wants_pin(self, ids: NDArray) -> NDArray:
        return self.table.first_token(ids) < self.config.anchor_zone_size
