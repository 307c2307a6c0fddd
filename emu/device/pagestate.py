"""The page-state table the device shares with a patched QEMU (docs/qemu.md, "Memory path").

One file, mapped by the device service and by QEMU's ``cxl-type3`` (property
``kvcxl-state``), little endian::

    header (64 B): magic "KVPS", u32 version, u32 page_shift, u32 0, u64 pages,
                   u64 state offset, u64 version offset, u64 count offset
    state[pages]   u8: 0 = DIRECT (in device DRAM, not poisoned: QEMU may complete
                   the access against the shared DRAM file), 1 = TRAP (QEMU sends the
                   access to the device as a CXL.mem request and waits for the answer)
    ver[pages]     u32: bumped by the device whenever a page stops being DIRECT
    count[pages]   u32: accesses QEMU completed directly (the firmware reads them,
                   so it sees all traffic, not just the trapped part)

The device makes a page TRAP and bumps its version *before* it moves or poisons the
page's bytes, and DIRECT only after.  QEMU reads the version, checks DIRECT, does
the access, then checks that version and state did not change; if they did, it
redoes the access through the device (a read gets the right bytes; a write
lands again where the page now lives, which is idempotent).  On x86 both
processes' stores reach memory in program order, which is all this needs.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

MAGIC = b"KVPS"
VERSION = 1
HEADER_LAYOUT = (
    ("magic", "4s"),
    ("version", "I"),
    ("page_shift", "I"),
    ("reserved", "I"),
    ("pages", "Q"),
    ("state", "Q"),  # byte offsets of the three arrays
    ("ver", "Q"),
    ("count", "Q"),
)
HEADER = struct.Struct("<" + "".join(code for _, code in HEADER_LAYOUT))


def header_offsets() -> dict[str, int]:
    """Byte offset of each header field (what the C side reads)."""
    codes = [code for _, code in HEADER_LAYOUT]
    return {n: struct.calcsize("<" + "".join(codes[:i])) for i, (n, _) in enumerate(HEADER_LAYOUT)}


HEADER_BYTES = 64
DIRECT, TRAP = 0, 1


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


def layout(pages: int) -> tuple[int, int, int, int]:
    """(state, ver, count) offsets and the file size for ``pages`` pages."""
    off_state = HEADER_BYTES
    off_ver = _align(off_state + pages)
    off_count = _align(off_ver + 4 * pages)
    return off_state, off_ver, off_count, _align(off_count + 4 * pages)


class PageState:
    """The device's side of the table: it owns the file and every state change."""

    def __init__(self, path: str | Path, pages: int, page_shift: int) -> None:
        if pages < 1:
            raise ValueError(f"pages = {pages} must be >= 1")
        self.path = Path(path)
        off_state, off_ver, off_count, size = layout(pages)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._map[: HEADER.size] = HEADER.pack(
            MAGIC, VERSION, page_shift, 0, pages, off_state, off_ver, off_count
        )
        buf = np.frombuffer(self._map, dtype=np.uint8)
        self.state = buf[off_state : off_state + pages]
        self.ver = buf[off_ver : off_ver + 4 * pages].view("<u4")
        self.count = buf[off_count : off_count + 4 * pages].view("<u4")
        self.state[:] = TRAP  # nothing is direct until the device says so

    def trap(self, p: int) -> None:
        """Page ``p`` stops being DIRECT: before its bytes move or turn poisoned."""
        self.state[p] = TRAP
        self.ver[p] += 1

    def direct(self, p: int) -> None:
        """Page ``p`` may be accessed directly: after its bytes are in the DRAM file."""
        self.state[p] = DIRECT

    def set_all(self, direct: NDArray) -> None:
        self.ver[:] += 1
        self.state[:] = np.where(direct, DIRECT, TRAP)

    def direct_accesses(self) -> int:
        """Accesses QEMU completed against the DRAM file (the fast path)."""
        return int(self.count.sum(dtype=np.uint64))

    def close(self) -> None:
        for name in ("state", "ver", "count"):
            setattr(self, name, None)
        try:
            self._map.close()
        except BufferError:  # a view still alive elsewhere: the OS unmaps at exit
            pass
