"""The eviction audit (SPEC §6): every victim checked against a brute-force ranking.

The seed's first simulator evicted from a heap keyed on stale decaying scores and
picked the wrong victim 99.6 % of the time; only an external audit noticed.  Here
the audit is a standing check: for each eviction pass it recomputes every
eligible entry's priority from the policy's current state and sorts them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .select import reference_order
from .table import unique_ids


@dataclass
class EvictionAudit:
    """Counts audited victims, victims outside the true top-k, and misordered victims."""

    checked: int = 0
    wrong: int = 0
    misordered: int = 0
    order_checked: int = 0  # victims whose order was checked (passes selected in order)
    passes: int = 0
    examples: list[dict] = field(default_factory=list)
    max_examples: int = 8

    def check(
        self, eligible: NDArray, priority: NDArray, victims: NDArray, ordered: bool = True
    ) -> int:
        """Audit one selection; returns the number of wrong victims in it.

        ``ordered=False``: the victims were selected as a set, so only membership is checked.
        """
        victims = np.asarray(victims, dtype=np.int64)
        expected = reference_order(eligible, priority)[: victims.size]
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
        }
