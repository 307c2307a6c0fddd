"""Media tiers holding real bytes: sparse, page-granular stores.

A store keeps whole pages (``page_bytes``, a multiple of 64) addressed by page
number = DPA // page_bytes.  Pages never written read as zeros and cost nothing.

* :class:`DictStore` — pages in a dict (the NVMe tier, and DRAM when unshared).
* :class:`MmapStore` — one file of the device's DPA capacity mapped with mmap,
  DPA = file offset (the DRAM tier shared with QEMU's ``memory-backend-file``).
  The file is created sparse (ftruncate), so untouched pages use no disk.

``take`` removes a page and returns its bytes (a migration source); ``put`` installs
a page (a migration destination).  An MmapStore zeroes a page it gives away, so
no stale copy can hide a lost migration.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

ZERO_CACHE: dict[int, bytes] = {}


def zeros(n: int) -> bytes:
    z = ZERO_CACHE.get(n)
    if z is None:
        z = ZERO_CACHE[n] = bytes(n)
    return z


class DictStore:
    """Sparse pages in memory."""

    def __init__(self, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self.pages: dict[int, bytearray] = {}

    def __contains__(self, page: int) -> bool:
        return page in self.pages

    def __len__(self) -> int:
        return len(self.pages)

    def read(self, page: int, off: int, n: int) -> bytes:
        p = self.pages.get(page)
        return zeros(n) if p is None else bytes(p[off : off + n])

    def write(self, page: int, off: int, data: bytes | memoryview) -> None:
        p = self.pages.get(page)
        if p is None:
            p = self.pages[page] = bytearray(self.page_bytes)
        p[off : off + len(data)] = data

    def take(self, page: int) -> bytes | None:
        p = self.pages.pop(page, None)
        return None if p is None else bytes(p)

    def put(self, page: int, data: bytes) -> None:
        self.pages[page] = bytearray(data)

    def close(self) -> None:
        self.pages.clear()


class MmapStore:
    """Pages inside one mmap'ed file; page p lives at file offset p × page_bytes."""

    def __init__(self, path: str | Path, capacity: int, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # device memory: owner only
        try:
            size = os.fstat(fd).st_size
            if size < capacity:
                os.ftruncate(fd, capacity)
            elif size > capacity:
                raise ValueError(
                    f"media file {self.path} is {size} bytes, larger than the device "
                    f"capacity {capacity}"
                )
            self.map = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        self.present: set[int] = set()

    def __contains__(self, page: int) -> bool:
        return page in self.present

    def __len__(self) -> int:
        return len(self.present)

    def read(self, page: int, off: int, n: int) -> bytes:
        a = page * self.page_bytes + off
        return self.map[a : a + n]

    def write(self, page: int, off: int, data: bytes | memoryview) -> None:
        a = page * self.page_bytes + off
        self.map[a : a + len(data)] = data
        self.present.add(page)

    def take(self, page: int) -> bytes | None:
        # Always the file's bytes: QEMU (and the host preparing the media) write the shared
        # file directly, so "never written through this store" does not mean "zeros".
        a = page * self.page_bytes
        data = self.map[a : a + self.page_bytes]
        self.map[a : a + self.page_bytes] = zeros(self.page_bytes)
        self.present.discard(page)
        return data

    def put(self, page: int, data: bytes) -> None:
        self.write(page, 0, data)

    def close(self) -> None:
        self.map.flush()
        self.map.close()
