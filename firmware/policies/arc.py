"""ARC (Megiddo & Modha, FAST'03): two LRU lists T1 (seen once) and T2 (seen again), their
ghosts B1 and B2 (ids only), and an adaptive target ``p`` for T1's size.

A reuse moves an entry to T2's head.  A new entry found in B1 raises p by
max(|B2|/|B1|, 1) (capped at the capacity), found in B2 lowers it by max(|B1|/|B2|, 1)
(floored at 0); either leaves the ghost and joins T2's head, else it joins T1's head.
REPLACE evicts T1's tail into B1 if T1 is non-empty and (|T1| > p, or |T1| = p for a B2
return), or T2 is empty; else T2's tail into B2.  For a new entry that was in no ghost:
if |T1| + |B1| reaches the capacity, B1's oldest id is dropped and REPLACE runs, or with
B1 empty T1's tail is evicted without a ghost; otherwise, when all four lists hold twice
the capacity, B2's oldest id is dropped, then REPLACE.  As in libCacheSim, ghost lists
are trimmed only when the cache evicts.

This is libCacheSim's ARC on objects of one byte (hit for hit,
tests/test_firmware_libcachesim.py).  libCacheSim counts p in bytes but moves it by
max(ratio, 1) *bytes* per ghost hit, so with the CLI's 4 KiB entries its p stays below one
entry and its ARC degenerates; kvcxl follows the published algorithm (p in entries) and
records the CLI-path difference (docs/policy.md).

Batch rule: the pass makes one eviction per arriving entry, in ascending id order, each
under that entry's case (B1 return, B2 return, or new); extra evictions are "new".
There is no closed form; ``priority`` is the rank in a walk over every eligible entry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from .base import Tick, register
from .queued import WALK_AUDITED, QueuePolicy

T1, T2 = 1, 2
NEW, FROM_B1, FROM_B2 = 0, 1, 2


@register
class ArcPolicy(QueuePolicy):
    name = "arc"
    not_audited = (
        "the target size p and the ghost lists depend on every entry's history, not one entry's; "
        + WALK_AUDITED
    )
    summary = "ARC: adaptive recency/frequency lists with ghosts (FAST'03)"
    n_queues = 2

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.p = 0.0  # target size of T1, in entries
        # ghosts outlive their entries: ids, oldest first
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self._case: dict[int, int] = {}  # arriving id -> its case

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self._case = {}
        for i in np.sort(ids).tolist():
            if i in self.b1:
                self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), self.capacity)
                del self.b1[i]
                self._case[i] = FROM_B1
            elif i in self.b2:
                self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)
                del self.b2[i]
                self._case[i] = FROM_B2
            else:
                self._case[i] = NEW
        super().on_insert(ids, tick)

    def admit_queue(self, i: int) -> int:
        return T2 if self._case.get(i, NEW) != NEW else T1

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        for i in ids[self.first_reads(ids)].tolist():  # in read order
            self.unlink(i)
            self.push(i, T2)

    def walk_cases(self) -> list[int]:
        """The case of each eviction of the pass, in order (the arriving entries', by id);
        evictions past the list are NEW."""
        return [self._case[i] for i in sorted(self._case)]

    def walk(self, k: int, tick: Tick) -> tuple[NDArray, dict]:
        t1, t2 = self.cursor(T1), self.cursor(T2)
        n1, n2 = self.live(T1), self.live(T2)
        nt1, nt2 = next(t1, -1), next(t2, -1)  # offered tails
        nb1, nb2 = len(self.b1), len(self.b2)
        new_b1: list[int] = []  # ghosts the pass adds, oldest first
        new_b2: list[int] = []
        g1, g2 = _ghost_order(self.b1, new_b1), _ghost_order(self.b2, new_b2)
        drop: list[int] = []  # ghost ids the pass drops
        victims: list[int] = []
        cases = self.walk_cases()
        cap = self.capacity
        while len(victims) < k:
            case = cases[len(victims)] if len(victims) < len(cases) else NEW
            to_ghost = True
            if case == NEW:
                if n1 + nb1 + 1 > cap:
                    if nb1 > 0:
                        drop.append(next(g1))
                        nb1 -= 1
                    else:
                        to_ghost = False
                elif n1 + nb1 + n2 + nb2 >= 2 * cap and nb2 > 0:
                    drop.append(next(g2))
                    nb2 -= 1
            at_p = n1 == self.p and case == FROM_B2
            from_t1 = (n1 > 0 and (n1 > self.p or at_p)) or n2 == 0
            if not to_ghost:
                from_t1 = True
            if (from_t1 and nt1 == -1) or (not from_t1 and nt2 == -1):
                from_t1 = not from_t1  # the chosen list offers nothing (pinned, read now)
            if from_t1:
                i, nt1 = nt1, next(t1, -1)
                n1 -= 1
                if to_ghost:
                    new_b1.append(i)
                    nb1 += 1
            else:
                i, nt2 = nt2, next(t2, -1)
                n2 -= 1
                new_b2.append(i)
                nb2 += 1
            victims.append(i)
        return np.asarray(victims, np.int64), {"b1": new_b1, "b2": new_b2, "drop": drop}

    def commit(self, plan: dict) -> None:
        super().commit(plan)
        for i in plan["drop"]:
            self.b1.pop(i, None)
            self.b2.pop(i, None)
        for i in plan["b1"]:
            if i not in plan["drop"]:
                self.b1[i] = None
        for i in plan["b2"]:
            if i not in plan["drop"]:
                self.b2[i] = None

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        return self.walk_rank(ids, tick)


def _ghost_order(old: OrderedDict[int, None], new: list[int]) -> Iterator[int]:
    """A ghost list as the walk sees it, oldest first: the stored ids (read, not changed),
    then those the walk adds."""
    yield from old
    j = 0
    while j < len(new):
        yield new[j]
        j += 1
