"""The one size and budget grammar of every ``kvcxl`` command: ``4096``, ``0x1000``, ``2GB``,
``512MiB``, ``25%``, ``all``.

Decimal units are decimal and binary units are binary, as in IEC 80000-13:
``K``/``KB`` = 10³, ``M``/``MB`` = 10⁶, ``G``/``GB`` = 10⁹, ``T``/``TB`` = 10¹²;
``KiB`` = 2¹⁰, ``MiB`` = 2²⁰, ``GiB`` = 2³⁰, ``TiB`` = 2⁴⁰ (units are case-insensitive).
A bare number (decimal or ``0x`` hexadecimal) is bytes.  A percentage is of a total
the command names (the workload's KV bytes for ``simulate``).

A budget is an amount in an explicit unit (:data:`BYTES`, :data:`TOKENS` per KV head, or a
:data:`FRACTION` of a whole), written in one grammar: a number in that unit, a percentage
of the total the command names, or ``all`` (the whole total).  :func:`parse_budget` reads it.

Standard library only: the command-line modules import it at their top.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

#: One line for the ``--help`` of every option that takes a size.
SIZE_HELP = "256MiB = 256·2²⁰ bytes, 256MB = 256·10⁶; a bare number is bytes"

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip


def parse_size(text: str | int | float, total: int | None = None) -> int:
    """``512MiB``, ``2GB``, ``4096`` or ``0x1000`` (bytes), ``25%`` (of ``total``) → bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text!r} is negative")
        return int(text)
    t = str(text).strip()
    if t.endswith("%"):
        try:
            pct = float(t[:-1])
        except ValueError:
            raise ValueError(f"size {text!r}: {t[:-1]!r} is not a number") from None
        if not 0 <= pct <= 100 or not math.isfinite(pct):
            raise ValueError(f"size {text!r}: a percentage must be in [0, 100]")
        if total is None:
            raise ValueError(f"size {text!r}: a percentage has nothing to be relative to here")
        return int(total * pct / 100)
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", t):
        return int(t, 16)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)", t)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(
            f"size {text!r} is not understood: use bytes (4096), a unit (512MiB, 2GB) or a "
            "percentage (25%)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def dpa_range(text: str) -> tuple[int, int]:
    """``DPA:LENGTH`` (``0x800000:64KiB``; a bare DPA is one byte) as an argparse ``type``:
    (first byte, length in bytes)."""
    dpa, sep, length = text.partition(":")
    try:
        lo, n = int(dpa, 0), parse_size(length) if sep else 1
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not DPA:LENGTH, e.g. 0x800000:64KiB ({exc})"
        ) from None
    if lo < 0 or n < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range: DPA >= 0 and LENGTH >= 1 are accepted"
        )
    return lo, n


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type``: a size in bytes (no percentage)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class Unit:
    """What a budget counts, and how a share of the total becomes a whole amount."""

    name: str
    example: str  # an amount in the unit, for the message that refuses a bad budget
    round_up: bool  # a percentage rounds up (at least one) rather than down
    minimum: float  # the least amount accepted
    whole: bool  # the amount is an integer


#: bytes: a size (``512MiB``, ``2GB``, ``4096``); a percentage rounds down, 0 is allowed.
BYTES = Unit("bytes", "512MiB", round_up=False, minimum=0, whole=True)
#: tokens per KV head (``128``); a percentage rounds up to at least one token.
TOKENS = Unit("tokens per KV head", "128", round_up=True, minimum=1, whole=True)
#: a fraction of the whole in (0, 1] (``0.25``); a percentage is that fraction.
FRACTION = Unit("fraction", "0.25", round_up=False, minimum=0, whole=False)

_ALL = ("all", "full", "unbounded")


def parse_budget(text: str | int | float, unit: Unit, total: float | None = None) -> int | float:
    """A budget in ``unit``: an amount (``512MiB`` for bytes, ``128`` tokens, ``0.25``), a
    percentage of ``total`` (``25%``) or ``all`` (``total``; a fraction's total is 1)."""
    if unit is FRACTION:
        total = 1.0
    t = str(text).strip().lower()
    if t in _ALL:
        if total is None:
            raise ValueError(f"budget {text!r}: 'all' has nothing to be relative to here")
        return total
    if unit is BYTES:
        return parse_size(text, None if total is None else int(total))
    accepted = f"accepted: {unit.name} (e.g. {unit.example}), a percentage (e.g. 25%) or 'all'"
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            if total is None:
                raise ValueError(f"budget {text!r}: a percentage has nothing to be relative to")
            share = total * pct / 100
            return max(unit.minimum, math.ceil(share)) if unit.round_up else share
        value = int(t) if unit.whole else float(t)
    except ValueError as exc:
        if "relative" in str(exc):
            raise
        raise ValueError(f"budget {text!r} is not understood; {accepted}") from None
    if unit is FRACTION and not 0 < value <= 1:
        raise ValueError(f"budget {text!r} is not a fraction in (0, 1]; {accepted}")
    if value < unit.minimum:
        raise ValueError(f"budget {text!r}: must be >= {unit.minimum:g} {unit.name}")
    return value
