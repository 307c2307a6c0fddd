"""The stream builder's in-place column (emu/workloads/column.py) against a plain join of
the same parts (``np.concatenate``), through many remaps and where remapping fails."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from kvcxl.emu.workloads import column as column_mod
from kvcxl.emu.workloads.column import Column


def _parts(rng: np.random.Generator) -> list[tuple[str, object]]:
    """Appends and skips of every kind the builder makes: contiguous, strided, broadcast,
    2-D and 3-D parts, empty ones, other dtypes (cast on write) and zeros skipped."""
    out: list[tuple[str, object]] = []
    for _ in range(60):
        kind = rng.integers(0, 6)
        n = int(rng.integers(0, 5000))
        if kind == 0:
            out.append(("append", rng.integers(-(2**40), 2**40, n)))
        elif kind == 1:  # a layer of a grid wider than its blocks (strided rows)
            g = rng.integers(0, 2**40, (3, 4, n + 7))
            out.append(("append", g[1, :, : n // 4 + 1]))
        elif kind == 2:  # a broadcast view (one value, or a range along an axis)
            out.append(("append", np.broadcast_to(np.arange(3)[:, None, None], (3, 2, n))))
        elif kind == 3:
            out.append(("append", rng.random(n)))  # float64, cast to the column's dtype
        elif kind == 4:
            out.append(("skip", n))
        else:
            out.append(("append", np.zeros(0, np.int64)))
    return out


def _plain(parts: list[tuple[str, object]], dtype: type) -> np.ndarray:
    pieces = [
        np.zeros(p, dtype) if op == "skip" else np.asarray(p).astype(dtype).ravel()
        for op, p in parts
    ]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype)


def _build(parts: list[tuple[str, object]], dtype: type) -> np.ndarray:
    col = Column(dtype)
    for op, p in parts:
        col.append(p) if op == "append" else col.skip(p)
    got = col.take()
    assert col.size == 0 and col.take().size == 0  # emptied by take
    return got


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32])
def test_a_column_equals_the_plain_join_of_its_parts(monkeypatch, dtype):
    monkeypatch.setattr(column_mod, "_FIRST_BYTES", 4096)  # many remaps
    parts = _parts(np.random.default_rng(7))
    got, want = _build(parts, dtype), _plain(parts, dtype)
    assert got.dtype == want.dtype and np.array_equal(got, want)


class _NoRemap(mmap.mmap):
    def resize(self, newsize: int) -> None:
        raise SystemError("mmap: resizing not available--no mremap()")


def test_a_column_that_cannot_remap_copies_into_a_larger_mapping(monkeypatch):
    made: list[int] = []

    def fixed(nbytes: int) -> mmap.mmap:
        made.append(nbytes)
        return _NoRemap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    monkeypatch.setattr(column_mod, "_FIRST_BYTES", 4096)
    monkeypatch.setattr(column_mod, "_anonymous", fixed)
    parts = _parts(np.random.default_rng(11))
    got, want = _build(parts, np.int64), _plain(parts, np.int64)
    assert len(made) > 3 and np.array_equal(got, want)


def test_a_column_refuses_a_negative_skip():
    with pytest.raises(ValueError, match="items = -1"):
        Column(np.int64).skip(-1)
