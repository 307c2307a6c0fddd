"""The eviction audit (docs/policy.md): every victim checked twice.

The seed's first simulator evicted from a heap keyed on stale decaying scores and
picked the wrong victim 99.6 % of the time; only an external audit noticed.  Here
the audit is a standing check with two parts:

* **top-k** (``wrong``, ``misordered``): for each eviction pass it recomputes every
  eligible entry's priority from the policy's current state, sorts them all by the
  contract order and compares the victims with the true top-k.  This catches a
  broken selection, never a wrong priority.
* **history** (``priority_mismatches``, ``outranked``, ``pin_violations``): an
  :class:`~kvcxl.firmware.history.EntryHistory` records each entry's own history
  from the cache's events and recomputes priorities from it by the documented
  formulas — for every victim and a sample of the other eligible entries per pass
  (all of them when there are few).  A priority that differs from the policy's,
  a sampled entry that should have gone before a victim, or a victim the
  documented pinning rule protects, is counted.  This catches an idle counter not
  reset, a context length that shrank, a pin ignored, an EMA stepped wrongly.
  Each policy owns its rule (its class's ``history``); a policy whose priority is not an
  entry's own history (random and the offline keys are inputs; the queue walks move
  other entries) says why in ``not_audited``, gets the top-k part only, and its history
  counts are ``None``: reports print "not audited" for it, never ``0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .history import EntryHistory
from .select import reference_order
from .table import unique_ids

HISTORY_SAMPLE = 64  # non-victims recomputed per pass (every eligible entry up to 4× this)


def _same(a: NDArray, b: NDArray) -> NDArray:
    """Where two computations of one quantity agree (floats: within rounding)."""
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return np.isclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-9, atol=1e-12)
    return np.asarray(a == b)


@dataclass
class EvictionAudit:
    """Counts audited victims, victims outside the true top-k, and misordered victims."""

    checked: int = 0
    wrong: int = 0
    misordered: int = 0
    order_checked: int = 0  # victims whose order was checked (passes selected in order)
    passes: int = 0
    history: bool = True  # also recompute priorities from each entry's own history
    history_checked: int = 0  # entries whose priority was recomputed from history
    priority_mismatches: int = 0
    outranked: int = 0  # recomputed non-victims that should have gone before a victim
    pin_violations: int = 0
    examples: list[dict] = field(default_factory=list)
    max_examples: int = 8
    not_audited: str | None = None  # why the history part did not run (None: it did)
    _hist: EntryHistory | None = field(default=None, repr=False)
    _rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0), repr=False)

    # --- the history: the cache reports its events here ---------------------------------
    def attach(self, policy: object, pinned_capacity: int) -> None:
        """Start a history of ``policy``'s entries (called by the cache that owns both)."""
        if not self.history:
            self.not_audited = "the history audit was switched off"
        elif type(policy).history is None:
            self.not_audited = type(policy).not_audited
        else:
            self._hist = EntryHistory(policy, pinned_capacity)

    def on_admit(self, ids: NDArray, time: int) -> None:
        if self._hist is not None:
            self._hist.on_admit(ids, time)

    def on_read(self, ids: NDArray, weights: NDArray, time: int) -> None:
        if self._hist is not None:
            self._hist.on_read(ids, weights, time)

    def on_forget(self, ids: NDArray) -> None:
        if self._hist is not None:
            self._hist.on_forget(ids)

    def on_end_step(self) -> None:
        if self._hist is not None:
            self._hist.on_end_step()

    def check_history(self, eligible: NDArray, victims: NDArray, policy: object, tick) -> int:
        """Recompute victims' and sampled entries' priorities from history; returns faults."""
        h = self._hist
        if h is None or victims.size == 0:
            return 0
        faults = 0
        pinned = victims[h.pinned[victims]] if victims.max() < h.pinned.size else victims[:0]
        self.pin_violations += int(pinned.size)
        faults += int(pinned.size)
        rest = np.setdiff1d(eligible, victims, assume_unique=True)
        if rest.size > 4 * HISTORY_SAMPLE:
            rest = self._rng.choice(rest, HISTORY_SAMPLE, replace=False)
        sample = np.concatenate([victims, rest])
        hp = h.priority(sample, tick.time)
        pp = np.asarray(policy.priority(sample, tick))  # type: ignore[attr-defined]
        same = _same(pp, hp)
        ht = h.tie(sample, tick.time)  # the policy's key among equal priorities, if any
        pt = policy.tie(sample, tick)  # type: ignore[attr-defined]
        if (ht is None) != (pt is None):
            same[:] = False
        elif ht is not None and pt is not None:
            same &= _same(np.asarray(pt), ht)
        bad = int(np.count_nonzero(~same))
        # By the history's own priorities, no sampled non-victim may outrank a victim.
        v, r = hp[: victims.size], hp[victims.size :]
        lo = np.argmin(v) if v.size else 0  # the last victim in contract order
        lo_p = v[lo]
        at_lo = v == lo_p
        if ht is None:
            lo_id = victims[at_lo].max()
            before = rest < lo_id
        else:  # among equal priorities: (tie, id), a near-equal float tie decides nothing
            vt, rt = ht[: victims.size][at_lo], ht[victims.size :]
            last = np.lexsort((victims[at_lo], vt))[-1]
            lo_t, lo_id = vt[last], victims[at_lo][last]
            if rt.dtype.kind == "f":
                close = np.isclose(rt, lo_t, rtol=1e-9, atol=1e-12)
                before = ((rt < lo_t) & ~close) | ((rt == lo_t) & (rest < lo_id))
            else:
                before = (rt < lo_t) | ((rt == lo_t) & (rest < lo_id))
        out = int(np.count_nonzero((r > lo_p) | ((r == lo_p) & before)))
        if hp.dtype.kind == "f":  # a near-tie within rounding is not a fault
            out = int(
                np.count_nonzero(
                    ((r > lo_p) & ~np.isclose(r, lo_p, rtol=1e-9, atol=1e-12))
                    | ((r == lo_p) & before)
                )
            )
        self.history_checked += int(sample.size)
        self.priority_mismatches += bad
        self.outranked += out
        if (bad or out) and len(self.examples) < self.max_examples:
            i = int(np.flatnonzero(~same)[0]) if bad else 0
            self.examples.append(
                {
                    "entry": int(sample[i]),
                    "policy_priority": float(pp[i]),
                    "history_priority": float(hp[i]),
                    "step": int(tick.step),
                    "outranked": out,
                }
            )
        return faults + bad + out

    def check(
        self,
        eligible: NDArray,
        priority: NDArray,
        victims: NDArray,
        ordered: bool = True,
        tie: NDArray | None = None,
    ) -> int:
        """Audit one selection; returns the number of wrong victims in it.

        ``ordered=False``: the victims were selected as a set, so only membership is checked.
        ``tie``: the policy's key among equal priorities (``Policy.tie``), before the id.
        """
        victims = np.asarray(victims, dtype=np.int64)
        expected = reference_order(eligible, priority, tie)[: victims.size]
        distinct = unique_ids(victims)
        wrong = int(np.setdiff1d(distinct, expected, assume_unique=True).size)
        wrong += victims.size - distinct.size  # a victim chosen twice
        if ordered:
            self.misordered += int(np.count_nonzero(victims != expected))
            self.order_checked += int(victims.size)
        self.checked += int(victims.size)
        self.wrong += wrong
        self.passes += 1
        if wrong and len(self.examples) < self.max_examples:
            self.examples.append(
                {"victims": victims[:8].tolist(), "expected": expected[:8].tolist()}
            )
        return wrong

    def as_dict(self) -> dict:
        return {
            "audited_victims": self.checked,
            "wrong_victims": self.wrong,
            "misordered_victims": self.misordered if self.order_checked else None,
            "audited_passes": self.passes,
            "history_checked": self.history_checked if self._hist is not None else None,
            "priority_mismatches": self.priority_mismatches if self._hist is not None else None,
            "outranked_by_history": self.outranked if self._hist is not None else None,
            "pin_violations": self.pin_violations if self._hist is not None else None,
            "history_not_audited": self.not_audited,
        }

    @property
    def faults(self) -> int:
        """Everything the audit found wrong (0 on a correct run)."""
        return self.wrong + self.priority_mismatches + self.outranked + self.pin_violations
