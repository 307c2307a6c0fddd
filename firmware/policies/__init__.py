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
from .queued import QueuePolicy  # noqa: E402

# The offline optimum a ranking measures its online policies against (may bypass).
BOUND = BeladyPolicy.name


def ranked(bound: bool = True) -> list[str]:
    """The policies a ranking compares (the demo, the sweeps, the policies experiment):
    every online policy that is not an ablation-ladder variant, sorted, then the offline
    optimum ``BOUND`` (``bound=False``: without it).  A policy added later joins by its file."""
    online = sorted(n for n, c in POLICIES.items() if c.online and not c.ablation)
    return [*online, BOUND] if bound else online


def queue_policies() -> list[str]:
    """The registered policies whose victims come from a walk over queues, sorted."""
    return sorted(n for n, c in POLICIES.items() if issubclass(c, QueuePolicy))


__all__ = [
    "BOUND",
    "POLICIES",
    "BeladyNoBypassPolicy",
    "BeladyPolicy",
    "CapacityTooSmall",
    "Policy",
    "Tick",
    "make_policy",
    "queue_policies",
    "ranked",
    "register",
    *_MODULES,
]
