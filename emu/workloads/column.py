"""A column of a stream built by appending parts in place.

A large stream's columns (its reads' ids and weights: 3.6 GB for S1's 16 users at three
dense steps) used to be joined from their parts at the end, so the build held each column
twice and touched every page twice. This machine turns a page slow the first time it is
touched once about 8 GB is in use (docs/simulator.md, "Huge pages and first-touched
memory"), so the join cost more than the rest of the build. A :class:`Column` instead
writes each part once, into an anonymous mapping that grows by remapping
(``mremap``): growing copies no byte and touches no page, and a page is first touched
when a part is written into it.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
from numpy.typing import NDArray

_FIRST_BYTES = 1 << 20  # the first mapping; each growth at least doubles it


class Column:
    """Appends parts of one dtype into one array, handed out by :meth:`take`.

    Bytes not yet written read as zero (a fresh anonymous page), which :meth:`skip` uses
    to append zeros without touching them."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        self.size = 0  # items written or skipped
        self._map: mmap.mmap | None = None

    def _room(self, items: int) -> None:
        need = (self.size + items) * self.dtype.itemsize
        have = 0 if self._map is None else len(self._map)
        if need <= have:
            return
        grown = max(need, 2 * have, _FIRST_BYTES)
        if self._map is None:
            self._map = _anonymous(grown)
            return
        try:
            self._map.resize(grown)  # mremap: the pages move, none is copied or touched
        except (OSError, SystemError, ValueError):
            # where the mapping cannot be remapped (no mremap): a larger one, copied into
            bigger = _anonymous(grown)
            bigger[: self.size * self.dtype.itemsize] = self._map[: self.size * self.dtype.itemsize]
            self._map.close()
            self._map = bigger

    def append(self, part: NDArray) -> None:
        """Write ``part`` (any shape, any strides: read in C order) after what is held."""
        k = int(part.size)
        if not k:
            return
        self._room(k)
        view = np.frombuffer(self._map, self.dtype, k, self.size * self.dtype.itemsize)
        view.reshape(part.shape)[...] = part
        del view  # (the mapping cannot be remapped while a view of it is held)
        self.size += k

    def skip(self, items: int) -> None:
        """Append ``items`` zeros, leaving their pages untouched."""
        if items < 0:
            raise ValueError(f"items = {items}: must be >= 0")
        self._room(items)
        self.size += items

    def take(self) -> NDArray:
        """The column as one array (the mapping cut to its size); the column is empty after."""
        m, self._map = self._map, None
        n, self.size = self.size, 0
        if m is None or n == 0:
            if m is not None:
                m.close()
            return np.zeros(0, self.dtype)
        try:
            m.resize(n * self.dtype.itemsize)  # the unwritten tail returned to the system
        except (OSError, SystemError, ValueError):
            pass  # kept mapped; never touched, it holds no memory
        return np.frombuffer(m, self.dtype, n)


def _anonymous(nbytes: int) -> mmap.mmap:
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
