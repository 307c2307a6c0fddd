"""What a parameter is: its range, type, meaning and check (the engine's and each policy's).

:mod:`kvcxl.firmware.config` holds the engine's parameters, and
:mod:`kvcxl.firmware.policy_params` the parameters that belong to one baseline policy;
both are tables of :class:`Param`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REAL = (int, float)


class ConfigError(ValueError):
    """A policy parameter was refused."""


@dataclass(frozen=True)
class Param:
    """What a parameter means and what it may be."""

    range_text: str
    check: Callable[[Any], bool]
    kind: type | tuple[type, ...]
    doc: str
    default: Any = None  # a policy's own parameter holds its default here (PolicyConfig's own
    # parameters hold theirs as field defaults)

    def refuse(self, name: str, value: Any) -> Any:
        """``value`` checked against this parameter (normalised), or a ConfigError naming it."""
        if isinstance(value, list):
            value = tuple(value)
        if not _kind_ok(value, self.kind):
            raise ConfigError(
                f"{name} = {value!r} has the wrong type: expected {_kind_name(self.kind)} "
                f"in {self.range_text}"
            )
        if isinstance(value, tuple):
            if not all(isinstance(x, REAL) and not isinstance(x, bool) for x in value):
                raise ConfigError(f"{name} = {value!r}: every element must be a number")
            value = tuple(float(x) for x in value)
        if not self.check(value):
            raise ConfigError(f"{name} = {value!r} is out of range: must be {self.range_text}")
        return value


def in_range(
    lo: float, hi: float, lo_open: bool = False, hi_open: bool = False
) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if not math.isfinite(v):
            return False
        above = v > lo if lo_open else v >= lo
        below = v < hi if hi_open else v <= hi
        return above and below

    return check


def one_of(*options: str) -> Callable[[Any], bool]:
    return lambda v: v in options


def _kind_ok(value: Any, kind: type | tuple[type, ...]) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int)
    return isinstance(value, kind)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if kind == REAL:
        return "a number"
    if isinstance(kind, tuple):
        return "a list"
    return {int: "an integer", bool: "true or false", str: "a string"}.get(kind, kind.__name__)
