"""S3-FIFO (Yang et al., SOSP'23): a small FIFO, a main FIFO, and a ghost FIFO of ids.

A new entry enters the small queue, or the main queue if its id is in the ghost (which
takes it out of the ghost).  A reuse adds one to its counter.  To evict: if the main
queue holds more than its share (capacity − small share) or the small queue is empty,
evict from main — its tail entry with a counter above zero is moved to the head with
min(counter, 3) − 1 (a 2-bit CLOCK), one at zero is the victim; otherwise take the small
queue's tail — with a counter ≥ ``s3fifo_move_threshold`` it moves to the head of main with
counter 0 (and the walk goes on in small), else it is the victim and its id enters the
ghost (oldest ghost id dropped beyond ``s3fifo_ghost_ratio`` × capacity).  A queue that
offers nothing (its entries pinned or read in this batch) is passed over: main's turn
then goes to small.

Placement rule of libCacheSim's current S3FIFO: until the cache has first evicted, a new
entry that finds small full goes to main.  This is libCacheSim's S3FIFO (0.3.5 wheel) step
for step, checked hit for hit in tests/test_firmware_libcachesim.py.  Its sizes are bytes
(small = trunc(bytes × ratio), main = the rest), which for entries of kilobytes is the
real-valued capacity × ratio used here.  libCacheSim refuses an object that fills the
small queue, which demand paging cannot do; kvcxl needs capacity × ratio > 1.

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
from .base import CapacityTooSmall, Tick, register
from .queued import NONE, WALK_AUDITED, QueuePolicy

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
    not_audited = (
        "which queue an entry is in depends on the small queue's walk, not on its own history; "
        + WALK_AUDITED
    )
    summary = "S3-FIFO: small + main FIFO queues and a ghost of ids (SOSP'23)"
    columns = {**QueuePolicy.columns, "freq": (np.int64, 0)}
    n_queues = 2
    parameters = {
        "s3fifo_small_ratio": S3FIFO_SMALL_RATIO,
        "s3fifo_ghost_ratio": S3FIFO_GHOST_RATIO,
        "s3fifo_move_threshold": S3FIFO_MOVE_THRESHOLD,
    }

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # The ghost outlives its entries (not metadata of a resident entry): a FIFO of ids.
        self.ghost: dict[int, None] = {}  # insertion order = ghost order, oldest first
        self._ghosted_in: set[int] = set()  # ids of the current admission found in the ghost

    def set_capacity(self, capacity: int) -> None:
        super().set_capacity(capacity)
        # Real-valued shares, as libCacheSim's byte sizes amount to for entries of many
        # bytes: small is full at capacity × ratio entries, main is over beyond the rest.
        small = capacity * self.params.s3fifo_small_ratio
        if capacity and small <= 1:
            raise CapacityTooSmall(
                f"s3fifo: the small queue holds {capacity} × "
                f"s3fifo_small_ratio={self.params.s3fifo_small_ratio} = {small:g} entries; "
                "it must hold more than 1 (a larger capacity or ratio)"
            )
        self.small_share = small
        self.main_share = capacity - small
        self.ghost_len = int(capacity * self.params.s3fifo_ghost_ratio)
        self.has_evicted = False  # before the first eviction a full small sends to main

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        back = [i for i in ids.tolist() if i in self.ghost]
        for i in back:
            del self.ghost[i]
        self._ghosted_in = set(back)
        super().on_insert(ids, tick)

    def place(self, ids: NDArray) -> None:
        """Main if the id was in the ghost, else small — except that until the cache has
        first evicted, an entry that finds small full goes to main (libCacheSim's S3FIFO
        as the 0.3.5 wheel runs it); arrivals are placed one after another."""
        n_small = self.live(SMALL)
        for i in ids.tolist():
            warm = not self.has_evicted and n_small >= self.small_share
            to_main = i in self._ghosted_in or warm
            self.push(i, MAIN if to_main else SMALL)
            n_small += not to_main

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        np.add.at(self.freq, ids[self.first_reads(ids)], 1)

    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        small = self.cursor(SMALL)
        main_extra: deque[int] = deque()  # entries the walk moved to main's head, in order
        main_live = self.cursor(MAIN)
        main_next = next(main_live, NONE)  # main's next offered entry not yet looked at
        n_main = self.live(MAIN)
        threshold = self.params.s3fifo_move_threshold
        freq: dict[int, int] = {}
        victims: list[int] = []
        ghosted: list[int] = []
        moved: list[tuple[int, int]] = []  # (id, queue) in the order they reached a head
        small_next = next(small, NONE)  # the offered tail of small (NONE: none left)
        while len(victims) < k:
            main_offers = main_next != NONE or bool(main_extra)
            # from main when it is over its share or small offers nothing, unless main
            # offers nothing (its entries pinned or read in this batch): then small
            if (n_main > self.main_share or small_next == NONE) and main_offers:
                if main_next != NONE:
                    i, main_next = main_next, next(main_live, NONE)
                else:
                    i = main_extra.popleft()
                f = freq.get(i, int(self.freq[i]))
                if f >= 1:
                    freq[i] = min(f, MAIN_CAP) - 1
                    main_extra.append(i)
                    moved.append((i, MAIN))
                else:
                    victims.append(i)
                    n_main -= 1
            elif small_next == NONE:  # nothing offered in either queue (k never exceeds it)
                raise AssertionError("s3fifo walk ran out of entries")
            else:
                while small_next != NONE:
                    i, small_next = small_next, next(small, NONE)
                    if self.freq[i] >= threshold:
                        freq[i] = 0
                        main_extra.append(i)
                        moved.append((i, MAIN))
                        n_main += 1
                    else:
                        victims.append(i)
                        ghosted.append(i)
                        break
        gone = set(victims)
        kept = np.asarray([i for i in freq if i not in gone], np.int64)
        return np.asarray(victims, np.int64), {
            "moved": moved,
            "set": {"freq": (kept, np.asarray([freq[int(i)] for i in kept], np.int64))},
            "ghosted": ghosted,
        }

    def commit(self, plan: dict) -> None:
        super().commit(plan)
        self.has_evicted = self.has_evicted or bool(plan["victims"].size)
        if self.ghost_len <= 0:
            return
        for i in plan["ghosted"]:  # in eviction order; an id already there keeps its place
            if i not in self.ghost:
                self.ghost[i] = None
                if len(self.ghost) > self.ghost_len:
                    del self.ghost[next(iter(self.ghost))]

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return self.walk_rank(ids, tick)

    def leave(self, i: int) -> None:
        super().leave(i)
        self.freq[i] = 0
