"""Policies, one small module each, all behind :class:`~kvcxl.firmware.policies.base.Policy`.

Adding a policy is adding a file here and importing it below.
"""

from . import belady, ema, fifo, h2o, lfu, lrfu, lru, random, sink_window
from .base import POLICIES, Policy, Tick, make_policy, register

__all__ = [
    "POLICIES",
    "Policy",
    "Tick",
    "belady",
    "ema",
    "fifo",
    "h2o",
    "lfu",
    "lrfu",
    "lru",
    "make_policy",
    "random",
    "register",
    "sink_window",
]
