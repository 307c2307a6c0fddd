"""Replay a request stream through one policy on one HBM tier (no prefetch).

The building block the tests, the libCacheSim cross-check and `kvcxl policy
compare` use; it drives the firmware session like every other driver.  A request
stream is a list of batches of entry ids (batch i at time i), optionally with
attention weights and the decode step of each batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .config import PolicyConfig
from .policies import POLICIES
from .policies.belady import Future
from .session import FirmwareSession
from .table import EntryTable


@dataclass
class ReplayResult:
    policy: str
    capacity: int
    hits: int
    misses: int
    evictions: int
    audit: dict = field(default_factory=dict)
    victims: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def replay(
    policy: str,
    batches: Sequence[NDArray],
    capacity: int,
    *,
    config: PolicyConfig | None = None,
    weights: Sequence[NDArray] | None = None,
    steps: Sequence[int] | None = None,
    table: EntryTable | None = None,
    audit: bool = True,
    record_victims: bool = False,
    mode: str = "float",
    protect_batch: bool | None = None,
    policy_kwargs: dict | None = None,
    placement: str = "fill",
) -> ReplayResult:
    """Hits and misses of ``policy`` on ``batches`` with ``capacity`` resident entries.

    Without ``steps`` every batch is its own decode step; without ``table`` every
    entry id is a block of its own context (no anchors, no positions).  ``placement``
    "policy" runs the firmware's placement rule (with managed tiers, its eviction layers),
    as the device does; "fill" (default) sends every victim to the next tier.
    """
    n = 1 + max((int(np.max(b)) for b in batches if len(b)), default=-1)
    if table is None:
        table = EntryTable(block_tokens=16)
        table.append(np.arange(n), 0, 0, 1 << 20)  # far from any anchor zone
    offline = policy in POLICIES and not POLICIES[policy].online
    fw = FirmwareSession(
        policy,
        capacity,
        config,
        mode=mode,
        table=table,
        audit=audit,
        placement=placement,
        future=Future.from_batches(list(batches)) if offline else None,  # given the future
        victim_priority=record_victims,
        policy_kwargs=policy_kwargs,
        protect_batch=protect_batch,
    )
    fw.ensure(n)
    victims: list[tuple[int, int, float]] = []
    for t, batch in enumerate(batches):  # batch t is at time t (the session's clock)
        step = t if steps is None else int(steps[t])
        b = np.asarray(batch, dtype=np.int64)
        w = np.ones(b.size) if weights is None else np.asarray(weights[t], dtype=np.float64)
        _hit, d = fw.read(step, b, w)
        if record_victims and d.victims.size:
            assert d.priority is not None
            victims += zip(
                [t] * d.victims.size, d.victims.tolist(), d.priority.tolist(), strict=True
            )
    fw.end_step()
    st = fw.cache.stats
    return ReplayResult(
        policy=policy,
        capacity=capacity,
        hits=st.hits,
        misses=st.misses,
        evictions=st.evictions,
        audit=fw.audit.as_dict() if fw.audit else {},
        victims=victims,
    )
