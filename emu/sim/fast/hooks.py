"""The interface of a fast-engine policy module, and its defaults.

A module of :mod:`kvcxl.emu.sim.fast.policies` replays one firmware policy (or several
that share an order, as ``lru`` and ``lru-anchor``).  It holds, at module level:

``COVERS``
    the ``(firmware policy name, mode)`` pairs it replays, e.g. ``(("lru", "float"),)``.
``build(setup: Setup) -> NamedTuple``
    the policy's state: a namedtuple of numpy arrays over entry ids (the columns of the
    firmware policy, with their fills) and scalars (its parameters, read once through
    ``setup.policy``).  Every hook below receives it as ``ps``.
``priority(ps, tab, e, now)`` (njit)
    the firmware ``Policy.priority`` of entry ``e``: higher evicts sooner; an int or a float.
    The loop derives the victim order's key from it (:func:`kvcxl.emu.sim.fast.kernel.key_of`)
    and reports it in victim dumps.  ``tab`` is the :class:`Table`, ``now`` the pass's
    :func:`now`.
``on_access(ps, e, j, w, t) -> bool`` (njit)
    plan record ``j`` read entry ``e`` with attention weight ``w`` in the batch at time
    ``t`` (every record, in order, hits and misses); True when ``e``'s priority may have
    changed (read only for ``STATIC`` policies).

and, where the default below is not the policy's, any of (njit).  The loop inlines every
hook but ``end_step``, ``on_admit`` and ``select`` (:func:`inlined`) and passes each the
state with its arrays' reference counts detached
(:func:`kvcxl.emu.sim.fast.kernel.borrowed`): a hook may index, slice and copy them, but
must not return one of them (or a view) out of the loop.

``on_insert(ps, e, t)``
    ``e`` became resident (after ``forget`` when metadata is not persistent).
``on_admit(ps, adm, na, t)``
    after the ``on_insert`` of each: the call's admissions ``adm[:na]`` together (the
    loop's scratch, in no particular order: read it, do not keep it), as the firmware's
    ``Policy.on_insert`` receives them.  For policies whose insertion depends on the whole
    set: the queue policies place a call's arrivals in ascending id order and keep them
    out of the walk that follows, which per-entry ``on_insert`` cannot do (two writes in
    a row at the same batch time would look like one call).
``forget(ps, e)``
    back to the column fills: the metadata a non-persistent policy drops on insert and evict.
``on_evict(ps, e, t)``
    ``e`` is leaving (before ``forget``): ghost lists, queue moves.  The victims of one
    pass leave one after another, after ``select`` and the dump's ``priority`` of each.
``end_step(ps, n)``
    a decode step ended; entries ``0 … n−1`` are described (the EMA's step).
``score(ps, e) -> float``
    the attention score placement reads (a victim scored below ``evict_threshold`` goes to
    NVMe); defining it says the policy is scored, as ``Policy.score`` does.
``score_q16(ps, e) -> int``
    the score as a Q0.16 integer, as ``Policy.score_q16`` (what integer-mode prefetch
    ranks by); a module covering an ``"int"`` mode must define it (default 0, never read).
``idle_steps(ps, e) -> int``
    steps since ``e``'s last touch, as ``Policy.idle_steps`` (weighted placement's recency;
    default 0, a policy that counts none).
``now(ps, t)``
    what ``priority`` receives as ``now`` during the eviction pass at batch time ``t``
    (default ``t``; random: its per-pass hash base).
``select(ps, tab, cand, m, k, now, out) -> int``
    a victim choice of its own in place of the key order: up to ``k`` victims among the
    eligible entries ``cand[:m]`` (resident, unpinned, unprotected; unordered) into
    ``out``, in eviction order, returning how many.  For policies whose victim is not the
    top of a per-entry priority (queues, ghost lists, a clock hand).
``select_all(ps, tab, m, call, protect, k, now, out) -> int``
    ``select`` over every eligible entry without their list (where the policy can tell
    them itself, a walk that meets only a few of them costs only those): the ``m``
    resident entries that are not pinned nor, when ``protect``, stamped by ``call`` —
    the cache's own ``pinned`` and ``stamp`` columns, which ``Setup`` shares with the
    state.  A module that defines it defines ``select`` too (a pass over a subset, as the
    managed tiers' layers are, still hands a list).

Traits (module-level constants, default False): ``STATIC`` — a key changes only through
the entry's own ``on_insert``/``on_access`` (True returned) or ``end_step``, so small
evictions pop a heap; ``QUEUE`` — also, keys only grow (a batch time) and do not depend on
``now``, so the heap is an O(1) queue that every key-moving touch joins at once;
``TOUCH`` (a ``QUEUE``'s) — every read re-keys its entry (``on_access`` always returns
True), so a read's admission queues the entry only at its read; ``BY_AGE`` — ranked by the
entry's age in tokens (the loop keeps context lengths in ``tab.ctx_tokens``); ``ONCE`` —
``on_access`` applies once per entry and batch (numpy's fancy-index assignment), not once
per record.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
from numba import njit
from numpy.typing import NDArray

from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies.base import Policy

TRAITS = ("STATIC", "QUEUE", "TOUCH", "BY_AGE", "ONCE")
HOOKS = (
    "on_insert", "on_admit", "forget", "on_evict", "end_step", "score", "score_q16",
    "idle_steps", "now", "select", "select_all",
)  # fmt: skip
REQUIRED = ("COVERS", "build", "priority", "on_access")


class Plan(NamedTuple):
    """The flattened plan (:func:`kvcxl.emu.sim.fast.flat_plan`): per batch ``read``,
    ``step``, ``tokens``, ``off`` (into ``ids``/``w``) and ``loff`` (into the context
    lengths ``l_ctx``/``l_tok`` set before it)."""

    read: NDArray
    step: NDArray
    tokens: NDArray
    off: NDArray
    ids: NDArray
    w: NDArray
    loff: NDArray
    l_ctx: NDArray
    l_tok: NDArray


class Run(NamedTuple):
    """The replay's cache and books: entries, pins, capacities, the configuration's switches."""

    n: int  # entries
    read_steps: NDArray  # the books' positions (_StepBooks)
    npos: int  # how many (at least 1)
    want_pin: NDArray  # the policy's wants_pin of every entry
    lazy: bool  # a trace's entries are written just before their first read
    capacity: int
    pinned_capacity: int
    persistent: bool
    eviction_batch: int
    nvme_below: float  # a scored victim below it goes to NVMe (−inf: never)
    record: bool  # dump the victims
    per_request: bool  # every read its own batch
    offline: bool  # the policy sees −1 before any read (Belady)
    bypass: bool  # the policy may evict the entries of the batch just read
    warm: int  # the warm-up's read steps (_StepBooks.warm)
    pinned: NDArray  # the cache's columns (Setup's: shared with the policy's state)
    stamp: NDArray
    ids: NDArray  # empty, of the dtype the loop keeps entry ids and versions in (id_dtype)


def id_dtype(n: int) -> type:
    """The dtype the loop keeps entry ids and versions in: int32 while ``n`` entries fit
    (S1's 16 users are 84 M; 4 bytes an id, not 8, in every id column and queue item),
    else int64.  A version wraps in int32 harmlessly: an item is compared with its
    entry's version only while it is queued, never 2**32 touches old."""
    return np.int32 if n < 2**31 else np.int64


def stamp_dtype(n_batches: int, n_units: int) -> type:
    """The dtype of the cache's stamp column (the call that last marked each entry, or its
    negative while a touch batch marks it): int32 while every call number fits, else int64.
    A replay makes at most three calls a unit — a batch, or each read of a read batch
    replayed per request (``n_units`` counts both) — and one at each step boundary, of
    which there are at most ``n_batches`` + 1."""
    return np.int32 if 3 * n_units + n_batches + 1 < 2**31 else np.int64


class Media(NamedTuple):
    """The tiers below HBM: capacities in entries and the timing model."""

    cxl_cap: int
    nvme_cap: int
    entry_bytes: int
    cxl_lat: float
    cxl_gbps: float
    nvme_lat: float
    nvme_gbps: float


class Table(NamedTuple):
    """The entry table as the loop keeps it: each entry's context and block, the block size
    in tokens and each context's length (kept only for ``BY_AGE`` policies)."""

    e_ctx: NDArray
    e_block: NDArray
    bt: int
    ctx_tokens: NDArray


@dataclass(frozen=True)
class Setup:
    """What ``build`` reads: the firmware policy (its parameters: ``policy.params``), its
    configuration, the mode, the flattened plan (:func:`kvcxl.emu.sim.fast.flat_plan` with
    ``e_ctx``/``e_block``; its ``w`` the loop's weights, float32 or float64), the number
    of entries and the replay's granularity; the cache's
    ``pinned`` and ``stamp`` columns (the call that last marked each entry), which the
    loop writes and a ``select_all`` reads."""

    policy: Policy
    config: PolicyConfig
    mode: str
    plan: dict[str, Any]
    n: int
    per_request: bool
    offline: bool
    pinned: NDArray
    stamp: NDArray

    def column(self, fill: Any, dtype: Any) -> NDArray:
        """A column over every entry, filled as the firmware's ``columns`` declare."""
        return np.full(self.n, fill, dtype)


# --- the defaults (a module defines its own to override) ---------------------------------
# Not cached on disk (no cache=True): each is compiled for every policy's state type, and
# numba's cache index pickles every such type; a state class from a module that a later
# process cannot import (a test's policy in a temporary folder) made that index unreadable
# and every later replay fail.  The compiled loops that call them are cached whole.
@njit
def on_insert(ps, e, t):  # type: ignore[no-untyped-def]
    pass


@njit
def on_admit(ps, adm, na, t):  # type: ignore[no-untyped-def]
    pass


@njit
def forget(ps, e):  # type: ignore[no-untyped-def]
    pass


@njit
def on_evict(ps, e, t):  # type: ignore[no-untyped-def]
    pass


@njit
def end_step(ps, n):  # type: ignore[no-untyped-def]
    pass


@njit
def score(ps, e):  # type: ignore[no-untyped-def]
    return 0.0


@njit
def score_q16(ps, e):  # type: ignore[no-untyped-def]
    return 0


@njit
def idle_steps(ps, e):  # type: ignore[no-untyped-def]
    return 0


@njit
def now(ps, t):  # type: ignore[no-untyped-def]
    return t


@njit
def select(ps, tab, cand, m, k, now, out):  # type: ignore[no-untyped-def]
    return 0


@njit
def select_all(ps, tab, m, call, protect, k, now, out):  # type: ignore[no-untyped-def]
    return 0


def hook(module: ModuleType, name: str) -> Any:
    """The module's own hook ``name``, else the default above."""
    return getattr(module, name, globals()[name])


def inlined(fn: Any) -> Any:
    """Hook ``fn`` compiled to be inlined into its caller (numba IR), whatever its own
    decorator: the loop inlines the hooks it calls per read or per entry."""
    return njit(inline="always")(getattr(fn, "py_func", fn))


def trait(module: ModuleType, name: str) -> bool:
    """The module's trait ``name`` (False when it does not declare it); QUEUE implies STATIC."""
    if name == "STATIC" and trait(module, "QUEUE"):
        return True
    return bool(getattr(module, name, False))


def has(module: ModuleType, name: str) -> bool:
    """Whether the module defines hook ``name`` itself (the loop then calls it)."""
    return hasattr(module, name)


def check(module: ModuleType) -> None:
    """Refuse a policy module that misses part of the interface, naming what it misses."""
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        raise TypeError(f"fast-engine policy module {module.__name__} lacks {', '.join(missing)}")
    for pair in module.COVERS:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(
                f"{module.__name__}.COVERS holds {pair!r}: must be (policy, mode) pairs"
            )
        if pair[1] == "int" and not has(module, "score_q16"):
            raise TypeError(
                f"fast-engine policy module {module.__name__} covers {pair!r} but lacks "
                "score_q16 (integer-mode prefetch ranks by it)"
            )
    if trait(module, "TOUCH") and not trait(module, "QUEUE"):
        raise TypeError(
            f"fast-engine policy module {module.__name__} is TOUCH but not a QUEUE: TOUCH "
            "defers a queued entry's key to its read"
        )
    if has(module, "select_all") and not has(module, "select"):
        raise TypeError(
            f"fast-engine policy module {module.__name__} has select_all but no select: "
            "a managed tiers' layer is a list of candidates"
        )
    if trait(module, "QUEUE"):  # (its victims come from its touches alone)
        extra = [n for n in ("end_step", "select", "select_all", "score") if has(module, n)]
        if extra:
            raise TypeError(
                f"fast-engine policy module {module.__name__} is a QUEUE but has "
                f"{', '.join(extra)}: a queue's keys move only by its entries' touches"
            )
