"""The firmware session: one policy over one entry table, its clock, and its decisions.

Every driver talks to the firmware through this one object — the simulator replaying
a stream, the device emulator answering CXL.mem and mailbox commands, the QEMU
firmware service answering the guest's ring — so the firmware's behaviour is written
once.  A host (or a trace) tells the session four things:

* :meth:`describe` — new entries and their identity ``(context, layer, KV head, block)``;
* :meth:`lengths` — how long contexts are, in tokens (a length never shrinks);
* :meth:`write` — new KV written into the fast tier (entries not read yet);
* :meth:`read` — one batch of reads with their attention weights (a layer of a step,
  a whole step, or one request), which serves hits, pages in misses and evicts;

and the step boundary (:meth:`end_step`; also :meth:`at` a later step, or any call
carrying one, closes the open step first).  What a boundary decides by itself (managed
tiers' background moves) is handed back by :meth:`take_decisions`, or with the next
call's decisions.
The session hands back, for each call, a :class:`Decisions`: the entries admitted,
the victims in eviction order with the tier placement sends each to (and their
priorities when asked), and, on request, prefetch candidates (:meth:`prefetch`).

The clock rule lives here and nowhere else: a read batch at step ``s`` is
``Tick(s, time)`` and advances ``time``; a write follows the last read batch and
carries its time (an offline policy sees −1 before any read, so an entry's first
read is its next use); a prefetch follows the batch that proposed it; a step closes
with ``Tick(s, last read time)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import prefetch as pf
from .audit import EvictionAudit
from .cache import PolicyCache
from .config import PolicyConfig
from .formulas import (
    TIER_CXL,
    TIER_HBM,
    TIER_HBM_PINNED,
    TIER_NVME,
    placement_thresholds,
    placement_value,
    placement_weighted,
)
from .policies import POLICIES, make_policy
from .policies.base import Policy, Tick
from .select import select_victims
from .table import EntryTable, grow, unique_ids
from .tiering import LowerTiers, background_plan

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Decisions:
    """What the firmware decided in one call."""

    admitted: NDArray = field(default_factory=lambda: _EMPTY)  # entries now in the fast tier
    victims: NDArray = field(default_factory=lambda: _EMPTY)  # left it, in eviction order
    tiers: NDArray = field(default_factory=lambda: _EMPTY.astype(np.uint8))  # per victim
    priority: NDArray | None = None  # per victim, when the session records priorities
    # Moves between the lower tiers after the victims landed, in order: (ids, from, to).
    moves: list[tuple[NDArray, int, int]] = field(default_factory=list)


class FirmwareSession:
    """One policy, one capacity, one clock: the firmware as every driver sees it."""

    def __init__(
        self,
        policy: str,
        capacity: int,
        config: PolicyConfig | None = None,
        *,
        mode: str = "float",
        block_tokens: int = 16,
        table: EntryTable | None = None,
        audit: bool = False,
        placement: str = "policy",
        future: object = None,
        ordered_victims: bool = True,
        victim_priority: bool = True,
        policy_kwargs: dict | None = None,
        protect_batch: bool | None = None,
        cxl_capacity: int | None = None,
        nvme_capacity: int | None = None,
    ) -> None:
        if mode not in ("float", "int"):
            raise ValueError(f"mode = {mode!r}: must be 'float' or 'int'")
        if placement not in ("policy", "fill"):
            raise ValueError(f"placement {placement!r}: must be 'policy' or 'fill'")
        self.config = config or PolicyConfig()
        self.table = table if table is not None else EntryTable(block_tokens=block_tokens)
        cls = POLICIES.get(policy)
        kwargs: dict = dict(policy_kwargs or {})
        if cls is not None and not cls.online:
            kwargs["future"] = future
        if cls is not None and "int" in cls.modes:
            kwargs["mode"] = mode
        self.policy: Policy = make_policy(policy, self.config, self.table, **kwargs)
        # Integer mode is the EMA's (the RTL contract); other policies compute in one mode.
        self.mode = mode if "int" in type(self.policy).modes else "float"
        self.offline = not self.policy.online
        self.placement = placement
        self.audit = EvictionAudit() if audit else None
        self._victims: list[tuple[NDArray, NDArray | None, NDArray]] = []
        # Where every entry is below HBM, and the moves decided since the last hand-back.
        self.lower = LowerTiers(cxl_capacity, nvme_capacity)
        self._moves: list[tuple[NDArray, int, int]] = []
        self._tick = Tick(0, 0)  # of the latest eviction (a spill ranks at its time)
        self.cache = PolicyCache(
            self.policy,
            capacity,
            audit=self.audit,
            on_victims=self._sink,
            ordered_victims=ordered_victims,
            victim_priority=victim_priority,
            protect_batch=protect_batch,
        )
        self._set_layers()
        self.step: int | None = None  # the open step (None: none open)
        self.last_step: int | None = None  # the most recent step seen
        self.time = 0  # read batches served so far
        self._grids: dict[int, NDArray] = {}  # context → (layers, heads, blocks) entry ids
        self._prefix: dict[int, tuple[int, int]] = {}  # context → (parent, shared blocks)
        self._written = np.zeros(16, dtype=bool)  # entries written at least once
        self._unindexed: list[NDArray] = []  # described since the grids were last updated

    # --- what the host tells the firmware ------------------------------------------------
    def at(self, step: int) -> None:
        """The host is now at ``step``: a later step closes the open one first, before
        anything of the new step (new entries, lengths) reaches the policy."""
        self._enter(step)

    def take_decisions(self) -> Decisions:
        """What the firmware decided since the last hand-back without being asked — a step
        boundary's moves and evictions (managed tiers) — else nothing.  A driver that does
        not ask gets them with the next call's decisions."""
        return self._decisions(_EMPTY)

    def ensure(self, n: int) -> None:
        """Room for entries 0 … n−1 (a driver that knows its size up front)."""
        self.cache.ensure(max(n, 1))
        self.policy.ensure(max(n, 1))

    def describe(
        self, ctx: ArrayLike, layer: ArrayLike, head: ArrayLike, block: ArrayLike
    ) -> NDArray:
        """New entries, in creation order; returns their ids (dense, from ``table.n``)."""
        ids = self.table.append(ctx, layer, head, block)
        if ids.size:
            self._unindexed.append(ids)
        return ids

    def share_prefix(self, ctx: int, parent: int, blocks: int) -> None:
        """Context ``ctx``'s first ``blocks`` blocks are ``parent``'s entries (a shared
        system prompt): prefetch proposes them as ``ctx``'s neighbours."""
        self._prefix[int(ctx)] = (int(parent), int(blocks))

    def lengths(self, ctx: ArrayLike, tokens: ArrayLike) -> None:
        """Contexts are now at least this long, in tokens."""
        self.table.raise_lengths(ctx, tokens)

    def identify(
        self, ids: ArrayLike, ctx: ArrayLike, layer: ArrayLike, head: ArrayLike, block: ArrayLike
    ) -> None:
        """Give existing entries (a device's pages, known before the host says what they
        hold) their identity; contexts grow to cover each entry's first token."""
        ids = np.asarray(ids, dtype=np.int64)
        t = self.table
        t.ctx[ids], t.layer[ids], t.head[ids], t.block[ids] = ctx, layer, head, block
        t.raise_lengths(t.ctx[ids], t.block[ids].astype(np.int64) * t.block_tokens + 1)
        self._grids = {}  # identities moved: index every entry again when prefetch asks
        self._unindexed = [np.arange(t.n, dtype=np.int64)]

    def write(self, step: int, ids: ArrayLike) -> Decisions:
        """New KV written into the fast tier; the overflow is evicted (never what was written,
        unless the write alone overflows: docs/policy.md).  An entry written for the first
        time starts afresh even if it was known (and aged) before."""
        self._enter(step)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size:
            self._written = grow(self._written, self.table.n, False)
            first = unique_ids(ids[~self._written[ids]])
            self.cache.forget(first)
            self._written[first] = True
        t = self.time - 1 if self.offline else max(self.time - 1, 0)
        self._entering(ids)
        admitted = self.cache.insert(ids, Tick(step, t))
        return self._decisions(admitted)

    def set_config(self, config: PolicyConfig) -> None:
        """New policy parameters, keeping every entry's metadata and residency."""
        old = self.policy
        kwargs: dict = {"mode": self.mode} if "int" in type(old).modes else {}
        if not old.online:
            kwargs["future"] = old.future  # type: ignore[attr-defined]
        new = make_policy(old.name, config, self.table, **kwargs)
        if set(new.columns) == set(old.columns):
            for col in new.columns:
                setattr(new, col, getattr(old, col))
        self.policy = self.cache.policy = new
        self.config = config
        self.cache.pinned_capacity = int(config.pinned_fraction * self.cache.capacity)
        self._set_layers()

    def use_policy(self, policy: Policy) -> None:
        """Decide with ``policy``, an object over this session's table (e.g. one whose
        scores and victims come from hardware), in place of the named one; before any event."""
        if policy.table is not self.table:
            raise ValueError("the policy must be built over the session's entry table")
        self.policy = self.cache.policy = policy
        self.cache.pinned_capacity = int(policy.config.pinned_fraction * self.cache.capacity)
        self._set_layers()

    def read(self, step: int, ids: ArrayLike, weights: ArrayLike) -> tuple[NDArray, Decisions]:
        """One batch of reads; returns the hit mask (resident at the batch's start) and the
        decisions (misses admitted, victims)."""
        self._enter(step)
        ids = np.asarray(ids, dtype=np.int64)
        self._entering(ids)
        hit = self.cache.access(ids, weights, Tick(step, self.time))
        self.time += 1
        return hit, self._decisions(unique_ids(ids[~hit]))

    def end_step(self) -> None:
        """Close the open step (the EMA update at the step boundary; with managed tiers, the
        background moves, handed back by :meth:`take_decisions` or with the next call)."""
        self._close()

    def _close(self) -> None:
        """The step boundary; its decisions wait for the next hand-back."""
        if self.step is not None:
            tick = Tick(self.step, max(self.time - 1, 0))
            self.cache.end_step(tick)
            self.step = None
            if self.managed:
                self._background(tick)

    @property
    def managed(self) -> bool:
        """Managed tiers in force: asked for, with a scored policy and policy placement."""
        return (
            self.config.tier_management == "managed"
            and self.placement == "policy"
            and self.policy.scored
        )

    # --- what the firmware decides on request --------------------------------------------
    def resident(self) -> NDArray:
        """Which entries (by id, 0 … table.n − 1) are in the fast tier now."""
        return self.cache.is_resident(np.arange(self.table.n, dtype=np.int64))

    def place(self, ids: NDArray) -> NDArray:
        """The tier each of ``ids`` goes to when it leaves the fast tier (CXL DRAM or NVMe).
        Managed tiers send every victim to CXL DRAM; the step boundary sinks it later.
        Static thresholds send a victim scored below ``evict_threshold`` to NVMe while NVMe
        has room: when it has less than they need, the lowest scores take it (ties lower
        id) and the rest go to CXL DRAM."""
        ids = np.asarray(ids, dtype=np.int64)
        dest = np.full(ids.size, TIER_CXL, dtype=np.uint8)
        if ids.size == 0 or self.placement == "fill" or not self.policy.scored or self.managed:
            return dest
        down = np.flatnonzero(self.wants(ids) == TIER_NVME)
        room = self.lower.nvme_room()
        if down.size > room:
            fits = select_victims(ids[down], -self.policy.score(ids[down]), room, ordered=False)
            down = down[np.isin(ids[down], fits)]
        dest[down] = TIER_NVME
        return dest

    def wants(self, ids: NDArray) -> NDArray:
        """The tier placement wants each of ``ids`` in (a scored policy): thresholds give
        HBM / CXL DRAM / NVMe, weighted pinned HBM / HBM / CXL DRAM (docs/policy.md)."""
        ids = np.asarray(ids, dtype=np.int64)
        cfg = self.config
        score = self.policy.score(ids)
        if cfg.placement_mode == "thresholds":
            want = placement_thresholds(score, cfg.keep_threshold, cfg.evict_threshold)
        else:
            want = placement_weighted(
                score, self._idle(ids), self._anchor(ids), cfg.beta,
                cfg.placement_weights, cfg.placement_cuts,
            )  # fmt: skip
        return np.asarray(want, dtype=np.uint8).reshape(ids.shape)

    def placement_value(self, ids: NDArray) -> NDArray:
        """The value placement ranks ``ids`` by: the score (thresholds) or P (weighted)."""
        cfg = self.config
        score = self.policy.score(ids)
        if cfg.placement_mode == "thresholds":
            return np.asarray(score, dtype=np.float64)
        return np.asarray(
            placement_value(score, self._idle(ids), self._anchor(ids), cfg.beta,
                            cfg.placement_weights),
            dtype=np.float64,
        ).reshape(np.shape(ids))  # fmt: skip

    def _idle(self, ids: NDArray) -> NDArray | int:
        idle = self.policy.idle_steps(ids)
        return 0 if idle is None else idle

    def _anchor(self, ids: NDArray) -> NDArray:
        return (self.table.first_token(ids) < self.config.anchor_zone_size).astype(np.float64)

    def prefetch_candidates(self, ids: NDArray, weights: NDArray, limit: int) -> NDArray:
        """The best ``limit`` non-resident neighbours of this batch's ``limit`` strongest
        touches (docs/policy.md, prefetch), in fetch order: rank descending, id ascending."""
        ids = np.asarray(ids, dtype=np.int64)
        w = np.asarray(weights, dtype=np.float64)
        touched = w >= self.config.touch_threshold
        src = ids[touched]
        if src.size == 0 or self.config.prefetch_depth == 0:
            return _EMPTY
        if src.size > limit:  # the strongest, ties to the lower entry id (one answer, which
            # the compiled replay reproduces; a partition would leave ties to its pivots)
            src = src[np.lexsort((src, -w[touched]))[:limit]]
        t = self.table
        if self._unindexed:  # grids are built only for a session that prefetches
            self._index(unique_ids(np.concatenate(self._unindexed)))
            self._unindexed = []
        cand_ids, cand_dist = [], []
        ctx = t.ctx[src]
        for c in unique_ids(ctx).tolist():
            s = src[ctx == c]
            n_layers, n_blocks = self._extent(c)
            cand = pf.propose(
                t.layer[s], t.head[s], t.block[s], n_layers=n_layers, n_blocks=n_blocks,
                block_tokens=t.block_tokens, config=self.config,
            )  # fmt: skip
            cid = self._lookup(c, cand.layer, cand.head, cand.block)
            ok = cid >= 0
            cand_ids.append(cid[ok])
            cand_dist.append(cand.distance_blocks[ok])
        cid, dist = np.concatenate(cand_ids), np.concatenate(cand_dist)
        keep = ~self.cache.is_resident(cid)
        cid, dist = cid[keep], dist[keep]
        if cid.size == 0:
            return _EMPTY
        # One candidate per entry, at its smallest distance.
        o = np.lexsort((dist, cid))
        cid, dist = cid[o], dist[o]
        first = np.ones(cid.size, dtype=bool)
        first[1:] = cid[1:] != cid[:-1]
        cid, dist = cid[first], dist[first]
        if self.mode == "int":
            score = self.policy.score_q16(cid)
        else:
            score = self.policy.score(cid)
        ranks = pf.rank(dist, score, t.block_tokens, self.config, mode=self.mode)
        return pf.order(cid, ranks)[:limit]

    def prefetch(self, ids: ArrayLike) -> Decisions:
        """Bring ``ids`` into the fast tier without a read; it follows the batch that
        proposed them, at that batch's time."""
        step = self.last_step if self.step is None else self.step
        ids = np.asarray(ids, dtype=np.int64)
        self._entering(ids)
        admitted = self.cache.insert(ids, Tick(step or 0, max(self.time - 1, 0)))
        return self._decisions(admitted)

    # --- internals -----------------------------------------------------------------------
    def _enter(self, step: int) -> None:
        if self.step is not None and step != self.step:
            self._close()
        self.step = self.last_step = int(step)

    def _entering(self, ids: NDArray) -> None:
        # Before the call: what it admits is in HBM, unless the call evicts it again (an
        # offline optimum's bypass), which its victims' arrival below then records.
        if ids.size:
            self.lower.in_hbm(ids[~self.cache.is_resident(ids)])

    def _sink(self, ids: NDArray, prio: NDArray | None, tick: Tick) -> None:
        # Placed as they leave: a policy without persistent metadata forgets them next.
        dest = self.place(ids)
        self._victims.append((ids.copy(), None if prio is None else np.asarray(prio).copy(), dest))
        self.lower.arrive(ids, dest, tick.time)
        self._tick = tick

    def _set_layers(self) -> None:
        """Managed tiers: what placement wants in HBM is evicted last (docs/policy.md)."""
        self.cache.layers = self._layer if self.managed else None

    def _layer(self, eligible: NDArray) -> NDArray:
        # Thresholds: score < keep (0), score >= keep (1).  Weighted: P < low (0),
        # low <= P < high (1), P >= high (2: pinned while the others cover the overflow).
        want = self.wants(eligible)
        if self.config.placement_mode == "thresholds":
            return (want == TIER_HBM).astype(np.int64)
        return np.where(want == TIER_HBM_PINNED, 2, np.where(want == TIER_HBM, 1, 0))

    def _background(self, tick: Tick) -> None:
        """The step boundary's moves (managed tiers), at most ``background_moves`` in all."""
        cfg, lower = self.config, self.lower
        budget = cfg.background_moves
        if budget == 0:
            return
        if cfg.placement_mode == "weighted":
            # P < low wants CXL DRAM: resident, unpinned such entries leave HBM (lowest P
            # first); the seed's weighted rule has no NVMe cut, so NVMe is reached only
            # through CXL DRAM's overflow.  Capacity does not force these moves: they take
            # only the room CXL DRAM and NVMe have (the rest wait in HBM).
            budget = min(budget, lower.room_below())
            cache = self.cache
            n = cache.resident.size
            res = np.flatnonzero(cache.resident[:n] & ~cache.pinned[:n])
            if res.size == 0:
                return
            low = self.wants(res) == TIER_CXL
            out, _ = background_plan(
                res, self.placement_value(res), low, _EMPTY, _EMPTY, _EMPTY[:0] > 0, budget, 0
            )
            self.cache.evict(out, tick)
            return
        in_cxl, in_nvme = lower.members(TIER_CXL), lower.members(TIER_NVME)
        v_cxl = self.placement_value(in_cxl)
        v_nvme = self.placement_value(in_nvme)
        down, up = background_plan(
            in_cxl, v_cxl, v_cxl < cfg.evict_threshold,
            in_nvme, v_nvme, v_nvme >= cfg.evict_threshold, budget, lower.room(),
            lower.nvme_room(),
        )  # fmt: skip
        for ids, src, dst in ((down, TIER_CXL, TIER_NVME), (up, TIER_NVME, TIER_CXL)):
            if ids.size:
                lower.arrive(ids, np.full(ids.size, dst, np.uint8), tick.time)
                self._moves.append((ids, src, dst))

    def _spill(self) -> None:
        """CXL DRAM over its capacity: the surplus goes down to NVMe in ``cxl_order``."""
        over = self.lower.overflow()
        if over == 0:
            return
        prio = None
        if self.config.cxl_order == "policy" and self.policy.ranks_lower_tiers:
            in_cxl = self.lower.members(TIER_CXL)
            prio = self.policy.priority(in_cxl, self._tick)
        out = self.lower.spill_order(over, prio)
        self.lower.arrive(out, np.full(out.size, TIER_NVME, np.uint8), self._tick.time)
        self._moves.append((out, TIER_CXL, TIER_NVME))

    def _decisions(self, admitted: NDArray) -> Decisions:
        self._spill()
        moves, self._moves = self._moves, []
        if not self._victims:
            return Decisions(admitted=admitted, moves=moves)
        parts = self._victims
        self._victims = []
        if len(parts) == 1:
            victims, prio, tiers = parts[0]
        else:
            victims = np.concatenate([p[0] for p in parts])
            tiers = np.concatenate([p[2] for p in parts])
            prio = None
            if parts[0][1] is not None:
                prio = np.concatenate([np.asarray(p[1], dtype=np.float64) for p in parts])
        return Decisions(admitted, victims, tiers, prio, moves)

    def _index(self, ids: NDArray) -> None:
        t = self.table
        for c in unique_ids(t.ctx[ids]).tolist():
            sel = ids[t.ctx[ids] == c]
            lay, hd, blk = t.layer[sel], t.head[sel], t.block[sel]
            g = self._grids.get(c)
            need = (int(lay.max()) + 1, int(hd.max()) + 1, int(blk.max()) + 1)
            if g is None or any(a > b for a, b in zip(need, g.shape, strict=True)):
                shape = need if g is None else tuple(
                    max(a, 2 * b if a > b else b) for a, b in zip(need, g.shape, strict=True)
                )  # fmt: skip
                new = np.full(shape, -1, dtype=np.int64)
                if g is not None:
                    new[: g.shape[0], : g.shape[1], : g.shape[2]] = g
                g = self._grids[c] = new
            g[lay, hd, blk] = sel

    def _extent(self, c: int) -> tuple[int, int]:
        """Layers and blocks a context spans (its prefix's included)."""
        g = self._grids.get(c)
        layers = g.shape[0] if g is not None else 0
        blocks = int(np.flatnonzero((g >= 0).any(axis=(0, 1)))[-1]) + 1 if g is not None else 0
        if c in self._prefix:
            parent, nb = self._prefix[c]
            pl, _ = self._extent(parent)
            layers, blocks = max(layers, pl), max(blocks, nb)
        return layers, blocks

    def _lookup(self, c: int, layer: NDArray, head: NDArray, block: NDArray) -> NDArray:
        """Entry ids of (layer, head, block) in context ``c`` (−1 for none)."""
        out = np.full(layer.size, -1, dtype=np.int64)
        g = self._grids.get(c)
        if g is not None:
            ok = (layer < g.shape[0]) & (head < g.shape[1]) & (block < g.shape[2])
            out[ok] = g[layer[ok], head[ok], block[ok]]
        if c in self._prefix:
            parent, nb = self._prefix[c]
            shared = (block < nb) & (out < 0)
            if shared.any():
                out[shared] = self._lookup(parent, layer[shared], head[shared], block[shared])
        return out
