"""The one size grammar of every ``kvcxl`` command: ``4096``, ``0x1000``, ``2GB``, ``512MiB``.

Decimal units are decimal and binary units are binary, as in IEC 80000-13:
``K``/``KB`` = 10³, ``M``/``MB`` = 10⁶, ``G``/``GB`` = 10⁹, ``T``/``TB`` = 10¹²;
``KiB`` = 2¹⁰, ``MiB`` = 2²⁰, ``GiB`` = 2³⁰, ``TiB`` = 2⁴⁰ (units are case-insensitive).
A bare number (decimal or ``0x`` hexadecimal) is bytes.  A percentage is of a total
the command names (the workload's KV bytes for ``simulate``).

Standard library only: the command-line modules import it at their top.
"""

from __future__ import annotations

import argparse
import math
import re

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
