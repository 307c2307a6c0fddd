"""SIEVE (Zhang et al., NSDI'24): one FIFO queue, a visited bit per entry, and a hand.

A reuse sets the entry's visited bit.  To evict, the hand moves from where it stopped
toward the head (newer entries); a visited entry it passes has its bit cleared and stays
in place, the first unvisited one is the victim, and the hand stops just after it.  At the
head it wraps to the tail (the oldest entry).  Entries never move, so a new entry lands
at the head, behind the hand.  libCacheSim's Sieve is this algorithm (checked hit for
hit in tests/test_firmware_libcachesim.py).

The closed form the audit compares with the walk: an entry's distance from the hand in
the cyclic queue order, plus one full turn if it is visited (the hand reaches every
unvisited entry before it comes back to a visited one, whose bit it cleared on the way).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .base import Tick, register
from .queued import QueuePolicy

_TURN = np.int64(1) << 40  # > any sequence number: one full turn of the hand


@register
class SievePolicy(QueuePolicy):
    name = "sieve"
    summary = "SIEVE: FIFO queue with visited bits and a moving hand (NSDI'24)"
    columns = {**QueuePolicy.columns, "visited": (np.bool_, False)}

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.hand = 0  # sequence number the hand's next look starts from (0: the tail)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        reuse = self.first_reads(ids)
        self.visited[np.asarray(ids, dtype=np.int64)[reuse]] = True

    def _start(self, seqs: NDArray) -> NDArray:
        """Cyclic distance of queue positions from the hand."""
        return np.where(seqs >= self.hand, seqs - self.hand, seqs - self.hand + _TURN)

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        ids = np.asarray(ids, dtype=np.int64)
        dist = self._start(self.seq[ids])
        return -(dist + self.visited[ids].astype(np.int64) * _TURN)

    def walk(self, eligible: NDArray, k: int, tick: Tick) -> tuple[NDArray, dict]:
        order = eligible[np.argsort(self._start(self.seq[eligible]), kind="stable")]
        visited = self.visited[order].copy()
        victims: list[int] = []
        cleared: list[int] = []
        i, n = 0, order.size
        gone = np.zeros(n, bool)
        while len(victims) < k:
            if not gone[i]:
                if visited[i]:
                    visited[i] = False
                    cleared.append(int(order[i]))
                else:
                    victims.append(int(order[i]))
                    gone[i] = True
                    last = int(self.seq[order[i]])
            i = (i + 1) % n
        # the hand stops just after the last victim; past the head of the queue (no older
        # entry remains beyond it; arriving entries are not in the queue yet) it is at the tail
        beyond = self.members()
        if victims:
            beyond = np.setdiff1d(beyond[self.seq[beyond] > last], victims)
        hand = (last + 1 if beyond.size else 0) if victims else self.hand
        return np.asarray(victims, np.int64), {"cleared": np.asarray(cleared, np.int64),
                                                "hand": hand}  # fmt: skip

    def commit(self, plan: dict) -> None:
        super().commit(plan)
        self.visited[plan["cleared"]] = False
        self.hand = plan["hand"]

    def leave(self, ids: NDArray) -> None:
        super().leave(ids)
        self.visited[ids] = False
