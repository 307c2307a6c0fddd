"""StreamingLLM: keep S attention-sink tokens and a recent window.

Sinks (first token < sink_tokens) are pinned; every other entry is ranked by its
age behind its context's newest token, oldest evicted first, so whatever budget
remains holds the most recent window.
"""

from __future__ import annotations

from numpy.typing import NDArray

from ..history import HistoryRule
from ..policy_params import SINK_TOKENS
from .base import Policy, Tick, register


class SinkWindowHistory(HistoryRule):
    """Oldest behind its context's newest token first; sinks claim pins."""

    def anchor(self, ids: NDArray) -> NDArray:
        return self.h.first_token(ids) < self.h.config.param("sink_tokens")

    def priority(self, ids: NDArray, time: int) -> NDArray:
        return self.h.age_tokens(ids)


@register
class SinkWindowPolicy(Policy):
    name = "sink-window"
    summary = "StreamingLLM: attention sinks + recent window"
    parameters = {"sink_tokens": SINK_TOKENS}
    history = SinkWindowHistory

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return self.table.age_tokens(ids)

    def wants_pin(self, ids: NDArray) -> NDArray:
        return self.table.first_token(ids) < self.params.sink_tokens
