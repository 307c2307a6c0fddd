"""Which KV entries the host read, learned from the device's own memory traffic.

With a host KV cache in device memory (:meth:`Type3Device.open_kv`: entry ``i`` at DPA
``base + i·entry_bytes``), every host access to it either completed in a patched QEMU
against the DRAM file, counted per page in the shared page-state table, or came to the
device as a CXL.mem request, counted per page here.  At each step's end the device takes
the difference of those per-page counts since the last one and maps the pages touched to
entries: the entries the host read from device memory during the step.  It needs no
word from the host about which entries it read.

The host's attention reports still say which entries each layer attended to, with their
weights; of those, the ones not in the host's own memory (the firmware's misses), and the
entries the firmware admitted (which the host copies in), are the reads the host must
have made.  Each step the two sets are compared, so a read the host made without
reporting it, or a report the traffic does not bear out, is counted.  Exact when
``entry_bytes`` is a multiple of the page; with smaller entries a page read marks every
entry it holds.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


class KvTraffic:
    def __init__(
        self, base: int, entry_bytes: int, n_entries: int, page_shift: int, accesses: NDArray
    ) -> None:
        self.base, self.entry_bytes, self.n_entries = base, entry_bytes, n_entries
        self.page_shift = page_shift
        self.first_page = base >> page_shift
        self.last_page = (base + n_entries * entry_bytes - 1) >> page_shift
        self.seen = self._window(accesses)  # counts up to now: what came before is not news
        self.expected: set[int] = set()
        self.steps = 0
        self.entries_read = 0
        self.entries_expected = 0
        self.disagreeing_steps = 0
        self.first_disagreement: dict | None = None
        self.per_step: list[int] = []  # entries learned per step
        # with a PageSampler (DIRECT pages mapped as guest RAM): the touched pages it
        # estimates against the pages the expected entries occupy (the full count)
        self.sampler = None
        self.pages_exact = 0
        self.pages_estimated = 0.0
        self.pages_abs_error = 0.0

    def _window(self, accesses: NDArray) -> NDArray:
        return np.asarray(accesses[self.first_page : self.last_page + 1], dtype=np.int64).copy()

    def expect(self, ids: NDArray) -> None:
        """Entries the host must read from device memory this step (misses, admissions)."""
        self.expected.update(int(i) for i in np.asarray(ids).ravel())

    def entries_of_pages(self, pages: NDArray) -> set[int]:
        """The entries that lie (partly) in these DPA pages."""
        pb, eb = 1 << self.page_shift, self.entry_bytes
        out: set[int] = set()
        for p in np.asarray(pages, dtype=np.int64).tolist():
            lo = max(p * pb - self.base, 0) // eb
            hi = min(((p + 1) * pb - 1 - self.base) // eb, self.n_entries - 1)
            out.update(range(lo, hi + 1))
        return out

    def pages_of_entries(self, ids: set[int]) -> set[int]:
        """The DPA pages these entries occupy."""
        shift, eb = self.page_shift, self.entry_bytes
        out: set[int] = set()
        for e in ids:
            lo = self.base + e * eb
            out.update(range(lo >> shift, ((lo + eb - 1) >> shift) + 1))
        return out

    def step_end(self, step: int, accesses: NDArray, skip: set[int]) -> set[int]:
        """The step is over: the entries its traffic touched (returned), compared with the
        expected ones (``skip``: entries the host does not read, e.g. poisoned)."""
        now = self._window(accesses)
        touched = np.flatnonzero(now != self.seen) + self.first_page
        self.seen = now
        learned = self.entries_of_pages(touched)
        want = self.expected - skip
        self.steps += 1
        self.entries_read += len(learned)
        self.entries_expected += len(want)
        self.per_step.append(len(learned))
        if self.sampler is not None:
            exact = len(self.pages_of_entries(want))
            est = self.sampler.estimate(touched)
            self.pages_exact += exact
            self.pages_estimated += est
            self.pages_abs_error += abs(est - exact)
        if learned != want:
            self.disagreeing_steps += 1
            if self.first_disagreement is None:
                self.first_disagreement = {
                    "step": int(step),
                    "read_not_expected": sorted(learned - want)[:16],
                    "expected_not_read": sorted(want - learned)[:16],
                }
        self.expected = set()
        return learned

    def stats(self) -> dict:
        return {
            "steps": self.steps,
            "entries_read": self.entries_read,  # learned from the traffic
            "entries_expected": self.entries_expected,  # from the reports and admissions
            "disagreeing_steps": self.disagreeing_steps,
            "first_disagreement": self.first_disagreement,
            "entries_read_per_step": self.per_step[:64],
            "sampling": None
            if self.sampler is None
            else {
                "rate": self.sampler.rate,
                "pages_read": self.pages_exact,  # the full count: the reads reported
                "pages_estimated": round(self.pages_estimated, 1),
                # sum over steps of |estimate - full count| / sum of the full counts
                "error": round(self.pages_abs_error / max(self.pages_exact, 1), 4),
            },
        }
