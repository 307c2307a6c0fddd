"""S3-FIFO (Yang et al., SOSP'23): a small FIFO, a main FIFO, and a ghost FIFO of ids.

A new entry enters the small queue, or the main queue if its id is in the ghost (which
takes it out of the ghost).  A reuse adds one to its counter.  To evict: if the main
queue holds more than its share (capacity − small share) or the small queue is empty,
evict from main — its tail entry with a counter above zero is moved to the head with
min(counter, 3) − 1 (a 2-bit CLOCK), one at zero is the victim; otherwise take the small
queue's tail — with a counter ≥ ``s3fifo_move_threshold`` it moves to the head of main with
counter 0 (and the walk goes on in small), else it is the victim and its id enters the
ghost (oldest ghost id dropped beyond ``s3fifo_ghost_ratio`` × capacity).

This is libCacheSim's S3FIFO step for step (its sizes are bytes: the small share is
trunc(capacity × ratio), the main queue is over when it holds more than capacity − that),
checked hit for hit in tests/test_firmware_libcachesim.py.  One deliberate difference:
libCacheSim refuses to cache an object when the small queue cannot hold two (its
``obj_size >= small size`` check), which demand paging cannot do; kvcxl needs
``s3fifo_small_ratio × capacity >= 2`` and says so.

The victim order has no closed form here (main's occupancy changes as the small queue
promotes), so ``priority`` is the entry's rank in the walk over every eligible entry:
the top-k audit then checks the selection only, and the walk itself is checked against
the reference engine and libCacheSim (docs/policy.md).
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray

from ..params import REAL, Param, in_range
from ..policy_params import declare
from ..table import grow
from .base import Tick, register
from .queued import QueuePolicy

S3FIFO_SMALL_RATIO = Param(
    "(0, 1)",
    in_range(1e-6, 1 - 1e-6),
    REAL,
    "S3-FIFO's small queue share of the capacity (libCacheSim fifo-size-ratio).",
    default=0.10,
)
S3FIFO_GHOST_RATIO = Param(
    "[0, 4]",
    in_range(0.0, 4.0),
    REAL,
    "S3-FIFO's ghost queue length as a share of the capacity, in entry ids "
    "(libCacheSim ghost-size-ratio).",
    default=0.90,
)
S3FIFO_MOVE_THRESHOLD = Param(
    "[1, 16] reuses",
    in_range(1, 16),
    int,
    "Reuses in the small queue that move an entry to the main queue instead of evicting "
    "it (libCacheSim move-to-main-threshold).",
    default=2,
)
SMALL, MAIN = 1, 2
MAIN_CAP = 3  # main's counter saturates here (2 bits)


@register
class S3FifoPolicy(QueuePolicy):
    name = "s3fifo"
    summary = "S3-FIFO: small + main FIFO queues and a ghost of ids (SOSP'23)"
    columns = {**QueuePolicy.columns, "queue": (np.int8, 0), "freq": (np.int64, 0)}
    parameters = declare(
        {
            "s3fifo_small_ratio": S3FIFO_SMALL_RATIO,
            "s3fifo_ghost_ratio": S3FIFO_GHOST_RATIO,
            "s3fifo_move_threshold": S3FIFO_MOVE_THRESHOLD,
        }
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # The ghost outlives its entries (not metadata of a resident entry): -1 = absent,
        # else its ghost sequence number (oldest leaves first).
        self.ghost = np.full(16, -1, np.int64)
        self.ghost_counter = 0
        self.n_ghost = 0
        self._ghosted_in = set()  # ids of the current admission that came from the ghost

    def set_capacity(self, capacity: int) -> None:
        super().set_capacity(capacity)
        small = int(capacity * self.params.s3fifo_small_ratio)
        if capacity and small < 2:
            raise ValueError(
                f"s3fifo: the small queue holds trunc({capacity} × "
                f"s3fifo_small_ratio={self.params.s3fifo_small_ratio}) = {small} entries; "
                "it must hold at least 2 (a larger capacity or ratio)"
            )
        self.small_len = small
        self.main_share = capacity - capacity * self.params.s3fifo_small_ratio
        self.ghost_len = int(capacity * self.params.s3fifo_ghost_ratio)

    def ensure(self, n: int) -> None:
        super().ensure(n)
        self.ghost = grow(self.ghost, n, -1)

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        super().on_insert(ids, tick)
        back = self.ghost[ids] >= 0
        self.ghost[ids[back]] = -1
        self.n_ghost -= int(np.count_nonzero(back))
        self._ghosted_in = set(ids[back].tolist())
        self._place(ids)

    def _place(self, ids: NDArray) -> None:
        """Queue of admitted ``ids``, as libCacheSim decides it once room is made: main if
        the id was in the ghost, else small — or main when small is full and main is not
        (libCacheSim's S3FIFO since its SOSP version, S3FIFOv0)."""
        members = self.members()
        n_small = int(np.count_nonzero(self.queue[members] == SMALL))
        n_main = int(np.count_nonzero(self.queue[members] == MAIN))
        for i in ids.tolist():
            to_main = i in self._ghosted_in or (
                n_small + 1 > self.small_len and n_main + 1 <= self.main_share
            )
            self.queue[i] = MAIN if to_main else SMALL
            n_main += to_main
            n_small += not to_main

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        np.add.at(self.freq, ids[self.first_reads(ids)], 1)

    def walk(self, eligible: NDArray, k: int, tick: Tick) -> tuple[NDArray, dict]:
        by_seq = eligible[np.argsort(self.seq[eligible], kind="stable")]
        q = self.queue[by_seq]
        small = deque(int(i) for i in by_seq[q == SMALL])
        main = deque(int(i) for i in by_seq[q == MAIN])
        freq = {int(i): int(self.freq[i]) for i in by_seq}
        where = {int(i): int(self.queue[i]) for i in by_seq}
        members = self.members()  # occupancy counts every queued entry, offered or not
        n_main = int(np.count_nonzero(self.queue[members] == MAIN))
        victims: list[int] = []
        moved: list[int] = []  # to the head of main, in order
        while len(victims) < k:
            if (n_main > self.main_share or not small) and main:
                i = main.popleft()
                if freq[i] >= 1:
                    freq[i] = min(freq[i], MAIN_CAP) - 1
                    main.append(i)
                    moved.append(i)
                else:
                    victims.append(i)
                    n_main -= 1
            elif small:
                while small:
                    i = small.popleft()
                    if freq[i] >= self.params.s3fifo_move_threshold:
                        freq[i] = 0
                        where[i] = MAIN
                        main.append(i)
                        moved.append(i)
                        n_main += 1
                    else:
                        victims.append(i)
                        break
            else:  # nothing offered in either queue (k never exceeds what is offered)
                raise AssertionError("s3fifo walk ran out of entries")
        last = {i: n for n, i in enumerate(moved)}
        gone = set(victims)
        movers = np.asarray(sorted((i for i in last if i not in gone), key=last.get), np.int64)
        return np.asarray(victims, np.int64), {
            "moved": movers,
            "set": {
                "freq": (movers, np.asarray([freq[i] for i in movers], np.int64)),
                "queue": (movers, np.full(movers.size, MAIN, np.int8)),
            },
            "ghosted": np.asarray([i for i in victims if where[i] == SMALL], np.int64),
        }

    def commit(self, plan: dict) -> None:
        super().commit(plan)
        arriving = self._arriving[self.seq[self._arriving] >= 0]
        self._place(arriving)  # now that the walk has made room
        for i in plan["ghosted"]:  # in eviction order
            if self.ghost[i] < 0:
                self.ghost[i] = self.ghost_counter
                self.ghost_counter += 1
                self.n_ghost += 1
        over = self.n_ghost - self.ghost_len
        if over > 0:
            held = np.flatnonzero(self.ghost >= 0)
            oldest = held[np.argsort(self.ghost[held], kind="stable")[:over]]
            self.ghost[oldest] = -1
            self.n_ghost -= over

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        ids = np.asarray(ids, dtype=np.int64)
        victims, _ = self.walk(ids, ids.size, tick)
        rank = np.empty(ids.size, np.int64)
        rank[np.searchsorted(np.sort(ids), victims)] = np.arange(victims.size)
        return -rank[np.argsort(np.argsort(ids))]

    def leave(self, ids: NDArray) -> None:
        super().leave(ids)
        self.queue[ids] = 0
        self.freq[ids] = 0
