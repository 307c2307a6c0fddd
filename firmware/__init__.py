"""kvcxl.firmware — the policy engine and golden model.

Public API for the seed's worked example (floats or numpy arrays in, exact float out):

>>> from kvcxl.firmware import ema_update, eviction_priority
>>> round(eviction_priority(0.170352, 50, 0.001), 3)
0.04

Integer Q0.16 counterparts (the RTL's contract) live in :mod:`kvcxl.firmware.fixedpoint`:
``ema_update_q16``, ``eviction_priority_q16``, ``decay_table``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# The public names and the module of each.  They are loaded on first use (PEP 562) so that
# importing one module of the firmware (the RTL imports ``fixedpoint``) does not load the
# configuration and the policies through this package.
_EXPORTS = {
    "PARAMS": "config",
    "ConfigError": "config",
    "PolicyConfig": "config",
    "decay_table": "fixedpoint",
    "ema_update_q16": "fixedpoint",
    "eviction_priority_q16": "fixedpoint",
    "to_q16": "fixedpoint",
    "ema_update": "formulas",
    "eviction_priority": "formulas",
    "placement_thresholds": "formulas",
    "placement_weighted": "formulas",
    "prefetch_rank": "formulas",
    "recency_decay": "formulas",
    "rope_factor": "formulas",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # lazy: see _EXPORTS
    from . import config, fixedpoint, formulas

    module = {"config": config, "fixedpoint": fixedpoint, "formulas": formulas}[_EXPORTS[name]]
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
