"""Policies, one small module each, all behind :class:`~kvcxl.firmware.policies.base.Policy`.

Adding a policy is adding a file here: every module of this package is imported below
(pkgutil), and its ``@register`` classes join :data:`POLICIES`; its own parameters are
declared in its ``parameters`` (:mod:`kvcxl.firmware.policy_params` lists them).
``belady.py`` holds two: ``belady`` (the offline optimum, may bypass) and
``belady-nobypass`` (classic OPT, libCacheSim's Belady).
"""

import importlib
import pkgutil

from .base import POLICIES, CapacityTooSmall, Policy, Tick, make_policy, register

# Every module of the package, in name order (the registry's order, as listed before).
_MODULES = [
    m.name for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
    if not m.name.startswith("_")
]  # fmt: skip
for _name in _MODULES:
    importlib.import_module(f"{__name__}.{_name}")

from .belady import BeladyNoBypassPolicy, BeladyPolicy  # noqa: E402  (after the walk)

__all__ = [
    "POLICIES",
    "BeladyNoBypassPolicy",
    "BeladyPolicy",
    "CapacityTooSmall",
    "Policy",
    "Tick",
    "make_policy",
    "register",
    *_MODULES,
]
