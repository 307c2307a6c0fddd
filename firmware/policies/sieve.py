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
from .queued import NONE, WALK_AUDITED, QueuePolicy

_TURN = np.int64(1) << 40  # > any sequence number: one full turn of the hand


@register
class SievePolicy(QueuePolicy):
    name = "sieve"
    not_audited = (
        "the hand's position and the visited bits it clears are not in an entry's "
        "own history; " + WALK_AUDITED
    )
    summary = "SIEVE: FIFO queue with visited bits and a moving hand (NSDI'24)"
    columns = {**QueuePolicy.columns, "visited": (np.bool_, False)}

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.hand = NONE  # the entry the hand's next look starts from (NONE: the tail)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        reuse = self.first_reads(ids)
        self.visited[np.asarray(ids, dtype=np.int64)[reuse]] = True

    def _hand_seq(self) -> int:
        return 0 if self.hand == NONE else int(self.seq[self.hand])

    def _start(self, seqs: NDArray) -> NDArray:
        """Cyclic distance of queue positions from the hand."""
        h = self._hand_seq()
        return np.where(seqs >= h, seqs - h, seqs - h + _TURN)

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        ids = np.asarray(ids, dtype=np.int64)
        dist = self._start(self.seq[ids])
        return self.arriving_last(ids, -(dist + self.visited[ids].astype(np.int64) * _TURN))

    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        ok, newer = self._ok, self.newer
        victims: list[int] = []
        gone: set[int] = set()
        cleared: set[int] = set()
        i = self.tail[1] if self.hand == NONE else self.hand
        while len(victims) < k:
            if i == NONE:  # past the head: the hand wraps to the tail
                i = self.tail[1]
            if ok[i] and i not in gone:
                if self.visited[i] and i not in cleared:
                    cleared.add(i)
                else:
                    victims.append(i)
                    gone.add(i)
            i = newer[i]
        # the hand stops just after the last victim, past entries that leave or have not
        # joined yet; past the head of the queue it is at the tail
        arriving = set(self._arriving.tolist())
        while i != NONE and (i in gone or i in arriving):
            i = newer[i]
        hand = i if victims else self.hand
        return np.asarray(victims, np.int64), {
            "cleared": np.asarray(sorted(cleared - gone), np.int64),
            "hand": hand,
        }

    def commit(self, plan: dict) -> None:
        super().commit(plan)
        self.visited[plan["cleared"]] = False
        self.hand = plan["hand"]

    def leave(self, i: int) -> None:
        if i == self.hand:  # the hand moves on to the next newer entry
            self.hand = self.newer[i]
        super().leave(i)
        self.visited[i] = False
