"""What the queue policies' fast modules share (the modules that import it): the
mechanics of :mod:`kvcxl.firmware.policies.queued` as numba arrays.  Not a policy itself
(the registry skips modules whose name starts with ``_``).

The firmware's queues are doubly linked lists over entry ids; here the same lists live in
``older``/``newer`` arrays with a head, tail and count per queue, and ``seq`` stamps the
order an entry reached its queue's head from the same counter (the closed-form priorities
the victim dumps report read it, so every push the firmware makes is made here too).

The firmware walks the live queues read-only in ``select`` and commits the walk's plan in
``on_evict``; the victim dump reads the priorities in between.  The loop calls ``select``,
then ``priority`` of each victim (dumps only), then ``on_evict`` of each victim: so each
module's ``select`` keeps its plan (the victims in :func:`hold`, the rest in its scratch)
and the first ``on_evict`` of the pass commits all of it (:func:`pending`).

The batch rule (docs/simulator.md "Replay, exactly"): a call's admissions are *arriving*
(``arr``, ascending, ``isarr``) from ``on_admit`` until the pass that follows commits;
the walk does not see them and they are its last victims, lowest id first
(:func:`offer`, :func:`take_arriving`); afterwards the survivors join their queues again
(:func:`survivors`).  An entry's first read after admission is its admission read
(``fresh``, :func:`first_read`).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np
from numba import njit

from kvcxl.firmware.policies.queued import ARRIVING as _ARRIVING
from kvcxl.firmware.policies.queued import NONE as _NONE

from ..hooks import Setup
from ..kernel import sort_ids

NONE = int(_NONE)
ARRIVING = np.int64(_ARRIVING)

# The shared fields of every queue policy's state (the module adds its own after them).
FIELDS = (
    "older", "newer", "seq", "queue", "fresh",  # the linked queues over entry ids
    "head", "tail", "count",  # per queue (index 0 unused)
    "ok", "arr", "isarr", "arrv", "vic", "rank", "sc",  # walk, arrivals, plan, scalars
    "pinned", "stamp",  # the cache's columns (hooks.Setup): what a select_all offers
)  # fmt: skip
# Slots of ``sc`` (int64 scalars the hooks update).
COUNTER = 0  # the next head stamp
NARR = 1  # arriving entries in ``arr``
NV = 2  # victims of the pass held in ``vic``
PENDING = 3  # 1: the held pass is not committed yet
RANKED = 4  # 1: ``rank`` holds the held victims' walk ranks
PASS = 5  # walks so far (stamps of per-walk marks)
ALL = 6  # 0: the walk offers ``ok``'s; 1: every unpinned entry; 2: and not stamped by CALLED
CALLED = 7  # the call whose entries a select_all protects
OWN = 8  # the first slot a module may use for its own scalars
N_SLOTS = 16


def state_class(module: str, own: tuple[str, ...]) -> Any:
    """The state namedtuple of a queue policy module: :data:`FIELDS` then ``own``, defined
    as ``module``'s ``State`` (numba's cache pickles it by that name)."""
    return namedtuple("State", FIELDS + own, module=module)  # type: ignore[misc]


def base(setup: Setup, n_queues: int) -> dict[str, Any]:
    """The shared fields, at the firmware's fills (no entry queued, none arriving)."""
    n = setup.n
    return {
        "older": setup.column(NONE, np.int64), "newer": setup.column(NONE, np.int64),
        "seq": setup.column(-1, np.int64), "queue": setup.column(0, np.int64),
        "fresh": setup.column(False, np.bool_),
        "head": np.full(n_queues + 1, NONE, np.int64),
        "tail": np.full(n_queues + 1, NONE, np.int64),
        "count": np.zeros(n_queues + 1, np.int64),
        "ok": setup.column(False, np.bool_), "arr": np.zeros(n, np.int64),
        "isarr": setup.column(False, np.bool_), "arrv": np.zeros(n, np.int64),
        "vic": np.zeros(n, np.int64), "rank": np.zeros(n, np.int64),
        "sc": np.zeros(N_SLOTS, np.int64), "pinned": setup.pinned, "stamp": setup.stamp,
    }  # fmt: skip


# --- linked lists over ids (queues here, ghost lists in arc and s3fifo) ------------------
@njit(cache=True, inline="always")
def lpush(older, newer, head, tail, count, where, i, q):  # type: ignore[no-untyped-def]
    """Put ``i`` (in no list) at the head (newest end) of list ``q``."""
    h = head[q]
    older[i] = h
    newer[i] = NONE
    if h == NONE:
        tail[q] = i
    else:
        newer[h] = i
    head[q] = i
    count[q] += 1
    where[i] = q


@njit(cache=True, inline="always")
def lunlink(older, newer, head, tail, count, where, i):  # type: ignore[no-untyped-def]
    """Take ``i`` out of its list (no-op in none)."""
    q = where[i]
    if q == 0:
        return
    o, n = older[i], newer[i]
    if o == NONE:
        tail[q] = n
    else:
        newer[o] = n
    if n == NONE:
        head[q] = o
    else:
        older[n] = o
    older[i] = NONE
    newer[i] = NONE
    count[q] -= 1
    where[i] = 0


@njit(cache=True)
def push(ps, i, q):  # type: ignore[no-untyped-def]
    """QueuePolicy.push: ``i`` to the head of queue ``q``, stamped with the next seq."""
    lpush(ps.older, ps.newer, ps.head, ps.tail, ps.count, ps.queue, i, q)
    ps.seq[i] = ps.sc[COUNTER]
    ps.sc[COUNTER] += 1


@njit(cache=True)
def unlink(ps, i):  # type: ignore[no-untyped-def]
    lunlink(ps.older, ps.newer, ps.head, ps.tail, ps.count, ps.queue, i)


@njit(cache=True, inline="always")
def _eligible(ps, e, protect, call):  # type: ignore[no-untyped-def]
    """The one eligibility rule of :func:`offer_all`: not pinned, and (``protect``) not
    touched by ``call``."""
    return not (ps.pinned[e] or (protect and ps.stamp[e] == call))


@njit(cache=True, inline="always")
def offered(ps, i):  # type: ignore[no-untyped-def]
    """Whether queued entry ``i`` is offered to the walk: marked in ``ok`` (:func:`offer`),
    or (:func:`offer_all`) eligible and not arriving."""
    mode = ps.sc[ALL]
    if mode == 0:
        return ps.ok[i]
    return not ps.isarr[i] and _eligible(ps, i, mode == 2, ps.sc[CALLED])


@njit(cache=True)
def next_offered(ps, i):  # type: ignore[no-untyped-def]
    """The first offered entry at or after ``i`` toward the head (QueuePolicy.cursor)."""
    while i != NONE and not offered(ps, i):
        i = ps.newer[i]
    return i


@njit(cache=True)
def live(ps, q):  # type: ignore[no-untyped-def]
    """QueuePolicy.live: queue ``q``'s entries less the arriving ones in it."""
    c = ps.count[q]
    for j in range(ps.sc[NARR]):
        if ps.queue[ps.arr[j]] == q:
            c -= 1
    return c


@njit(cache=True)
def next_pass(ps):  # type: ignore[no-untyped-def]
    """A new stamp for one walk's per-entry marks."""
    ps.sc[PASS] += 1
    return ps.sc[PASS]


# --- events ------------------------------------------------------------------------------
@njit(cache=True)
def admit(ps, adm, na):  # type: ignore[no-untyped-def]
    """QueuePolicy.on_insert's bookkeeping: the call's admissions ``adm[:na]`` become the
    arriving entries, ascending, fresh; the plan of an earlier pass is dropped.  (Their
    columns are at their fills already: every entry leaves with them reset.)"""
    for j in range(ps.sc[NARR]):
        ps.isarr[ps.arr[j]] = False
    for j in range(na):
        ps.arr[j] = adm[j]
    sort_ids(ps.arr, 0, na)
    for j in range(na):
        ps.isarr[ps.arr[j]] = True
        ps.fresh[ps.arr[j]] = True
    ps.sc[NARR] = na
    ps.sc[PENDING] = 0


@njit(cache=True, inline="always")
def first_read(ps, e):  # type: ignore[no-untyped-def]
    """QueuePolicy.first_reads for one record: False for the admission read (and clears
    it), True for a reuse."""
    if ps.fresh[e]:
        ps.fresh[e] = False
        return False
    return True


@njit(cache=True, inline="always")
def arriving_last(ps, e, p):  # type: ignore[no-untyped-def]
    """QueuePolicy.arriving_last for one entry."""
    return ARRIVING if ps.isarr[e] else np.int64(p)


# --- the pass: offer, walk (the module's), take the arriving, hold, commit -----------------
@njit(cache=True)
def offer(ps, cand, m, arrv):  # type: ignore[no-untyped-def]
    """QueuePolicy.run_walk's set-up: mark ``cand[:m]`` offered except the arriving ones,
    which go (ascending) to ``arrv``; returns how many."""
    for j in range(m):
        ps.ok[cand[j]] = True
    na = 0
    for j in range(ps.sc[NARR]):
        e = ps.arr[j]
        if ps.ok[e]:
            ps.ok[e] = False
            arrv[na] = e
            na += 1
    return na


@njit(cache=True)
def offer_all(ps, call, protect, arrv):  # type: ignore[no-untyped-def]
    """:func:`offer` of every eligible entry (hooks' ``select_all``), with no marks: the
    walk asks :func:`offered`; the eligible arriving ones go (ascending) to ``arrv``;
    returns how many."""
    ps.sc[CALLED] = call
    ps.sc[ALL] = 2 if protect else 1
    na = 0
    for j in range(ps.sc[NARR]):
        e = ps.arr[j]
        if _eligible(ps, e, protect, call):
            arrv[na] = e
            na += 1
    return na


@njit(cache=True)
def withdraw(ps, cand, m):  # type: ignore[no-untyped-def]
    """The offer withdrawn: ``cand[:m]``'s marks, or :func:`offer_all`'s mode."""
    if ps.sc[ALL]:
        ps.sc[ALL] = 0
        return
    for j in range(m):
        ps.ok[cand[j]] = False


@njit(cache=True)
def take_arriving(arrv, na, out, nv, k):  # type: ignore[no-untyped-def]
    """The batch alone overflows: its arriving entries follow the walk's victims, lowest id
    first, up to ``k`` in all; returns the count."""
    j = 0
    while nv < k and j < na:
        out[nv] = arrv[j]
        nv += 1
        j += 1
    return nv


@njit(cache=True)
def hold(ps, out, nv):  # type: ignore[no-untyped-def]
    """Keep the pass's victims for its commit (and for their ranks)."""
    for j in range(nv):
        ps.vic[j] = out[j]
    ps.sc[NV] = nv
    ps.sc[PENDING] = 1
    ps.sc[RANKED] = 0


@njit(cache=True)
def close_walk(ps, cand, m, na, out, nv, k):  # type: ignore[no-untyped-def]
    """QueuePolicy.run_walk's end, after the module's walk put ``nv`` victims in ``out``:
    the offer withdrawn, the arriving entries taken last (:func:`take_arriving`), the plan
    held; returns the victims."""
    withdraw(ps, cand, m)
    nv = take_arriving(ps.arrv, na, out, nv, k)
    hold(ps, out, nv)
    return nv


def selects(choose: Any) -> tuple[Any, Any]:
    """A queue policy's ``select`` and ``select_all`` hooks around its walk ``choose(ps,
    m, na, k, out)``: up to ``min(k, m − na)`` victims of an offer of ``m`` entries,
    ``na`` of them arriving, its plan kept in the state.  (Not cached on disk, as the
    hooks' defaults: the loops that call them are.)"""

    @njit
    def select(ps, tab, cand, m, k, now, out):  # type: ignore[no-untyped-def]
        na = offer(ps, cand, m, ps.arrv)
        return close_walk(ps, cand, m, na, out, choose(ps, m, na, k, out), min(k, m))

    @njit
    def select_all(ps, tab, m, call, protect, k, now, out):  # type: ignore[no-untyped-def]
        na = offer_all(ps, call, protect, ps.arrv)
        return close_walk(ps, ps.arrv, 0, na, out, choose(ps, m, na, k, out), min(k, m))

    return select, select_all


@njit(cache=True)
def offer_held(ps):  # type: ignore[no-untyped-def]
    """QueuePolicy.walk_rank's set-up: the held victims offered to a second walk (its
    arriving ones to ``arrv2``); returns (victims, arriving)."""
    nv = ps.sc[NV]
    return nv, offer(ps, ps.vic, nv, ps.arrv2)


@njit(cache=True)
def keep_ranks(ps, na, got):  # type: ignore[no-untyped-def]
    """QueuePolicy.walk_rank's end, after the second walk put ``got`` entries in ``rk``:
    the arriving ones ranked last, each held victim's place into ``rank``."""
    nv = ps.sc[NV]
    withdraw(ps, ps.vic, nv)
    got = take_arriving(ps.arrv2, na, ps.rk, got, nv)
    for j in range(got):
        ps.rank[ps.rk[j]] = j
    ps.sc[RANKED] = 1


@njit(cache=True, inline="always")
def pending(ps):  # type: ignore[no-untyped-def]
    """True once per held pass: the first ``on_evict`` after ``select`` commits it."""
    if ps.sc[PENDING] == 0:
        return False
    ps.sc[PENDING] = 0
    return True


@njit(cache=True)
def leave(ps, i):  # type: ignore[no-untyped-def]
    """QueuePolicy.leave, with Policy.forget's shared columns."""
    unlink(ps, i)
    ps.seq[i] = -1
    ps.fresh[i] = False


@njit(cache=True)
def leave_held(ps):  # type: ignore[no-untyped-def]
    """The commit's first step, once per held pass (:func:`pending`): every victim leaves;
    False when there was nothing to commit."""
    if not pending(ps):
        return False
    for j in range(ps.sc[NV]):
        leave(ps, ps.vic[j])
    return True


@njit(cache=True)
def survivors(ps):  # type: ignore[no-untyped-def]
    """QueuePolicy.on_evict after the commit: the arriving entries still resident leave
    their queues (ascending, into ``arrv``) and are no longer arriving; returns how many
    (the module places them again by its own rule)."""
    na = 0
    for j in range(ps.sc[NARR]):
        e = ps.arr[j]
        ps.isarr[e] = False
        if ps.seq[e] >= 0:
            ps.arrv[na] = e
            na += 1
    for j in range(na):
        unlink(ps, ps.arrv[j])
    ps.sc[NARR] = 0
    return na


@njit(cache=True)
def ring_push(ring, hi, e):  # type: ignore[no-untyped-def]
    """Append ``e`` to a FIFO ring over ``ring`` (size > the entries it ever holds)."""
    ring[hi % ring.size] = e
    return hi + 1
