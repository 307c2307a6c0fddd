"""kvcxl.firmware — the policy engine and golden model.

Public API for the seed's worked example (floats or numpy arrays in, exact float out):

>>> from kvcxl.firmware import ema_update, eviction_priority
>>> round(eviction_priority(0.170352, 50, 0.001), 3)
0.04

Integer Q0.16 counterparts (the RTL's contract) live in :mod:`kvcxl.firmware.fixedpoint`:
``ema_update_q16``, ``eviction_priority_q16``, ``decay_table``.
"""

from .config import PARAMS, ConfigError, PolicyConfig
from .fixedpoint import decay_table, ema_update_q16, eviction_priority_q16, to_q16
from .formulas import (
    ema_update,
    eviction_priority,
    placement_thresholds,
    placement_weighted,
    prefetch_rank,
    recency_decay,
    rope_factor,
)

__all__ = [
    "PARAMS",
    "ConfigError",
    "PolicyConfig",
    "decay_table",
    "ema_update",
    "ema_update_q16",
    "eviction_priority",
    "eviction_priority_q16",
    "placement_thresholds",
    "placement_weighted",
    "prefetch_rank",
    "recency_decay",
    "rope_factor",
    "to_q16",
]
