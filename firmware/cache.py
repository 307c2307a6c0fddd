"""HBM residency under one policy: hits, admission, pinning, exact eviction with audit.

Semantics (documented in docs/policy.md):

* A batch of reads (one layer of a decode step, or one request of a request
  trace) is served first: an entry resident at the start of the batch is a hit,
  any other read is a miss served from its lower tier and then admitted
  (demand paging).
* Then, if the resident count exceeds the capacity, the policy evicts: with
  ``eviction_passes = "exact"`` exactly the overflow, one exact top-k selection
  (passes of ``eviction_batch`` within one call would see the same priorities);
  with ``"batched"`` passes of ``eviction_batch`` victims, each ranked and audited
  as it begins, until the overflow is covered (the last may evict past it).
  Managed tiers split the eligible entries into layers (what placement wants out
  of HBM first); a pass takes from the first layer before the next.  Every resident,
  unpinned entry is eligible except the entries read in this batch (demand
  paging), unless the batch alone overflows the capacity.  The offline optimum
  may also bypass (evict what it just read) unless ``protect_batch`` is set.
* Order within a batch: misses are admitted (``on_insert``), then every read is
  recorded (``on_access``), then the overflow is evicted.
* A write (new KV, or a prefetch) admits its entries, then evicts the overflow
  under the same rule: the entries it just wrote are not eligible unless the
  write alone overflows the capacity (a device never drops KV it is being handed
  before its first read); the offline optimum may bypass here too.
* Pinned entries are never eligible.  Pinned slots are
  ``floor(pinned_fraction × capacity)``; as entries are admitted (in ascending id
  order within one admission), each one the policy wants pinned takes a free
  slot; a pinned entry stays pinned and resident, so slots are never freed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .audit import EvictionAudit
from .policies.base import Policy, Tick
from .table import grow, unique_ids

# Receives (victim ids, their priorities or None, tick) as each pass removes them.
VictimSink = Callable[[NDArray, "NDArray | None", Tick], None]


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    inserts: int = 0
    evictions: int = 0
    eviction_passes: int = 0
    pinned: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@functools.cache
def _takes_ordered(cls: type) -> bool:
    """Whether ``cls.select`` takes ``ordered`` (asked once per class: a signature costs
    more than a small replay's whole set-up)."""
    return "ordered" in inspect.signature(cls.select).parameters


class PolicyCache:
    """A capacity-bounded set of resident entries managed by a :class:`Policy`."""

    def __init__(
        self,
        policy: Policy,
        capacity: int,
        *,
        audit: EvictionAudit | None = None,
        on_victims: VictimSink | None = None,
        protect_batch: bool | None = None,
        ordered_victims: bool = True,
        victim_priority: bool = True,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"capacity = {capacity} is out of range: must be >= 0 entries")
        self.policy = policy
        self.capacity = int(capacity)
        self.pinned_capacity = int(policy.config.pinned_fraction * capacity)
        policy.set_capacity(self.capacity)
        self.audit = audit
        self.on_victims = on_victims
        self.victim_priority = victim_priority  # False: the sink gets None, not priorities
        # Victims of a pass leave together, so their order is visible only to a victim sink
        # (dumps, the RTL stream); a caller without one may skip ordering them.
        # (A policy whose own select() takes no `ordered` keeps ordering: correct, slower.)
        takes = _takes_ordered(type(policy))
        self.ordered_victims = ordered_victims or not takes
        # Demand paging keeps every entry of the batch just read (no bypass). The offline
        # optimum may bypass (evict what it just read), which makes it the upper bound of
        # every online policy; protect_batch=True forces classic no-bypass Belady.
        self.protect_batch = (not policy.may_bypass) if protect_batch is None else protect_batch
        self.resident = np.zeros(16, dtype=bool)
        self.pinned = np.zeros(16, dtype=bool)
        self.n_resident = 0
        # Managed tiers: eviction layer of each eligible entry (0 goes first); None: one layer.
        self.layers: Callable[[NDArray], NDArray] | None = None
        self.stats = CacheStats()
        if audit is not None:
            audit.attach(policy, self.pinned_capacity)

    def ensure(self, n: int) -> None:
        self.resident = grow(self.resident, n, False)
        self.pinned = grow(self.pinned, n, False)
        self.policy.ensure(n)

    def access(self, ids: NDArray, weights: NDArray, tick: Tick) -> NDArray:
        """Serve one batch of reads; returns the hit mask (resident at batch start)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return np.zeros(0, dtype=bool)
        self.ensure(int(ids.max()) + 1)
        hit = self.resident[ids].copy()
        nh = int(np.count_nonzero(hit))
        self.stats.hits += nh
        self.stats.misses += ids.size - nh
        # Admit first (a policy without persistent metadata starts the entry afresh), then
        # record the reads, then evict the overflow.
        self._admit(unique_ids(ids[~hit]), tick)
        weights = np.asarray(weights, dtype=np.float64)
        self.policy.on_access(ids, weights, tick)
        if self.audit is not None:
            self.audit.on_read(ids, weights, tick.time)
        self._make_room(tick, protect=ids if self.protect_batch else None)
        return hit

    def insert(self, ids: NDArray, tick: Tick) -> NDArray:
        """Make entries resident without a read (new tokens, prefetch); returns those admitted."""
        ids = unique_ids(ids)
        if ids.size == 0:
            return ids
        self.ensure(int(ids.max()) + 1)
        new = ids[~self.resident[ids]]
        self._admit(new, tick)
        self._make_room(tick, protect=new if self.protect_batch else None)
        return new

    def end_step(self, tick: Tick) -> None:
        self.policy.end_step(tick)
        if self.audit is not None:
            self.audit.on_end_step()

    def forget(self, ids: NDArray) -> None:
        """Start ``ids``' policy state afresh (an entry known before it was first written)."""
        ids = np.asarray(ids, dtype=np.int64)
        self.policy.forget(ids)
        if self.audit is not None:
            self.audit.on_forget(ids)

    def is_resident(self, ids: NDArray) -> NDArray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.zeros(ids.size, dtype=bool)
        inside = ids < self.resident.size
        out[inside] = self.resident[ids[inside]]
        return out

    def evict(self, ids: NDArray, tick: Tick) -> None:
        """Evict specific resident, unpinned entries (placement-driven demotion)."""
        ids = np.asarray(ids, dtype=np.int64)
        ids = ids[self.resident[ids] & ~self.pinned[ids]]
        self._remove(ids, tick)

    # --- internals -------------------------------------------------------------------
    def _admit(self, ids: NDArray, tick: Tick) -> None:
        if ids.size == 0:
            return
        self.resident[ids] = True
        self.n_resident += ids.size
        self.stats.inserts += ids.size
        free_pins = self.pinned_capacity - self.stats.pinned
        if free_pins > 0:
            want = ids[self.policy.wants_pin(ids) & ~self.pinned[ids]][:free_pins]
            self.pinned[want] = True
            self.stats.pinned += want.size
        self.policy.on_insert(ids, tick)
        if self.audit is not None:
            self.audit.on_admit(ids, tick.time)

    def _make_room(self, tick: Tick, protect: NDArray | None = None) -> None:
        over = self.n_resident - self.capacity
        if over <= 0:
            return
        n = self.resident.size
        mask = self.resident[:n] & ~self.pinned[:n]
        if protect is not None:
            mask[protect] = False
            if np.count_nonzero(mask) < over:  # the batch alone overflows: let it compete
                mask[protect] = self.resident[protect] & ~self.pinned[protect]
        eligible = np.flatnonzero(mask)
        cfg = self.policy.config
        layers = self._layers(eligible)
        if cfg.eviction_passes == "exact":
            # Exactly the overflow, one exact top-k (passes of eviction_batch within one call
            # would see the same priorities, so they are only counted).
            victims = self._take(layers, over, tick)
            self.stats.eviction_passes += -(-victims.size // cfg.eviction_batch)
            self._remove(victims, tick)
            return
        # Batched: passes of eviction_batch victims, each ranked as it begins, until the
        # overflow is covered; the last may evict past it (the RTL's batch slots).
        left = over
        while left > 0:
            victims = self._take(layers, cfg.eviction_batch, tick)
            if victims.size == 0:
                break
            self.stats.eviction_passes += 1
            self._remove(victims, tick)
            left -= victims.size
            layers = [lay[self.resident[lay]] for lay in layers]

    def _layers(self, eligible: NDArray) -> list[NDArray]:
        """The eligible entries split into the order they are evicted in: a placement rule
        (managed tiers) puts the entries it wants in HBM into later layers."""
        if self.layers is None:
            return [eligible]
        code = np.asarray(self.layers(eligible))
        return [eligible[code == c] for c in range(int(code.max()) + 1 if code.size else 0)]

    def _take(self, layers: list[NDArray], k: int, tick: Tick) -> NDArray:
        """Up to ``k`` victims, the first layers' first; each layer by the policy's order."""
        out: list[NDArray] = []
        for lay in layers:
            if k <= 0:
                break
            if lay.size == 0:
                continue
            got = self._choose(lay, k, tick)
            out.append(got)
            k -= got.size
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def _choose(self, eligible: NDArray, k: int, tick: Tick) -> NDArray:
        """The policy's top ``k`` of ``eligible`` (one pass), audited against the priorities
        in force now."""
        if self.ordered_victims:
            victims = self.policy.select(eligible, k, tick)
        else:
            victims = self.policy.select(eligible, k, tick, ordered=False)
        if self.audit is not None:
            priority = self.policy.priority(eligible, tick)
            tie = self.policy.tie(eligible, tick)
            self.audit.check(eligible, priority, victims, self.ordered_victims, tie)
            self.audit.check_history(eligible, victims, self.policy, tick)
        return victims

    def _remove(self, ids: NDArray, tick: Tick) -> None:
        if ids.size == 0:
            return
        if self.on_victims is not None:
            prio = self.policy.priority(ids, tick) if self.victim_priority else None
            self.on_victims(ids, prio, tick)
        self.resident[ids] = False
        self.n_resident -= ids.size
        self.stats.evictions += ids.size
        self.policy.on_evict(ids, tick)
