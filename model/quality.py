"""Output quality of the real model when its KV cache is bounded by a policy.

For one token sequence (a captured trace's prompt + greedy continuation) the model
is run twice over the same tokens (teacher forcing): once with the full cache (the
reference) and once with a cache of ``budget`` tokens per KV head, managed by a
policy of :mod:`kvcxl.firmware.policies` through the firmware session
(:class:`~kvcxl.firmware.session.FirmwareSession`), as every other driver.
At every position the next-token distributions are compared: KL(full ‖ bounded)
and whether the greedy (top-1) token agrees.

How the bounded run works (closed loop, what a deployed bounded cache sees):

* Entries are blocks of ``block_tokens`` positions of one (layer, KV head).  The
  capacity is ``budget_tokens / block_tokens × layers × kv_heads`` entries in one
  pool, so a policy may keep more blocks for one head than for another.
* When a position opens a new block, that block's entries (every layer and head)
  are inserted; if the pool is then over capacity the policy evicts, exactly and
  audited.  An evicted block is dropped: later queries never see it again.
* Each position's query attends only to the resident blocks plus its own block
  (the one being written; a cache cannot drop the block it is filling).  Kept
  blocks keep their original positions (RoPE was applied when they were written).
* After each position the policy is told what was read: every resident entry,
  with this run's own block attention (combined over the GQA group by the
  configured aggregation), then the step ends.

Because residency only changes when a block opens, each block's positions run as
one chunk through the model; the result equals a token-by-token run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.common.progress import progress as progress_bar
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.session import FirmwareSession

#: Short names for policy variants that are not separate firmware policies.
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "window": ("sink-window", {"sink_tokens": 0}),  # recent window only, no sink
}


@dataclass(frozen=True)
class PolicySpec:
    """A policy by name with parameter overrides: ``NAME[:key=value,...]``."""

    label: str
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> PolicySpec:

        label = text.strip()
        name, _, rest = label.partition(":")
        overrides: dict[str, Any] = {}
        if name in ALIASES:
            name, base = ALIASES[name]
            overrides.update(base)
        if name not in POLICIES:
            known = sorted([*POLICIES, *ALIASES])
            raise ValueError(f"unknown policy {name!r}; choose from: {', '.join(known)}")
        if not POLICIES[name].online:
            raise ValueError(f"policy {name!r} needs the future reads, which a bounded run changes")
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"policy option {item!r} in {text!r}: expected key=value")
            overrides[key.strip()] = _parse_value(value.strip())
        return cls(label, name, overrides)


def _parse_value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


@dataclass
class Reference:
    """The full-cache run: logits and greedy tokens at every position."""

    logits: NDArray  # (n, vocab) float32 (log-softmax is taken in float64 when comparing)
    top1: NDArray  # (n,) int64
    weights: NDArray  # (n, layers, kv_heads, blocks) float32 block attention


@dataclass
class BoundedResult:
    label: str
    policy: str
    budget_tokens: int
    capacity_entries: int
    kl: NDArray  # (n,) float64, KL(full ‖ bounded) per position
    agree: NDArray  # (n,) bool, top-1 agreement per position
    bounded: NDArray  # (n,) bool, the cache held fewer blocks than the context had
    cache: dict[str, int]
    audit: dict[str, int]
    config: dict[str, Any]

    def summary(self, first_decode: int) -> dict[str, Any]:
        n = self.kl.size
        dec = np.arange(n) >= first_decode
        out: dict[str, Any] = {
            "policy": self.label,
            "firmware_policy": self.policy,
            "budget_tokens": self.budget_tokens,
            "capacity_entries": self.capacity_entries,
        }
        for tag, sel in (("all", np.ones(n, bool)), ("bounded", self.bounded), ("decode", dec)):
            k = int(sel.sum())
            out[f"steps_{tag}"] = k
            out[f"kl_{tag}"] = float(self.kl[sel].mean()) if k else 0.0
            out[f"top1_{tag}"] = float(self.agree[sel].mean()) if k else 1.0
        out["kl_bounded_ci95"] = _ci95(self.kl[self.bounded])
        out["audit"] = self.audit
        out["cache"] = self.cache
        return out


def _ci95(x: NDArray) -> float:
    if x.size < 2:
        return 0.0
    return float(1.96 * x.std(ddof=1) / math.sqrt(x.size))


def _log_softmax(logits: NDArray) -> NDArray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _block_ids(L: int, H: int) -> tuple[NDArray, NDArray]:
    lay, hd = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    return lay.ravel(), hd.ravel()


def budget_overrides(policy: PolicySpec, budget_tokens: int) -> dict[str, Any]:
    """The policy's parameters at this budget: its budget-derived ones (h2o: half the
    budget is its recent window) unless the spec gives them."""
    return {**POLICIES[policy.name].budget_params(budget_tokens), **policy.overrides}


class BoundedCache:
    """A KV cache of ``budget_tokens`` per KV head (on average) whose blocks a policy keeps.

    Entries are blocks of ``block_tokens`` positions of one (layer, KV head) in one pool
    of ``budget_tokens // block_tokens × layers × kv_heads`` entries, managed by the
    policy through a :class:`FirmwareSession` (audited).  A driver walks the positions in
    order: :meth:`open_block` at a block's first position (writes its entries, evicting
    if over capacity, and returns the ``visible`` mask for :meth:`Llama.forward`), then
    :meth:`observe` with the attention those positions paid (every resident entry is
    read with its weight).  An evicted block is dropped: it is never visible again.
    """

    def __init__(
        self,
        policy: PolicySpec,
        budget_tokens: int,
        model_cfg: Any,
        n_blocks: int,
        *,
        block_tokens: int = 16,
        config: Any = None,
    ) -> None:
        if budget_tokens < block_tokens:
            raise ValueError(
                f"budget = {budget_tokens} tokens per KV head: must be at least one block "
                f"({block_tokens} tokens)"
            )
        self._overrides = budget_overrides(policy, budget_tokens)
        self.policy = policy
        self.config = (config or PolicyConfig()).with_(**self._overrides)
        self.L, self.H = model_cfg.layers, model_cfg.n_kv_heads
        self.block_tokens = block_tokens
        self.capacity = (budget_tokens // block_tokens) * self.L * self.H
        self.fw = FirmwareSession(
            policy.name,
            self.capacity,
            self.config,
            block_tokens=block_tokens,
            audit=True,
            placement="fill",
        )
        self.fw.ensure(n_blocks * self.L * self.H)
        self._lay, self._hd = _block_ids(self.L, self.H)
        self._ctx = np.zeros(self.L * self.H, dtype=np.int64)

    def visible(self) -> NDArray:
        """(layers, kv_heads, blocks written) bool: the resident blocks."""
        res = self.fw.resident()
        return res.reshape(-1, self.L, self.H).transpose(1, 2, 0)

    @property
    def bounded(self) -> bool:
        """The cache holds fewer blocks than have been written."""
        return int(self.fw.resident().sum()) < self.fw.table.n

    def open_block(self, p0: int) -> NDArray:
        """Position ``p0`` starts block ``p0 // block_tokens``: write it; the visible mask."""
        b = p0 // self.block_tokens
        self.fw.at(p0)
        self.fw.lengths(0, p0 + 1)
        self.fw.write(
            p0, self.fw.describe(self._ctx, self._lay, self._hd, np.full(self.L * self.H, b))
        )
        return self.visible()

    def observe(self, p0: int, att: NDArray) -> None:
        """Positions ``p0 …`` paid ``att`` ((n, layers, kv_heads, ≥ blocks)): read the resident."""
        read = np.flatnonzero(self.fw.resident())
        nb = self.fw.table.n // (self.L * self.H)  # entry id = block·L·H + layer·H + head
        for i in range(att.shape[0]):
            p = p0 + i
            self.fw.lengths(0, p + 1)
            w = att[i, :, :, :nb].transpose(2, 0, 1).reshape(-1)
            self.fw.read(p, read, w[read])

    def finish(self) -> Any:
        """Close the last step; the audit (raises if it found a wrong victim)."""
        self.fw.end_step()
        audit = self.fw.audit
        assert audit is not None
        if audit.faults:  # a wrong victim, or a priority its entry's history contradicts
            raise RuntimeError(f"eviction audit failed for {self.policy.label}: {audit.as_dict()}")
        return audit

    def used_config(self) -> dict[str, Any]:
        """The parameters that shaped this run (overrides, the shared ones, the policy's own)."""
        pcfg = self.config
        return {
            **{k: v for k, v in pcfg.to_dict().items() if k in self._overrides or k in _RELEVANT},
            **{k: pcfg.param(k) for k in POLICIES[self.policy.name].parameters},
        }


def run(
    model: Any,
    tokens: Sequence[int],
    *,
    policy: PolicySpec | None,
    budget_tokens: int | None,
    block_tokens: int = 16,
    config: Any = None,
    reference: Reference | None = None,
    tick: Callable[[], None] | None = None,
) -> tuple[Reference | None, BoundedResult | None]:
    """One run over ``tokens``; without a policy it is the full-cache reference.

    Returns (reference, None) for a reference run and (None, result) for a bounded one.
    """

    cfg_m = model.cfg
    L, H = cfg_m.layers, cfg_m.n_kv_heads
    n = len(tokens)
    nb_total = -(-n // block_tokens)
    base = config or PolicyConfig()
    kv = model.new_cache(n)
    if policy is None:
        logits = np.zeros((n, cfg_m.vocab), dtype=np.float32)
        weights = np.zeros((n, L, H, nb_total), dtype=np.float32)
        for b in range(nb_total):
            p0, p1 = b * block_tokens, min(n, (b + 1) * block_tokens)
            lg, att = model.forward(
                tokens[p0:p1], kv, block_tokens=block_tokens, capture=base.aggregation
            )
            logits[p0:p1] = lg
            weights[p0:p1, :, :, : b + 1] = att
            if tick:
                tick()
        return Reference(logits, logits.argmax(-1), weights), None
    if reference is None:
        raise ValueError("a bounded run needs the reference run")
    if budget_tokens is None:
        raise ValueError("a bounded run needs a budget")
    bc = BoundedCache(
        policy, budget_tokens, cfg_m, nb_total, block_tokens=block_tokens, config=base
    )
    kl = np.zeros(n)
    agree = np.zeros(n, dtype=bool)
    bounded = np.zeros(n, dtype=bool)
    for b in range(nb_total):  # one step per token; a block's first token writes the block
        p0, p1 = b * block_tokens, min(n, (b + 1) * block_tokens)
        visible = bc.open_block(p0)
        lg, att = model.forward(
            tokens[p0:p1],
            kv,
            block_tokens=block_tokens,
            capture=bc.config.aggregation,
            visible=visible,
        )
        lp = _log_softmax(lg)
        ref = _log_softmax(reference.logits[p0:p1])
        kl[p0:p1] = np.maximum((np.exp(ref) * (ref - lp)).sum(-1), 0.0)
        agree[p0:p1] = lp.argmax(-1) == reference.top1[p0:p1]
        bounded[p0:p1] = bc.bounded
        bc.observe(p0, att)
        if tick:
            tick()
    audit = bc.finish()
    return None, BoundedResult(
        label=policy.label,
        policy=policy.name,
        budget_tokens=budget_tokens,
        capacity_entries=bc.capacity,
        kl=kl,
        agree=agree,
        bounded=bounded,
        cache=bc.fw.cache.stats.as_dict(),
        audit=audit.as_dict(),
        config=bc.used_config(),
    )


_RELEVANT = (
    "alpha",
    "beta",
    "touch_threshold",
    "aggregation",
    "anchor_zone_size",
    "pinned_fraction",
)


def evaluate(
    model: Any,
    tokens: Sequence[int],
    policies: Sequence[PolicySpec],
    budgets: Sequence[int],
    *,
    block_tokens: int = 16,
    config: Any = None,
    progress: bool = False,
    reference: Reference | None = None,
) -> tuple[Reference, list[BoundedResult]]:
    """The reference run and one bounded run per (policy, budget)."""

    nb = -(-len(tokens) // block_tokens)
    runs = len(policies) * len(budgets) + (reference is None)
    bar, _ = progress_bar(runs * nb, "quality", "block", off=not progress)
    if reference is None:
        reference, _ = run(
            model,
            tokens,
            policy=None,
            budget_tokens=None,
            block_tokens=block_tokens,
            config=config,
            tick=lambda: bar.update(1),
        )
    assert reference is not None
    results = []
    for spec in policies:
        for budget in budgets:
            _, res = run(
                model,
                tokens,
                policy=spec,
                budget_tokens=budget,
                block_tokens=block_tokens,
                config=config,
                reference=reference,
                tick=lambda: bar.update(1),
            )
            assert res is not None
            results.append(res)
    bar.close()
    return reference, results
