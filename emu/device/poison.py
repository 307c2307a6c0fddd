"""The device's poison list: one list of poisoned 64-byte lines, each with its source.

QEMU's Type-3 device keeps one poison list whose records carry a type (CXL 2.0 §8.2.9.5.4.1,
Get Poison List: 1 external, 2 internal, 3 injected); so does this device, per DPA line.
Everything that asks whether a line is poisoned (CXL.mem reads, byte-range reads, the
page-state table's direct pages, the KV traffic's poisoned entries) and the mailbox's Get
/ Inject / Clear Poison read this one list, so the answer and the record's source cannot
disagree.
"""

from __future__ import annotations

LINE_SHIFT = 6  # 64-byte lines
LIST_MAX = 256  # injected lines the device can track (QEMU uses the same limit)
SOURCE_EXTERNAL = 0x1  # the host wrote poisoned data (RwD poison bit, the socket's flag)
SOURCE_INJECTED = 0x3  # the mailbox's Inject Poison


class PoisonList(dict[int, int]):
    """Poisoned DPA line numbers, each mapped to the source that poisoned it (a dict: the
    data path's ``line in poison`` and ``if poison`` stay as fast as a set's)."""

    @property
    def injected(self) -> int:
        """Lines whose poison the mailbox injected (bounded by :data:`LIST_MAX`)."""
        return sum(s == SOURCE_INJECTED for s in self.values())

    def add(self, first: int, last: int, source: int = SOURCE_EXTERNAL) -> None:
        """Lines ``first … last`` are poisoned.  Poison the host writes over a line keeps
        the line's earlier source; an injection makes it injected (as a retried Inject
        Poison on an externally poisoned line reports it)."""
        if source == SOURCE_INJECTED:
            for line in range(first, last + 1):
                self[line] = source
        else:
            for line in range(first, last + 1):
                self.setdefault(line, source)

    def discard(self, line: int) -> None:
        self.pop(line, None)

    def any_in(self, first: int, last: int) -> bool:
        """Some line of ``first … last`` is poisoned."""
        if not self:
            return False
        if last - first + 1 > len(self):
            return any(first <= line <= last for line in self)
        return any(line in self for line in range(first, last + 1))

    def lines_of(self, dpa: int, n: int) -> tuple[int, int]:
        """(first, last) line of the bytes ``[dpa, dpa + n)``."""
        return dpa >> LINE_SHIFT, (dpa + n - 1) >> LINE_SHIFT

    def records(self, first: int, end: int) -> list[tuple[int, int, int]]:
        """The poisoned lines in ``[first, end)`` as (start line, lines, source) runs of
        consecutive lines with one source, in DPA order: Get Poison List's records."""
        out: list[tuple[int, int, int]] = []
        for line in sorted(x for x in self if first <= x < end):
            src = self[line]
            if out and out[-1][0] + out[-1][1] == line and out[-1][2] == src:
                s, n, t = out[-1]
                out[-1] = (s, n + 1, t)
            else:
                out.append((line, 1, src))
        return out
