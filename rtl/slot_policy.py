"""CLOCK or SIEVE with a slot-queue engine choosing every victim: the device host's side.

:class:`SlotPolicy` is a firmware :class:`~kvcxl.firmware.policies.base.Policy`, so a
:class:`~kvcxl.firmware.session.FirmwareSession` drives it as it drives the firmware's
own CLOCK or SIEVE.  It turns each event into the engine's commands
(:mod:`kvcxl.firmware.golden_clock`): an entry takes a free slot when it becomes
resident and gives it back when it leaves.  The engine is either the Verilated RTL
(:class:`kvcxl.rtl.verilated.SlotEngine`) or the golden step itself
(:class:`GoldenEngine`); both answer ``run(commands) -> victim slots``.

The batch rule of :mod:`kvcxl.firmware.policies.queued`: entries admitted by the batch
that overflows (``arriving``) join the queue's head after the walk, in ascending id
order, and are seen by no walk of their own batch.  So the host holds them back (and
their reads) until the walk is done, then inserts them; when the batch alone overflows
(the walk took every offered queued entry and more are needed), it inserts them, offers
only them and walks again with the hand kept where the first walk left it: fresh
entries at counter 0 in id order, so the walk takes them lowest id first, as the
firmware does.

``check=True`` runs the firmware's own policy beside it and compares every pass: the
first difference raises :class:`PassMismatch` naming the step, the pass and the entries.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware import golden_clock as gc
from kvcxl.firmware import golden_s3fifo as gs
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies.base import Policy, Tick, make_policy
from kvcxl.firmware.table import EntryTable, grow

Op = gc.Op


class PassMismatch(RuntimeError):
    """The engine's victims differ from the firmware's: printed as one line, exit status 1."""

    exit_code = 1


class SlotsExhausted(RuntimeError):
    """More entries are resident than the engine has slots: printed as one line."""

    exit_code = 1


class IdsExceeded(RuntimeError):
    """An entry id beyond the S3-FIFO engine's ghost: printed as one line."""

    exit_code = 1


class GoldenEngine:
    """The golden step behind the engine's command interface (no RTL); ``ids``: the id
    space of S3-FIFO's ghost."""

    def __init__(self, slots: int, policy: str, ids: int = 0) -> None:
        self.slots, self.policy, self.ids = slots, policy, ids
        self.q: gc.SlotQueue | gs.S3Queue | None = None

    def reset(self, ref_ceiling: int) -> None:
        if self.policy == "s3fifo":
            self.q = gs.S3Queue(self.slots, self.ids, ref_ceiling)
        else:
            self.q = gc.SlotQueue(self.slots, self.policy, ref_ceiling)

    def run(self, cmds: list[tuple[int, int, int, int]]) -> list[int]:
        assert self.q is not None, "reset() first"
        return self.q.run(cmds)


class SlotPolicy(Policy):
    """The firmware's CLOCK / SIEVE with every victim chosen by a slot-queue engine."""

    modes = ("float",)
    columns = {}
    ranks_lower_tiers = False

    def __init__(
        self,
        config: PolicyConfig,
        table: EntryTable,
        engine,
        policy: str,
        *,
        check: bool = False,
    ) -> None:
        self.name = policy  # type: ignore[misc]
        super().__init__(config, table)
        self.policy = policy
        self.engine = engine
        engine.reset(self.ceiling(config))
        self.n_slots = engine.slots
        self.slot_of = np.full(16, -1, np.int64)  # entry → slot (-1: not in the engine)
        self.id_of = np.full(self.n_slots, -1, np.int64)
        self.free = list(range(self.n_slots - 1, -1, -1))  # pop() gives the lowest slot
        self.chip_offered = np.zeros(self.n_slots, bool)
        self.cmds: list[tuple[int, int, int, int]] = []
        self.arriving = np.zeros(0, np.int64)  # admitted by the open batch, held back
        self.deferred: list[tuple[int, int]] = []  # (op, entry) of the arriving entries
        self.walked: NDArray | None = None  # the latest walk's victims, until on_evict
        self.ref = make_policy(policy, config, table) if check else None
        self.stats = {"walks": 0, "commands": 0, "victims": 0, "arrival_walks": 0}
        self.passes = 0  # passes since the step began (for messages)

    def ceiling(self, config: PolicyConfig) -> int:
        """The engine's counter ceiling (its ``ref_max``)."""
        bits = config.param("clock_bits") if self.policy == "clock" else 1
        return gc.ref_max(self.policy, bits)

    # --- storage ------------------------------------------------------------------------
    def ensure(self, n: int) -> None:
        if n > self.slot_of.size:
            self.slot_of = grow(self.slot_of, n, -1)
        if self.ref is not None:
            self.ref.ensure(n)

    def set_capacity(self, capacity: int) -> None:
        super().set_capacity(capacity)
        if self.ref is not None:
            self.ref.set_capacity(capacity)

    def forget(self, ids: NDArray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self.ensure(int(ids.max()) + 1 if ids.size else 1)
        for i in ids.tolist():
            if self.slot_of[i] >= 0:
                self.cmds.append((Op.RESET, int(self.slot_of[i]), 0, 0))
            elif i in self._arriving_set():
                self.deferred.append((Op.RESET, i))
        if self.ref is not None:
            self.ref.forget(ids)

    # --- events ---------------------------------------------------------------------------
    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self.ensure(int(ids.max()) + 1 if ids.size else 1)
        self._place_arriving()  # the previous batch's arrivals sit at the head already
        self.arriving = np.sort(ids)
        if self.ref is not None:
            self.ref.on_insert(ids, tick)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self.ensure(int(ids.max()) + 1 if ids.size else 1)
        held = self._arriving_set()
        for i in ids.tolist():
            if i in held:
                self.deferred.append((Op.TOUCH, i))
            elif self.slot_of[i] >= 0:
                self.cmds.append((Op.TOUCH, int(self.slot_of[i]), 0, 0))
        if self.ref is not None:
            self.ref.on_access(ids, weights, tick)

    def on_evict(self, ids: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        walked, self.walked = self.walked, None
        if walked is not None:
            if not np.array_equal(np.sort(ids), walked):
                raise PassMismatch(
                    f"step {tick.step}: the cache evicted {ids.size} entries after a walk that "
                    f"chose {walked.size}: one walk per eviction is what the engine commits"
                )
        else:  # an eviction the walk did not choose (placement): unlink them
            held = self._arriving_set()
            for i in ids.tolist():
                if self.slot_of[i] >= 0:
                    self.cmds.append((Op.REMOVE, int(self.slot_of[i]), 0, 0))
                    self._release(i)
                elif i in held:
                    self.arriving = self.arriving[self.arriving != i]
                    self.deferred = [d for d in self.deferred if d[1] != i]
            self._place_arriving()
        if self.ref is not None:
            self.ref.on_evict(ids, tick)

    def end_step(self, tick: Tick) -> None:
        self.passes = 0
        if self.ref is not None:
            self.ref.end_step(tick)

    # --- decisions --------------------------------------------------------------------------
    def select(self, eligible: NDArray, k: int, tick: Tick, ordered: bool = True) -> NDArray:
        eligible = np.asarray(eligible, dtype=np.int64)
        want = self.ref.select(eligible, k, tick) if self.ref is not None else None
        got = self._walk(eligible, min(int(k), eligible.size))
        self.walked = np.sort(got)
        self.stats["victims"] += got.size
        if want is not None:
            self._compare(tick, np.asarray(want, np.int64), got)
        self.passes += 1
        return got

    def _walk(self, eligible: NDArray, k: int) -> NDArray:
        """The pass's victims: the engine's walk over the queued entries, then (the batch
        alone overflows) its arrivals through a second walk."""
        held = np.isin(eligible, self.arriving)
        queued = eligible[~held]
        self._offer(queued)
        self.cmds.append((Op.WALK, 0, min(k, queued.size), 0))
        got = self._ids(self._run())
        if got.size < k:  # the batch alone overflows: its arrivals, lowest id first
            self.stats["arrival_walks"] += 1
            late = eligible[held]
            self._insert_arriving(touches=False)
            self._offer(late)
            self.cmds.append((Op.WALK, 0, k - got.size, 1))
            got = np.concatenate([got, self._ids(self._run())])
            self._apply_deferred()
        else:
            self._place_arriving()
        return got

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        """A walk ranks no entry by a key of its own: 0 for every entry (the victims' order
        is the engine's)."""
        return np.zeros(np.asarray(ids).size, np.int64)

    # --- the host side of the engine ---------------------------------------------------------
    def _arriving_set(self) -> set[int]:
        return set(self.arriving.tolist())

    def _slot(self, i: int) -> int:
        if not self.free:
            raise SlotsExhausted(
                f"more than {self.n_slots} entries resident at once: the engine has "
                f"{self.n_slots} slots (raise --entries)"
            )
        s = self.free.pop()
        self.slot_of[i], self.id_of[s] = s, i
        return s

    def _release(self, i: int) -> None:
        s = int(self.slot_of[i])
        self.slot_of[i], self.id_of[s] = -1, -1
        self.chip_offered[s] = False
        self.free.append(s)

    def _insert_arriving(self, *, touches: bool = True) -> None:
        for i in self.arriving.tolist():
            self.cmds.append((Op.INSERT, self._slot(i), self._insert_arg(i), 0))
        self.arriving = np.zeros(0, np.int64)
        if touches:
            self._apply_deferred()

    def _insert_arg(self, i: int) -> int:
        """INSERT's ``arg`` for entry ``i`` (CLOCK and SIEVE: none)."""
        return 0

    def _apply_deferred(self) -> None:
        for op, i in self.deferred:
            if self.slot_of[i] >= 0:
                self.cmds.append((op, int(self.slot_of[i]), 0, 0))
        self.deferred = []

    def _place_arriving(self) -> None:
        if self.arriving.size or self.deferred:
            self._insert_arriving()

    def _offer(self, ids: NDArray) -> None:
        """Offer exactly ``ids`` to the next walk: OFFER commands for the slots that change."""
        want = np.zeros(self.n_slots, bool)
        want[self.slot_of[ids]] = True
        for s in np.flatnonzero(want != self.chip_offered).tolist():
            self.cmds.append((Op.OFFER, s, int(want[s]), 0))
        self.chip_offered = want

    def _run(self) -> NDArray:
        self.stats["walks"] += sum(1 for c in self.cmds if c[0] == Op.WALK)
        self.stats["commands"] += len(self.cmds)
        slots = self.engine.run(self.cmds)
        self.cmds = []
        return np.asarray(slots, np.int64)

    def _ids(self, slots: NDArray) -> NDArray:
        ids = self.id_of[slots]
        for i in ids.tolist():
            self._release(int(i))
        return ids

    def _compare(self, tick: Tick, want: NDArray, got: NDArray) -> None:
        if np.array_equal(want, got):
            return
        n = min(want.size, got.size)
        i = next((j for j in range(n) if want[j] != got[j]), n)
        g = f"entry {int(got[i])}" if i < got.size else "no entry"
        w = f"entry {int(want[i])}" if i < want.size else "no entry"
        raise PassMismatch(
            f"step {tick.step}, pass {self.passes} of the step, victim {i}: the engine chose "
            f"{g}; the firmware's {self.policy} chose {w} ({got.size} vs {want.size} victims)"
        )


class S3FifoSlotPolicy(SlotPolicy):
    """The firmware's S3-FIFO with every victim chosen by the S3-FIFO engine
    (:mod:`kvcxl.firmware.golden_s3fifo`): the host sends ADMIT as a batch arrives (the
    firmware takes its ids out of the ghost then), INSERT with the entry id once the walk
    is done, the parameters as SET commands when the capacity is known, and takes the
    batch's own arrivals itself, lowest id first, when the batch alone overflows (the
    batch rule, not S3-FIFO's: the firmware neither ghosts them nor moves them)."""

    def __init__(
        self, config: PolicyConfig, table: EntryTable, engine, *, check: bool = False
    ) -> None:
        super().__init__(config, table, engine, "s3fifo", check=check)
        self.n_ids = int(engine.ids)

    def ceiling(self, config: PolicyConfig) -> int:
        return gs.ref_ceiling(config.param("s3fifo_move_threshold"))

    def set_capacity(self, capacity: int) -> None:
        super().set_capacity(capacity)
        p = self.config.param
        got = gs.settings(capacity, p("s3fifo_small_ratio"), p("s3fifo_ghost_ratio"),
                          p("s3fifo_move_threshold"), self.n_ids)  # fmt: skip
        self.cmds += [(gs.Op.SET, int(k), v, 0) for k, v in got.items()]

    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        super().on_insert(ids, tick)
        for i in np.asarray(ids, dtype=np.int64).tolist():
            if i >= self.n_ids:
                raise IdsExceeded(
                    f"entry {i}: the S3-FIFO engine's ghost holds ids below {self.n_ids}"
                )
            self.cmds.append((gs.Op.ADMIT, 0, i, 0))

    def _insert_arg(self, i: int) -> int:
        return i

    def _walk(self, eligible: NDArray, k: int) -> NDArray:
        held = np.isin(eligible, self.arriving)
        self._offer(eligible[~held])
        # k, not the queued share of it: a pass that evicts only arrivals still marks the
        # cache as having evicted (the warm placement rule ends); the engine takes at most
        # its offered slots
        self.cmds.append((Op.WALK, 0, min(k, self.n_slots), 0))
        got = self._ids(self._run())
        if got.size < k:  # the batch alone overflows: its arrivals, lowest id first
            self.stats["arrival_walks"] += 1
            late = np.sort(eligible[held])[: k - got.size]
            gone = set(late.tolist())
            self.arriving = self.arriving[~np.isin(self.arriving, late)]
            self.deferred = [d for d in self.deferred if d[1] not in gone]
            got = np.concatenate([got, late])
        self._place_arriving()
        return got
