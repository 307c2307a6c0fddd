"""Belady's offline optimum (firmware/policies/belady.py), both variants (``belady`` may
bypass: the run's ``bypass``, from the policy's ``may_bypass``).  Each entry's next read is
kept from the firmware's ``Future`` over the read batches as replayed: its first read on
insert, then per record the next read after that record's batch."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.firmware.policies.belady import NEVER, Future

from ..hooks import Setup

COVERS = (("belady", "float"), ("belady-nobypass", "float"))
STATIC = True  # a key moves only by its entry's own read


class State(NamedTuple):
    nxt: NDArray  # each entry's next read (the priority: farthest first)
    first: NDArray  # each entry's first read
    rec_next: NDArray  # per plan record: its entry's next read after the record's batch


def future(plan: dict[str, NDArray], n: int, per_request: bool) -> tuple[NDArray, NDArray]:
    """Each entry's first read and, per record, the entry's next read after that record's
    batch (the firmware's Future over the read batches as replayed: a batch's time is its
    index among them)."""
    size = np.diff(plan["off"])
    read_rec = np.repeat(plan["read"], size)
    if per_request:  # every read its own batch
        time = np.cumsum(read_rec) - 1
    else:
        time = np.repeat(np.cumsum(plan["read"]) - 1, size)
    ids = plan["ids"]
    fut = Future(ids[read_rec], time[read_rec])
    first = np.asarray(fut.next_use(np.arange(n), -1), np.int64)
    # Future.next_use with each record's own time (its keys: id·span + time, sorted)
    keys, span = fut.keys, fut.span
    q = ids * span + np.minimum(time, span - 1)
    at = np.searchsorted(keys, q, side="right")
    at_c = np.minimum(at, max(keys.size - 1, 0))
    found = (at < keys.size) & (keys[at_c] // span == ids) if keys.size else np.zeros(0, bool)
    nxt = np.where(found, keys[at_c] % span if keys.size else 0, NEVER)
    return first, np.where(read_rec, nxt, NEVER).astype(np.int64)


def build(setup: Setup) -> State:
    first, rec_next = future(setup.plan, setup.n, setup.per_request)
    return State(np.full(setup.n, -1, np.int64), first, rec_next)


@njit(cache=True)
def priority(ps, tab, e, now):  # type: ignore[no-untyped-def]
    return ps.nxt[e]


@njit(cache=True)
def on_insert(ps, e, t):  # type: ignore[no-untyped-def]
    ps.nxt[e] = ps.first[e]  # (a read's on_access sets its next read after this one)


@njit(cache=True)
def on_access(ps, e, j, w, t):  # type: ignore[no-untyped-def]
    ps.nxt[e] = ps.rec_next[j]
    return True
