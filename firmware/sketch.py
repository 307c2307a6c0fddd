"""W-TinyLFU's frequency sketch: a counting Bloom filter over entry ids (libCacheSim's).

``counters`` unsigned counters and ``hashes`` index functions built by double hashing:
index_i(x) = (a + i·b mod 2**32) mod counters, where a and b are the low 32 bits of
XXH64 of x's 8 little-endian bytes under two seeds.  ``add`` increments the counter at
every index (an index met twice is incremented twice); ``estimate`` is the smallest of
them (never below the true count of adds since the last halving).  ``halve`` shifts every
counter right by one (TinyLFU's reset, the aging that lets old popularity fade).

This is the sketch libCacheSim's WTinyLFU uses (``minimalIncrementCBF``: despite the
name it increments every index, not only the minimal ones), sized as that code sizes
it: a target false-positive rate e gives b = −ln e / ln²2 counters per element and
⌈ln 2 · b⌉ hashes (docs/policy.md, "W-TinyLFU").  The published TinyLFU (Einziger et al.)
uses a count-min sketch of small (4-bit) counters behind a doorkeeper Bloom filter; both
estimate a frequency from the minimum of a few hashed counters.

XXH64 below is written from the xxHash specification (only what an 8-byte key needs is
exercised; the general form is kept so it can be checked on the spec's test vectors).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

_M64 = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
# libCacheSim's HASH_SEED0 and HASH_SEED1 (dataStructure/hash/hash.h): the two hashes.
SEED_A, SEED_B = 0x12345678, 0x12344321
# ln²2 as libCacheSim writes it (a truncated literal; the exact value can move ⌈b · n⌉).
_LN2_SQUARED = 0.480453013918201
_LN2 = 0.693147180559945


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _M64
    return (_rotl(acc, 31) * _P1) & _M64


def _merge(acc: int, v: int) -> int:
    acc ^= _round(0, v)
    return (acc * _P1 + _P4) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` under ``seed`` (the xxHash specification, 64-bit variant)."""
    n = len(data)
    p = 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed & _M64, (seed - _P1) & _M64]
        while p + 32 <= n:
            for j in range(4):
                v[j] = _round(v[j], int.from_bytes(data[p + 8 * j : p + 8 * j + 8], "little"))
            p += 32
        acc = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for x in v:
            acc = _merge(acc, x)
    else:
        acc = (seed + _P5) & _M64
    acc = (acc + n) & _M64
    while p + 8 <= n:
        acc ^= _round(0, int.from_bytes(data[p : p + 8], "little"))
        acc = (_rotl(acc, 27) * _P1 + _P4) & _M64
        p += 8
    if p + 4 <= n:
        acc ^= (int.from_bytes(data[p : p + 4], "little") * _P1) & _M64
        acc = (_rotl(acc, 23) * _P2 + _P3) & _M64
        p += 4
    while p < n:
        acc ^= (data[p] * _P5) & _M64
        acc = (_rotl(acc, 11) * _P1) & _M64
        p += 1
    acc ^= acc >> 33
    acc = (acc * _P2) & _M64
    acc ^= acc >> 29
    acc = (acc * _P3) & _M64
    return acc ^ (acc >> 32)


def counters_per_element(error: float) -> float:
    """Counters per element for a target false-positive rate ``error`` (libCacheSim's b)."""
    return -math.log(error) / _LN2_SQUARED


def hashes_for(per_element: float) -> int:
    """The number of hashes that minimises false positives at ``per_element`` counters."""
    return math.ceil(_LN2 * per_element)


class FrequencySketch:
    """``counters`` counters, ``hashes`` indices per id (see the module docstring)."""

    def __init__(self, counters: int, hashes: int) -> None:
        if counters < 1 or hashes < 1:
            raise ValueError(
                f"sketch of {counters} counters and {hashes} hashes: both must be >= 1"
            )
        self.n = int(counters)
        self.k = int(hashes)
        self.count = np.zeros(self.n, dtype=np.uint32)  # libCacheSim: unsigned int
        self._idx: dict[int, tuple[int, ...]] = {}  # id -> its indices (hashing is costly)

    def indices(self, x: int) -> tuple[int, ...]:
        """The ``hashes`` counter indices of id ``x`` (repeats possible)."""
        idx = self._idx.get(x)
        if idx is None:
            key = int(x).to_bytes(8, "little")
            a = xxh64(key, SEED_A) & 0xFFFFFFFF
            b = xxh64(key, SEED_B) & 0xFFFFFFFF
            # unsigned 32-bit arithmetic, as the C code's `unsigned int` does
            idx = tuple(((a + i * b) & 0xFFFFFFFF) % self.n for i in range(self.k))
            self._idx[x] = idx
        return idx

    def add(self, x: int) -> None:
        self.add_all([x])

    def add_all(self, xs: Iterable[int]) -> None:
        """Add each of ``xs`` once (adds commute: one pass for a batch of them)."""
        flat = [j for x in xs for j in self.indices(x)]
        if flat:
            np.add.at(self.count, flat, 1)  # (a repeated index counts twice)

    def estimate(self, x: int, extra: Mapping[int, int] | None = None) -> int:
        """min over ``x``'s counters; ``extra`` holds pending increments by index (a walk's
        adds not yet committed)."""
        c = self.count
        if not extra:
            return int(min(c.item(j) for j in self.indices(x)))
        return int(min(c.item(j) + extra.get(j, 0) for j in self.indices(x)))

    def halve(self) -> None:
        self.count >>= 1
