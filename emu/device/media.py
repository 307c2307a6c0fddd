"""Media tiers holding real bytes: sparse, page-granular stores.

A store keeps whole pages (``page_bytes``, a multiple of 64) addressed by page
number = DPA // page_bytes.  Pages never written read as zeros and cost nothing.

* :class:`DictStore` — pages in a dict (the NVMe tier, and DRAM when unshared).
* :class:`MmapStore` — one file of the device's DPA capacity mapped with mmap,
  DPA = file offset (the DRAM tier shared with QEMU's ``memory-backend-file``).
  The file is created sparse (ftruncate), so untouched pages use no disk.
* :class:`FileStore` — pages in a file by ``pread``/``pwrite`` (the NVMe tier when it
  must outlive the process, ``--nvme-file``): a write the disk refuses (full, read-only,
  failing) raises :class:`MediaError` instead of the SIGBUS an mmap would take.
* :class:`TierMap` — one byte per page (1 = the page's bytes are in DRAM), in memory or
  mapped from a file beside the NVMe tier's, so that a restarted device finds each page.

``take`` removes a page and returns its bytes (a migration source); ``put`` installs
a page (a migration destination).  An MmapStore zeroes a page it gives away, so
no stale copy can hide a lost migration.  ``peek`` and ``drop`` split ``take`` in two,
so that a migration can copy, record the page's new tier, and only then drop the old
copy: a process killed at any point leaves the page whole in the tier the map names.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

ZERO_CACHE: dict[int, bytes] = {}


class MediaError(Exception):
    """The medium refused an access (disk full, read-only, I/O error): the protocol's media
    error, never a crash."""


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

    def peek(self, page: int) -> bytes | None:
        p = self.pages.get(page)
        return None if p is None else bytes(p)

    def drop(self, page: int) -> None:
        self.pages.pop(page, None)

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

    def peek(self, page: int) -> bytes:
        # The file's bytes, as take: written through this store or not (QEMU, the host,
        # or a run before this one).
        a = page * self.page_bytes
        return self.map[a : a + self.page_bytes]

    def drop(self, page: int) -> None:
        a = page * self.page_bytes
        self.map[a : a + self.page_bytes] = zeros(self.page_bytes)
        self.present.discard(page)

    def put(self, page: int, data: bytes) -> None:
        self.write(page, 0, data)

    def close(self) -> None:
        self.map.flush()
        self.map.close()


class FileStore:
    """Pages in a file, page p at offset p × page_bytes, by pread/pwrite (sparse: never
    written reads as zeros).  Refused writes and reads raise :class:`MediaError`."""

    def __init__(self, path: str | Path, capacity: int, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # owner only
        self.present: set[int] = set()  # pages written by this process (statistics)

    def __contains__(self, page: int) -> bool:
        return page in self.present

    def __len__(self) -> int:
        return len(self.present)

    def read(self, page: int, off: int, n: int) -> bytes:
        try:
            data = os.pread(self.fd, n, page * self.page_bytes + off)
        except OSError as exc:
            raise MediaError(f"{self.path}: read failed: {exc.strerror}") from None
        return data + zeros(n - len(data)) if len(data) < n else data

    def write(self, page: int, off: int, data: bytes | memoryview) -> None:
        try:
            done = os.pwrite(self.fd, data, page * self.page_bytes + off)
        except OSError as exc:
            raise MediaError(f"{self.path}: write failed: {exc.strerror}") from None
        if done != len(data):
            raise MediaError(f"{self.path}: short write ({done} of {len(data)} bytes)")
        self.present.add(page)

    def take(self, page: int) -> bytes:
        data = self.peek(page)
        self.drop(page)
        return data

    def peek(self, page: int) -> bytes:
        return self.read(page, 0, self.page_bytes)

    def put(self, page: int, data: bytes) -> None:
        self.write(page, 0, data)

    def drop(self, page: int) -> None:
        self.write(page, 0, zeros(self.page_bytes))
        self.present.discard(page)

    def close(self) -> None:
        os.close(self.fd)


class TierMap:
    """One byte per page: 1 = its bytes are in DRAM, 0 = in NVMe.  With ``path`` the map
    is a file (created with ``initial`` for every page, or found from an earlier run:
    ``restored``) and ``bytes`` its mmap; without, ``bytes`` is a bytearray.  Either indexes
    as ints and serves numpy as a buffer."""

    def __init__(self, n_pages: int, initial: int, path: str | Path | None = None) -> None:
        self.restored = False
        self.path = Path(path) if path else None
        if self.path is None:
            self.bytes: bytearray | mmap.mmap = bytearray(bytes([initial]) * n_pages)
            return
        existed = self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if existed and size not in (0, n_pages):
                raise ValueError(
                    f"tier map {self.path} holds {size} pages, this device has {n_pages}: "
                    "it belongs to a device of another capacity or page size"
                )
            if not existed or size == 0:
                os.pwrite(fd, bytes([initial]) * n_pages, 0)
            else:
                self.restored = True
            self.bytes = mmap.mmap(fd, n_pages)
        finally:
            os.close(fd)

    def close(self) -> None:
        if isinstance(self.bytes, mmap.mmap):
            self.bytes.flush()
            self.bytes.close()
