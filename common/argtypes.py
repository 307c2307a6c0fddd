"""Option types for the command line that refuse a value out of range while parsing, with a
message naming the value and what is accepted (``kvcxl``: exit status 2).

Standard library only: every command module may use them without slowing ``kvcxl --help``.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["nonnegative", "nonnegative_float", "positive", "positive_float", "unit_interval"]


def _number(text: str, kind: type, accepted: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}")
    return value


def positive(text: str) -> int:
    """An integer >= 1 (counts: steps, seeds, operations, jobs, dimensions)."""
    n = _number(text, int, "an integer >= 1")
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} is out of range: an integer >= 1 is accepted")
    return int(n)


def nonnegative(text: str) -> int:
    """An integer >= 0 (seeds, warm-up steps, limits where 0 means none)."""
    n = _number(text, int, "an integer >= 0")
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range: an integer >= 0 is accepted")
    return int(n)


def positive_float(text: str) -> float:
    """A finite number > 0 (bandwidths, time limits)."""
    x = _number(text, float, "a number > 0")
    if x <= 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range: a number > 0 is accepted")
    return float(x)


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (latencies, waits, exponents)."""
    x = _number(text, float, "a number >= 0")
    if x < 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range: a number >= 0 is accepted")
    return float(x)


def unit_interval(text: str) -> float:
    """A number in [0, 1] (shares)."""
    x = _number(text, float, "a number in [0, 1]")
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"{text} is out of range: a number in [0, 1] is accepted")
    return float(x)
