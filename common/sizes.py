"""The one size and budget grammar of every ``kvcxl`` command: ``4096``, ``0x1000``, ``2GB``,
``512MiB``, ``25%``, ``all``.

Decimal units are decimal and binary units are binary, as in IEC 80000-13:
``K``/``KB`` = 10³, ``M``/``MB`` = 10⁶, ``G``/``GB`` = 10⁹, ``T``/``TB`` = 10¹²;
``KiB`` = 2¹⁰, ``MiB`` = 2²⁰, ``GiB`` = 2³⁰, ``TiB`` = 2⁴⁰ (units are case-insensitive).
A bare number (decimal or ``0x`` hexadecimal) is bytes.  A percentage is of a total
the command names (the workload's KV bytes for ``simulate``).

A budget is an amount in an explicit unit (:data:`BYTES`, :data:`TOKENS` per KV head, or a
:data:`FRACTION` of a whole), written in one grammar: a number in that unit, a percentage
of the total the command names, or ``all`` (the whole total).  :meth:`Budget.parse` reads it
(``type=budget_arg(unit)`` on the command line) and :meth:`Budget.resolve` gives the amount.

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


@dataclass(frozen=True)
class Budget:
    """A budget as the user wrote it, parsed once (at argparse time): an ``amount`` in
    ``unit``, a ``percent`` of a total the command names, or neither: ``all`` of it.

    :meth:`resolve` turns it into an amount once the total is known; ``str()`` gives the
    text as written, which reports and JSON rows carry.  Frozen and made of plain values,
    so it pickles to worker processes.
    """

    unit: Unit
    text: str
    amount: int | float | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str | int | float, unit: Unit) -> Budget:
        """An amount (``512MiB`` for bytes, ``128`` tokens, ``0.25``), a percentage
        (``25%``) or ``all``; a ValueError names the bad value and what is accepted."""
        raw = str(text)
        t = raw.strip().lower()
        if t in _ALL:
            return cls(unit, raw)
        if unit == BYTES:  # the size grammar, its messages ("a percentage must be in [0, 100]")
            if t.endswith("%"):
                parse_size(raw, 0)  # refuses a bad or out-of-range percentage, naming it
                return cls(unit, raw, percent=float(t[:-1]))
            return cls(unit, raw, amount=parse_size(text))
        accepted = f"accepted: {unit.name} (e.g. {unit.example}), a percentage (e.g. 25%) or 'all'"
        try:
            pct = float(t[:-1]) if t.endswith("%") else None
            value = 0 if pct is not None else int(t) if unit.whole else float(t)
        except ValueError:
            raise ValueError(f"budget {raw!r} is not understood; {accepted}") from None
        if pct is not None:
            if not 0 < pct <= 100:  # also refuses nan
                raise ValueError(f"budget {raw!r}: a percentage must be in (0, 100]; {accepted}")
            return cls(unit, raw, percent=pct)
        if unit == FRACTION and not 0 < value <= 1:
            raise ValueError(f"budget {raw!r} is not a fraction in (0, 1]; {accepted}")
        if value < unit.minimum:
            raise ValueError(f"budget {raw!r}: must be >= {unit.minimum:g} {unit.name}")
        return cls(unit, raw, amount=value)

    @property
    def relative(self) -> bool:
        """A percentage or ``all``: the amount depends on the total."""
        return self.amount is None

    def resolve(self, total: float | None = None) -> int | float:
        """The amount in the unit: a percentage of ``total`` (bytes round down, tokens round
        up to at least one), ``all`` is ``total``; a fraction's total is always 1.  A
        percentage or ``all`` without a total is a ValueError naming the budget."""
        if self.amount is not None:
            return self.amount
        if self.unit == FRACTION:
            total = 1.0
        if total is None:
            what = "'all'" if self.percent is None else "a percentage"
            raise ValueError(f"budget {self.text!r}: {what} has nothing to be relative to here")
        share = total if self.percent is None else total * self.percent / 100
        if self.unit.round_up:
            return max(self.unit.minimum, math.ceil(share))
        return int(share) if self.unit.whole else share

    def __str__(self) -> str:
        return self.text

    def __format__(self, spec: str) -> str:  # aligned in tables like the text it is
        return format(self.text, spec)


def as_budget(value: Budget | str | int | float, unit: Unit) -> Budget:
    """``value`` if already a :class:`Budget` (in ``unit``), else parsed in ``unit``."""
    if isinstance(value, Budget):
        if value.unit != unit:
            raise ValueError(f"budget {value.text!r} is in {value.unit.name}, not {unit.name}")
        return value
    return Budget.parse(value, unit)


@dataclass(frozen=True)
class BudgetArg:
    """An argparse ``type``: the option's text as a :class:`Budget` in ``unit``; a bad one
    is refused while parsing, with the message of :meth:`Budget.parse`."""

    unit: Unit

    def __call__(self, text: str) -> Budget:
        try:
            return Budget.parse(text, self.unit)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def budget_arg(unit: Unit) -> BudgetArg:
    """The ``type=`` of every ``--budget`` option: ``type=budget_arg(BYTES)``."""
    return BudgetArg(unit)
