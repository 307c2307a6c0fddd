"""The one interface every policy implements (libCacheSim-style: admit / touch / victims).

A policy owns per-entry metadata columns (numpy arrays indexed by entry id) and
answers one question: among these eligible entries, which go first?  It does so
through :meth:`Policy.priority` — a brute-force recomputation from current state,
higher evicts sooner — and :meth:`Policy.select`, which by default is the exact
O(n) selection of :func:`kvcxl.firmware.select.select_victims` over those
priorities.  The eviction audit compares the two on every pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from .. import fixedpoint as fx
from .. import policy_params
from ..config import PolicyConfig
from ..history import HistoryRule
from ..params import Param
from ..select import select_victims
from ..table import EntryTable, grow


@dataclass(frozen=True)
class Tick:
    """When something happens: the global decode ``step`` and the request-batch ``time``.

    ``time`` increases by one for every batch of reads (a layer of a step, or a
    single request when replaying a request trace); ``step`` increases by one per
    decode step.  Recency-style baselines count in ``time``; the EMA counts steps.
    """

    step: int
    time: int


POLICIES: dict[str, type[Policy]] = {}


class CapacityTooSmall(ValueError):
    """A policy cannot run at this cache capacity (e.g. a queue share below one entry).

    A ``ValueError`` (the CLI reports it in one line); drivers that run every policy at
    several capacities (``kvcxl policy compare``) report that policy's cell as not run.
    """


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    if cls.name in POLICIES:
        raise ValueError(f"policy name {cls.name!r} registered twice")
    if (cls.history is None) == (not cls.not_audited):
        # the audit recomputes a policy's priorities from each entry's own history: a policy
        # says how (its HistoryRule) or why it cannot — never silently neither, never both
        raise TypeError(
            f"policy {cls.name!r} must set exactly one of `history` (its HistoryRule, "
            "firmware/history.py) and `not_audited` (why its priority is not an entry's history)"
        )
    policy_params.declare(cls.name, cls.parameters)  # (the configuration's keys)
    POLICIES[cls.name] = cls
    return cls


class Policy(ABC):
    """Base class. Subclasses declare ``columns`` = {name: (dtype, fill)}."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    columns: ClassVar[dict[str, tuple[type, object]]] = {}
    online: ClassVar[bool] = True  # False for policies that see the future
    may_bypass: ClassVar[bool] = False  # may evict entries of the batch just read
    # A variant that exists for the ablation ladder (docs/validation.md), left out of the
    # policy rankings (docs/results.md).
    ablation: ClassVar[bool] = False
    modes: ClassVar[tuple[str, ...]] = ("float",)  # "int": also the Q0.16 contract (the RTL's)
    # This policy's own parameters (name → Param with its default); the values in use are
    # ``self.params``, taken from the configuration's policy_params (docs/policy.md).
    parameters: ClassVar[dict[str, Param]] = {}
    # Whether ``priority`` ranks entries outside HBM, so that ``cxl_order = "policy"``
    # orders CXL DRAM by it; False: CXL DRAM keeps its arrival order (docs/policy.md).
    ranks_lower_tiers: ClassVar[bool] = True
    # The audit's recomputation of ``priority`` from each entry's own history (a plain second
    # implementation, in the policy's file), or, when there is none, why (``not_audited``):
    # reports then print "not audited" for the history part (docs/policy.md, the audit).
    history: ClassVar[type[HistoryRule] | None] = None
    not_audited: ClassVar[str] = ""

    def __init__(self, config: PolicyConfig, table: EntryTable) -> None:
        self.config = config
        self.table = table
        self.params = SimpleNamespace(**{n: config.param(n) for n in self.parameters})
        for col, (dtype, fill) in self.columns.items():
            setattr(self, col, np.full(16, fill, dtype=dtype))

    def set_capacity(self, capacity: int) -> None:
        """The capacity in entries of the cache this policy serves (told once by the cache;
        policies that split it into queue shares use it).  A policy that cannot run at it
        raises :class:`CapacityTooSmall` naming the value."""
        self.capacity = int(capacity)

    # --- metadata storage -------------------------------------------------------
    def ensure(self, n: int) -> None:
        """Room for metadata of entries 0 … n−1."""
        for col, (_dtype, fill) in self.columns.items():
            setattr(self, col, grow(getattr(self, col), n, fill))

    def forget(self, ids: NDArray) -> None:
        """Drop the metadata of ``ids`` (back to the column defaults)."""
        for col, (_dtype, fill) in self.columns.items():
            getattr(self, col)[ids] = fill

    # --- events -----------------------------------------------------------------
    def on_insert(self, ids: NDArray, tick: Tick) -> None:
        """``ids`` became HBM-resident (a miss brought them in, a prefetch, or creation)."""
        if not self.config.persistent_metadata:
            self.forget(ids)

    def on_access(self, ids: NDArray, weights: NDArray, tick: Tick) -> None:  # noqa: B027
        """``ids`` were read in this batch with these attention weights (hits and misses)."""

    def on_evict(self, ids: NDArray, tick: Tick) -> None:
        """``ids`` left HBM. Without persistent metadata their state is dropped here."""
        if not self.config.persistent_metadata:
            self.forget(ids)

    def end_step(self, tick: Tick) -> None:  # noqa: B027
        """The decode step ``tick.step`` is over."""

    # --- decisions --------------------------------------------------------------
    @abstractmethod
    def priority(self, ids: NDArray, tick: Tick) -> NDArray:
        """Eviction priority of ``ids`` recomputed from current state; higher evicts sooner."""

    def select(self, eligible: NDArray, k: int, tick: Tick, ordered: bool = True) -> NDArray:
        """Up to ``k`` victims among ``eligible``, in eviction order (``ordered=False``: the
        same set, unordered)."""
        tie = self.tie(eligible, tick)
        return select_victims(eligible, self.priority(eligible, tick), k, ordered, tie)

    def tie(self, ids: NDArray, tick: Tick) -> NDArray | None:
        """The order among equal priorities, ascending first, before the entry index (the
        contract's tie-break); None (the default): the entry index alone."""
        return None

    def wants_pin(self, ids: NDArray) -> NDArray:
        """Which of ``ids`` this policy would pin (never evict). None by default."""
        return np.zeros(np.asarray(ids).size, dtype=bool)

    def score(self, ids: NDArray) -> NDArray:
        """The attention score used by placement and prefetch (0 for policies without one)."""
        return np.zeros(np.asarray(ids).size, dtype=np.float64)

    # --- what drivers read (placement, prefetch), so none branches on a policy's class ---
    @property
    def scored(self) -> bool:
        """Whether this policy keeps an attention score (placement and prefetch use it)."""
        return type(self).score is not Policy.score

    def score_q16(self, ids: NDArray) -> NDArray:
        """The score as Q0.16 integers (what integer-mode prefetch ranking consumes)."""
        return np.asarray(fx.to_q16(self.score(ids)))

    def idle_steps(self, ids: NDArray) -> NDArray | None:
        """Steps since each entry's last touch, for policies that count them (else None)."""
        return None

    @classmethod
    def budget_params(cls, budget_tokens: int) -> dict[str, Any]:
        """Own parameters this policy derives from a per-KV-head budget in tokens, for a
        driver that knows one (quality, calibration) and was not given them. None here."""
        return {}


def make_policy(name: str, config: PolicyConfig, table: EntryTable, **kwargs: object) -> Policy:
    """Instantiate a registered policy by name, with a clear error for an unknown one."""
    # lazy: the registry imports its own package (which imports this module) so that every
    # policy module is loaded; at module level this would be an import cycle
    from . import POLICIES as registry

    try:
        cls = registry[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; choose from: {', '.join(sorted(registry))}"
        ) from None
    return cls(config, table, **kwargs)
