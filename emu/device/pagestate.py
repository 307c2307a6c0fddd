"""The page-state table the device shares with a patched QEMU (docs/qemu.md, "Memory path").

One file, mapped by the device service and by QEMU's ``cxl-type3`` (property
``kvcxl-state``), little endian::

    header (64 B): magic "KVPS", u32 version, u32 page_shift, u32 0, u64 pages,
                   u64 state offset, u64 version offset, u64 count offset,
                   u32 map_req (device: +1 after any state change), u32 map_ack
                   (QEMU: the map_req its guest mappings follow), u32 alias (QEMU: 1
                   while it maps DIRECT pages into the guest as RAM), u32 mapped offset
    state[pages]   u8: 0 = DIRECT (in device DRAM, not poisoned: QEMU may complete
                   the access against the shared DRAM file), 1 = TRAP (QEMU sends the
                   access to the device as a CXL.mem request and waits for the answer)
    ver[pages]     u32: bumped by the device whenever a page stops being DIRECT
    count[pages]   u32: accesses QEMU completed directly (the firmware reads them,
                   so it sees all traffic, not just the trapped part)
    mapped[pages]  u8: written by QEMU, 1 while a vCPU may reach the page as RAM (set
                   before the mapping exists, cleared once no vCPU can use it)

The device makes a page TRAP and bumps its version *before* it moves or poisons the
page's bytes, and DIRECT only after.  QEMU reads the version, checks DIRECT, does
the access, then checks that version and state did not change; if they did, it
redoes the access through the device (a read gets the right bytes; a write
lands again where the page now lives, which is idempotent).  On x86 both
processes' stores reach memory in program order, which is all this needs.

When QEMU maps DIRECT pages into the guest as RAM (``alias`` = 1, its
``kvcxl-alias=on``), a guest access to such a page never reaches QEMU's check, so a
trap takes effect only once QEMU has removed the mapping and every vCPU has dropped
it: QEMU then writes ``map_ack``.  The device keeps a page's bytes in the DRAM file
until :meth:`PageState.unmapped` says so (docs/qemu.md, "DIRECT pages as guest RAM").
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

MAGIC = b"KVPS"
VERSION = 2
HEADER_LAYOUT = (
    ("magic", "4s"),
    ("version", "I"),
    ("page_shift", "I"),
    ("reserved", "I"),
    ("pages", "Q"),
    ("state", "Q"),  # byte offsets of the three arrays
    ("ver", "Q"),
    ("count", "Q"),
    ("map_req", "I"),  # the device's: +1 after any state change
    ("map_ack", "I"),  # QEMU's: the map_req its guest mappings have caught up with
    ("alias", "I"),  # QEMU's: 1 while it maps DIRECT pages into the guest as RAM
    ("mapped", "I"),  # byte offset of mapped[pages], the array QEMU publishes
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


def layout(pages: int) -> tuple[int, int, int, int, int]:
    """(state, ver, count, mapped) offsets and the file size for ``pages`` pages."""
    off_state = HEADER_BYTES
    off_ver = _align(off_state + pages)
    off_count = _align(off_ver + 4 * pages)
    off_mapped = _align(off_count + 4 * pages)
    return off_state, off_ver, off_count, off_mapped, _align(off_mapped + pages)


class PageState:
    """The device's side of the table: it owns the file and every state change."""

    def __init__(self, path: str | Path, pages: int, page_shift: int) -> None:
        if pages < 1:
            raise ValueError(f"pages = {pages} must be >= 1")
        self.path = Path(path)
        off_state, off_ver, off_count, off_mapped, size = layout(pages)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._map[: HEADER.size] = HEADER.pack(
            MAGIC, VERSION, page_shift, 0, pages, off_state, off_ver, off_count, 0, 0, 0, off_mapped
        )
        buf = np.frombuffer(self._map, dtype=np.uint8)
        self.state = buf[off_state : off_state + pages]
        self.ver = buf[off_ver : off_ver + 4 * pages].view("<u4")
        self.count = buf[off_count : off_count + 4 * pages].view("<u4")
        self.mapped = buf[off_mapped : off_mapped + pages]  # QEMU's: mapped as RAM now
        self.state[:] = TRAP  # nothing is direct until the device says so
        hdr = np.frombuffer(self._map, dtype="<u4", count=HEADER_BYTES // 4)
        offs = header_offsets()
        self._req = hdr[offs["map_req"] // 4 : offs["map_req"] // 4 + 1]
        self._ack = hdr[offs["map_ack"] // 4 : offs["map_ack"] // 4 + 1]
        self._alias = hdr[offs["alias"] // 4 : offs["alias"] // 4 + 1]
        # per page: the map_req of the trap that last took it off DIRECT
        self.trap_gen = np.zeros(pages, dtype=np.uint32)

    def _changed(self) -> int:
        """Publish a state change to QEMU (after the states: x86 keeps the order)."""
        self._req[0] += 1
        return int(self._req[0])

    def trap(self, p: int) -> None:
        """Page ``p`` stops being DIRECT: before its bytes move or turn poisoned."""
        was_direct = self.state[p] == DIRECT
        self.state[p] = TRAP
        self.ver[p] += 1
        if was_direct:
            self.trap_gen[p] = self._changed()

    def direct(self, p: int) -> None:
        """Page ``p`` may be accessed directly: after its bytes are in the DRAM file."""
        if self.state[p] != DIRECT:
            self.state[p] = DIRECT
            self._changed()

    def set_all(self, direct: NDArray) -> None:
        self.ver[:] += 1
        self.state[:] = np.where(direct, DIRECT, TRAP)
        self.trap_gen[:] = self._changed()

    @property
    def aliasing(self) -> bool:
        """QEMU maps DIRECT pages into the guest as RAM (``kvcxl-alias=on``)."""
        return bool(self._alias[0])

    def unmapped(self, p: int) -> bool:
        """No guest access can reach page ``p``'s bytes in the DRAM file without the
        device seeing it: the page is TRAP and QEMU acknowledged the trap's map_req
        (or maps nothing).  Until then its bytes may not leave the DRAM file."""
        if self.state[p] != TRAP:
            return False
        if not self.aliasing:
            return True
        # free-running u32 counters: ack has reached gen when ack - gen < 2^31
        return (int(self._ack[0]) - int(self.trap_gen[p])) % (1 << 32) < (1 << 31)

    def alias_stats(self) -> dict:
        """QEMU's mapping of DIRECT pages as guest RAM, as the table shows it now."""
        return {
            "on": self.aliasing,
            "pages_mapped": int(np.count_nonzero(self.mapped)),
            "map_req": int(self._req[0]),
            "map_ack": int(self._ack[0]),
        }

    def direct_accesses(self) -> int:
        """Accesses QEMU completed against the DRAM file (the fast path)."""
        return int(self.count.sum(dtype=np.uint64))

    def close(self) -> None:
        for name in ("state", "ver", "count", "mapped", "_req", "_ack", "_alias"):
            setattr(self, name, None)
        try:
            self._map.close()
        except BufferError:  # a view still alive elsewhere: the OS unmaps at exit
            pass
