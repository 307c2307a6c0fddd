"""Replay a request stream through one policy on one HBM tier (no prefetch).

The building block the tests, the libCacheSim cross-check and the simulator of
kvcxl.emu use.  A request stream is a list of batches of entry ids (batch i at
time i), optionally with attention weights and the decode step of each batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .audit import EvictionAudit
from .cache import PolicyCache
from .config import PolicyConfig
from .policies import POLICIES, make_policy
from .policies.base import Tick
from .policies.belady import Future
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
) -> ReplayResult:
    """Hits and misses of ``policy`` on ``batches`` with ``capacity`` resident entries.

    Without ``steps`` every batch is its own decode step; without ``table`` every
    entry id is a block of its own context (no anchors, no positions).
    """
    config = config or PolicyConfig()
    n = 1 + max((int(np.max(b)) for b in batches if len(b)), default=-1)
    if table is None:
        table = EntryTable(block_tokens=16)
        table.append(np.arange(n), 0, 0, 1 << 20)  # far from any anchor zone
    kwargs: dict = dict(policy_kwargs or {})
    if policy in POLICIES and not POLICIES[policy].online:  # offline: given the future
        kwargs["future"] = Future.from_batches(list(batches))
    if policy == "ema":
        kwargs["mode"] = mode
    pol = make_policy(policy, config, table, **kwargs)
    aud = EvictionAudit() if audit else None
    victims: list[tuple[int, int, float]] = []

    def sink(ids: NDArray, prio: NDArray, tick: Tick) -> None:
        victims.extend(zip([tick.time] * ids.size, ids.tolist(), prio.tolist(), strict=True))

    cache = PolicyCache(
        pol,
        capacity,
        audit=aud,
        on_victims=sink if record_victims else None,
        protect_batch=protect_batch,
    )
    cache.ensure(n)
    last_step = None
    for t, batch in enumerate(batches):
        step = t if steps is None else int(steps[t])
        if last_step is not None and step != last_step:
            cache.end_step(Tick(last_step, t - 1))
        last_step = step
        b = np.asarray(batch, dtype=np.int64)
        w = np.ones(b.size) if weights is None else np.asarray(weights[t], dtype=np.float64)
        cache.access(b, w, Tick(step, t))
    if last_step is not None:
        cache.end_step(Tick(last_step, len(batches) - 1))
    return ReplayResult(
        policy=policy,
        capacity=capacity,
        hits=cache.stats.hits,
        misses=cache.stats.misses,
        evictions=cache.stats.evictions,
        audit=aud.as_dict() if aud else {},
        victims=victims,
    )
