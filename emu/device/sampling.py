"""Page hotness without a trap on every access, as Linux's tiering learns it (DAMON,
idle-page tracking): with DIRECT pages mapped into the guest as RAM (a patched QEMU's
``kvcxl-alias=on``) the device no longer sees their accesses, so at each step's end it
traps a random sample of them (``rate`` of the DIRECT pages of a window, seeded) and
counts the first touch of each: that access comes to the device as a CXL.mem request,
after which the page is DIRECT (and mapped) again.  Pages the device traps anyway (on
NVMe, poisoned, trapped for good) are seen on every access, sampled or not.

The step's touched pages are then estimated as the touches seen on always-visible pages
plus those on sampled pages divided by ``rate`` (:meth:`PageSampler.estimate`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .pagestate import DIRECT, PageState


class PageSampler:
    """Samples the DIRECT pages of DPA pages ``[first, last]`` at ``rate`` per step."""

    def __init__(self, first: int, last: int, rate: float, seed: int = 0) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"sample rate {rate} must be in (0, 1]")
        if last < first:
            raise ValueError(f"page window [{first}, {last}] is empty")
        self.first, self.last, self.rate = first, last, rate
        self.rng = np.random.default_rng(seed)
        n = last - first + 1
        self.armed = np.zeros(n, dtype=bool)  # sampled and not touched yet
        self.sampled = np.zeros(n, dtype=bool)  # sampled this step
        self.visible = np.zeros(n, dtype=bool)  # not DIRECT at arm time: every access seen
        self.steps = 0

    def arm(self, ps: PageState) -> int:
        """A new step: trap a fresh sample of the window's DIRECT pages; returns its size."""
        window = slice(self.first, self.last + 1)
        direct = ps.state[window] == DIRECT
        self.sampled = direct & (self.rng.random(direct.size) < self.rate)
        self.visible = ~direct
        for i in np.flatnonzero(self.sampled).tolist():
            ps.trap(self.first + i)
        self.armed = self.sampled.copy()
        self.steps += 1
        return int(self.sampled.sum())

    def touched(self, p: int) -> bool:
        """A trapped access to page ``p``: True when it is a sampled page's first touch
        (the caller makes the page DIRECT again)."""
        i = p - self.first
        if 0 <= i < self.armed.size and self.armed[i]:
            self.armed[i] = False
            return True
        return False

    def estimate(self, touched_pages: NDArray) -> float:
        """Pages of the window touched during the step, estimated from those seen."""
        i = np.asarray(touched_pages, dtype=np.int64) - self.first
        i = i[(i >= 0) & (i < self.sampled.size)]
        return float(self.visible[i].sum() + self.sampled[i].sum() / self.rate)
