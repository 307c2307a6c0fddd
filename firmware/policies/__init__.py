"""Policies, one small module each, all behind :class:`~kvcxl.firmware.policies.base.Policy`.

Adding a policy is adding a file here and importing it below.  ``belady.py`` holds two:
``belady`` (the offline optimum, may bypass) and ``belady-nobypass`` (classic OPT,
libCacheSim's Belady).
"""

from . import (
    arc,
    belady,
    clock,
    ema,
    ema_position,
    fifo,
    h2o,
    lfu,
    lrfu,
    lru,
    lru_anchor,
    random,
    s3fifo,
    sieve,
    sink_window,
    slru,
)
from .base import POLICIES, CapacityTooSmall, Policy, Tick, make_policy, register
from .belady import BeladyNoBypassPolicy, BeladyPolicy

__all__ = [
    "POLICIES",
    "BeladyNoBypassPolicy",
    "BeladyPolicy",
    "CapacityTooSmall",
    "Policy",
    "Tick",
    "arc",
    "belady",
    "clock",
    "ema",
    "ema_position",
    "fifo",
    "h2o",
    "lfu",
    "lrfu",
    "lru",
    "lru_anchor",
    "make_policy",
    "random",
    "register",
    "s3fifo",
    "sieve",
    "sink_window",
    "slru",
]
