"""The EMA policy with the Verilated PolicyEngine doing the scoring and the victim choice.

:class:`EnginePolicy` is a firmware :class:`~kvcxl.firmware.policies.base.Policy`, so a
:class:`~kvcxl.firmware.session.FirmwareSession` (and its ``PolicyCache``: residency,
pinning, demand-paging protection, overflow) drives it exactly as it drives the
firmware's own EMA.  What it does at each event is what the device's host side does:

* reads: the weights (Q0.16, :func:`kvcxl.firmware.fixedpoint.to_q16`) go to the
  engine's ``report`` port before the entry's table is swept;
* step end: an update sweep of every table (``step`` beat, ``k`` = 0);
* an eviction of ``k`` entries: the host writes each entry's eligibility (resident,
  not pinned, not just read) into its record's ``resident`` bit, then runs passes of at
  most ``batch`` victims, each an evaluation sweep (``hold``) whose victims leave the
  eligible set before the next;
* first write (``forget``): the entry's record starts at score 0, idle 0.

The on-chip table holds ``entries`` records.  A run with more entries is split into
tables of that size (entry ``i`` in table ``i // entries``, slot ``i % entries``): the
host keeps the records of the tables not on chip (each update sweep's ``scored`` tap is
the new record) and writes a table in through ``rec_w`` before sweeping it; a pass
sweeps every table that holds an eligible entry and merges their victim lists in the
engine's order (priority descending, entry ascending), which is exact because the
top-``k`` of a union lies in the union of the top-``k`` lists.

``check=True`` runs the firmware's integer-mode EMA beside it on the same events and
compares every pass: the first difference raises :class:`PassMismatch` naming the
step, the pass, the entry and both priorities.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kvcxl.firmware import fixedpoint as fx
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies.base import Policy, Tick
from kvcxl.firmware.policies.ema import EmaPolicy
from kvcxl.firmware.table import EntryTable, grow

from .verilated import HarnessError, Pass, VerilatedEngine


class PassMismatch(RuntimeError):
    """The RTL's victims differ from the firmware's: printed as one line, exit status 1."""

    exit_code = 1


class EnginePolicy(Policy):
    """The EMA policy (integer mode) computed by a :class:`VerilatedEngine`."""

    name = "ema"
    summary = "EMA attention score × recency decay, scored and selected by the Verilated RTL"
    modes = ("int",)
    columns = {}

    def __init__(
        self,
        config: PolicyConfig,
        table: EntryTable,
        engine: VerilatedEngine,
        *,
        check: bool = False,
    ) -> None:
        super().__init__(config, table)
        self.engine = engine
        self.size = engine.shape.entries
        self.lanes = engine.shape.lanes
        self.batch = engine.shape.batch
        self.shift = config.decay_shift
        engine.reset(
            fx.alpha_to_q16(config.alpha),
            fx.to_q16(config.touch_threshold),
            config.decay_shift,
            fx.decay_table(config.beta, config.decay_shift),
        )
        self.ref = EmaPolicy(config, table, mode="int") if check else None
        # The host's copy of every record (the chip's for the table on chip).
        self.rec_score = np.zeros(self.size, np.uint32)
        self.rec_idle = np.zeros(self.size, np.uint32)
        self.rec_elig = np.zeros(self.size, bool)  # written into the record's resident bit
        self.prio = np.zeros(self.size, np.uint32)  # the latest pass's priority (victim sink)
        self.loaded = -1  # the table on chip
        self.chip = (
            np.zeros(self.size, np.uint32),
            np.zeros(self.size, np.uint32),
            np.zeros(self.size, bool),
        )  # what the chip's records hold now
        self.pending: list[tuple[NDArray, NDArray]] = []  # this step's reports (ids, Q0.16)
        self.sent = 0  # reports of `pending` already in the on-chip buffer (one table only)
        self.stats = {"sweeps": 0, "passes": 0, "entry_updates": 0, "reports": 0}
        self.step_pass = 0  # passes since the step began (for messages)

    # --- storage --------------------------------------------------------------------------
    def ensure(self, n: int) -> None:
        n_tables = -(-max(n, 1) // self.size)
        cap = n_tables * self.size
        if cap > self.rec_score.size:
            self.rec_score = grow(self.rec_score, cap, 0)
            self.rec_idle = grow(self.rec_idle, cap, 0)
            self.rec_elig = grow(self.rec_elig, cap, False)
            self.prio = grow(self.prio, cap, 0)
        if self.ref is not None:
            self.ref.ensure(n)

    @property
    def tables(self) -> int:
        return -(-max(self.table.n, 1) // self.size)

    def forget(self, ids: NDArray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self.ensure(int(ids.max()) + 1)
        self.rec_score[ids] = 0
        self.rec_idle[ids] = 0
        if self.sent and self.pending:
            already = np.concatenate([p[0] for p in self.pending[: self.sent]])
            if np.isin(ids, already).any():
                raise HarnessError(
                    "an entry read earlier in this step starts afresh: the engine's weight "
                    "buffer cannot drop its report (run with more than one table)"
                )
        # The firmware drops a forgotten entry's reads of this step too.
        self.pending = [(i[~np.isin(i, ids)], w[~np.isin(i, ids)]) for i, w in self.pending]
        if self.ref is not None:
            self.ref.forget(ids)

    # --- events (insert and evict: the base class's, which forget without persistence) --
    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        self.ensure(int(ids.max()) + 1 if ids.size else 1)
        self.pending.append((ids, np.asarray(fx.to_q16(weights), dtype=np.uint32)))
        if self.ref is not None:
            self.ref.on_access(ids, weights, tick)

    def end_step(self, tick: Tick) -> None:
        for t in range(self.tables):
            p = self._sweep(t, 0, hold=False)
            sl = slice(t * self.size, (t + 1) * self.size)
            self.rec_score[sl], self.rec_idle[sl] = p.score, p.idle
            self.chip[0][:], self.chip[1][:] = p.score, p.idle
            self.stats["entry_updates"] += self.size
        self.pending, self.sent = [], 0
        self.step_pass = 0
        if self.ref is not None:
            self.ref.end_step(tick)

    # --- decisions --------------------------------------------------------------------------
    def select(self, eligible: NDArray, k: int, tick: Tick, ordered: bool = True) -> NDArray:
        eligible = np.asarray(eligible, dtype=np.int64)
        self.rec_elig[:] = False
        self.rec_elig[eligible] = True
        want = None
        if self.ref is not None:
            want = self.ref.select(eligible, k, tick)
        chosen: list[NDArray] = []
        left = min(k, eligible.size)
        while left > 0:
            kk = min(left, self.batch)
            tables = np.unique(eligible[self.rec_elig[eligible]] // self.size)
            ids, prio, taps = [], [], {}
            for t in tables.tolist():
                p = self._sweep(t, kk, hold=True)
                ids.append(p.victims + t * self.size)
                prio.append(p.priority)
                taps[t] = p
            got_ids, got_prio = np.concatenate(ids), np.concatenate(prio)
            order = np.lexsort((got_ids, -got_prio.astype(np.int64)))[:kk]
            got_ids, got_prio = got_ids[order], got_prio[order]
            if want is not None:
                done = sum(c.size for c in chosen)
                self._compare(tick, want[done : done + kk], got_ids, got_prio, taps)
            if got_ids.size == 0:
                break
            self.prio[got_ids] = got_prio
            self.rec_elig[got_ids] = False
            chosen.append(got_ids)
            left -= got_ids.size
            self.stats["passes"] += 1
            self.step_pass += 1
        out = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
        if want is not None and out.size != want.size:
            self._compare(tick, want, out, self.prio[out], {})
        return out

    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        """The engine's priority of ``ids`` in the latest pass that chose them."""
        return self.prio[np.asarray(ids, dtype=np.int64)].astype(np.int64)

    def wants_pin(self, ids: NDArray) -> NDArray:
        return EmaPolicy.wants_pin(self, ids)  # type: ignore[arg-type]

    def score(self, ids: NDArray) -> NDArray:
        return fx.from_q16(self.rec_score[np.asarray(ids, dtype=np.int64)])

    # --- the host side of the engine ------------------------------------------------------
    def _sweep(self, t: int, k: int, *, hold: bool) -> Pass:
        """Table ``t`` on chip with its records and this step's reports, then one sweep."""
        eng, size, lanes = self.engine, self.size, self.lanes
        sl = slice(t * size, (t + 1) * size)
        want = (self.rec_score[sl], self.rec_idle[sl], self.rec_elig[sl])
        if self.loaded != t:
            words = np.arange(size // lanes)
            self.sent = 0
        else:
            diff = np.zeros(size, bool)
            for a, b in zip(want, self.chip, strict=True):
                diff |= a != b
            words = np.flatnonzero(diff.reshape(-1, lanes).any(axis=1))
        if words.size:
            sel = (words[:, None] * lanes + np.arange(lanes)).ravel()
            zeros = np.zeros(sel.size, np.uint8)
            eng.write_records(
                words, want[0][sel], want[1][sel], zeros, want[2][sel].astype(np.uint8)
            )
            for a, b in zip(self.chip, want, strict=True):
                a[sel] = b[sel]
        self.loaded = t
        for ids, wq in self.pending[self.sent :]:
            mine = (ids // size) == t
            eng.report(ids[mine] % size, wq[mine])
            self.stats["reports"] += int(np.count_nonzero(mine))
        # One table: the buffer keeps the step's reports across evaluations (sent once).
        keep = hold and self.tables == 1
        self.sent = len(self.pending) if keep else 0
        self.stats["sweeps"] += 1
        return eng.sweep(k, hold=hold, keep=keep)

    def _compare(
        self, tick: Tick, want: NDArray, got: NDArray, got_prio: NDArray, taps: dict[int, Pass]
    ) -> None:
        n = max(want.size, got.size)
        for i in range(n):
            w = int(want[i]) if i < want.size else None
            g = int(got[i]) if i < got.size else None
            gp = int(got_prio[i]) if g is not None else None
            if w == g and (g is None or gp == self._fw_prio(g, tick)):
                continue
            where = f"step {tick.step}, pass {self.step_pass} of the step, victim {i}"
            parts = []
            if g is not None:
                parts.append(
                    f"RTL chose entry {g} (RTL priority {gp}, firmware {self._fw_prio(g, tick)})"
                )
            else:
                parts.append("RTL chose no entry")
            if w is not None:
                parts.append(
                    f"firmware chose entry {w} (firmware priority {self._fw_prio(w, tick)}, "
                    f"RTL {self._rtl_prio(w, taps)})"
                )
            else:
                parts.append("firmware chose no entry")
            raise PassMismatch(f"{where}: " + "; ".join(parts))

    def _fw_prio(self, e: int, tick: Tick) -> int:
        assert self.ref is not None
        return int(self.ref.priority(np.array([e]), tick)[0])

    def _rtl_prio(self, e: int, taps: dict[int, Pass]) -> str:
        p = taps.get(e // self.size)
        return "not swept" if p is None else str(int(p.tap_priority[e % self.size]))
