"""The one validated configuration of the policy engine.

Every parameter of the designed engine (docs/design.md, "The policy" and
"Uncalibrated parameters") lives here with its default, its allowed range and a
sentence on which way it pushes.  A parameter that belongs to one baseline policy
(h2o's recent window, LRFU's λ, ...) is declared in
:mod:`kvcxl.firmware.policy_params`, listed by the policies that use it
(``Policy.parameters``) and only carried here, so that one file or one set of
options configures a whole comparison.  Nothing else in the project
holds a default for these values.  An out-of-range or
inconsistent value is refused with a :class:`ConfigError` naming the parameter,
the value and the allowed range.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from . import policy_params as own_params
from .params import REAL, ConfigError, Param, in_range, one_of

__all__ = ["PARAMS", "REAL", "ConfigError", "Param", "PolicyConfig", "in_range", "one_of"]


def _unit_triple_or_pair(n: int) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return len(v) == n and all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in v)

    return check


PARAMS: dict[str, Param] = {
    "alpha": Param(
        "(0, 1]",
        in_range(0.0, 1.0, lo_open=True),
        REAL,
        "EMA smoothing factor: score[t] = α·w[t] + (1−α)·score[t−1]. Higher reacts faster "
        "to attention shifts and forgets sooner (half-life ln0.5/ln(1−α) steps); lower "
        "holds long-run importance. Design default 0.2 (3.1-step half-life); Appendix N "
        "found an interior optimum near 0.05 (docs/design.md).",
    ),
    "beta": Param(
        "[0, 1]",
        in_range(0.0, 1.0),
        REAL,
        "Recency-decay coefficient in r = 1 − exp(−β·steps_since_access); 1/β is the "
        "idleness horizon in decode steps. Raising it makes eviction recency-driven and "
        "puts long-lived, rarely touched entries at risk; lowering it lets stale entries "
        "linger. β = 0 leaves priority = 0 for every entry (pure index order).",
    ),
    "touch_threshold": Param(
        "[0, 1]",
        in_range(0.0, 1.0),
        REAL,
        "A read entry counts as touched (resets steps_since_access) only if its "
        "attention weight is at least this. Raising it lets weakly attended entries age "
        "although they are read every step (dense attention reads everything).",
    ),
    "aggregation": Param(
        "'max' or 'mean'",
        one_of("max", "mean"),
        str,
        "How the per-query-head weights of a GQA group combine into one KV-head weight. "
        "'max' protects an entry any head needs; 'mean' favours entries all heads use.",
    ),
    "anchor_zone_size": Param(
        "[0, 1048576] tokens",
        in_range(0, 1 << 20),
        int,
        "Entries whose first token position is below this are pinned and never evicted "
        "(attention sinks, system prompt). Raising it spends pinned HBM on positions that "
        "may never be attended; lowering it risks evicting the sink.",
    ),
    "keep_threshold": Param(
        "(0, 1], > evict_threshold",
        in_range(0.0, 1.0, lo_open=True),
        REAL,
        "Threshold placement: score ≥ keep wants HBM. With managed tiers such an entry is "
        "evicted only when the entries below keep cannot cover the overflow (static tiers: "
        "decides nothing). Raising it shrinks the protected hot set; lowering it grows it.",
    ),
    "evict_threshold": Param(
        "[0, 1), < keep_threshold",
        in_range(0.0, 1.0, hi_open=True),
        REAL,
        "Threshold placement: score < evict sinks to NVMe; between evict and keep lives "
        "in CXL DRAM. Static tiers: a victim below it goes straight to NVMe; managed: "
        "victims land in CXL DRAM and one below it sinks at a step boundary. Raising it "
        "reclaims CXL DRAM sooner at the cost of more NVMe reads.",
    ),
    "placement_mode": Param(
        "'thresholds' or 'weighted'",
        one_of("thresholds", "weighted"),
        str,
        "Which placement rule decides an entry's tier (static tiers: a victim's; managed: "
        "also the eviction order and the background moves).",
    ),
    "placement_weights": Param(
        "three values in [0, 1] summing to 1 (R, E, N)",
        _unit_triple_or_pair(3),
        (tuple, list),
        "Weighted placement P = wR·R + wE·E + wN·N with R = 1 − r, E = score, N = anchor. "
        "More E tracks sustained attention; more R reacts to recent touches; more N "
        "hardens the anchor zone. Decides with managed tiers and weighted placement.",
    ),
    "placement_cuts": Param(
        "two values 0 < low < high < 1",
        _unit_triple_or_pair(2),
        (tuple, list),
        "Cut points on P: below low → CXL DRAM, [low, high) → HBM, ≥ high → pinned HBM "
        "(evicted only when nothing below high covers the overflow). Decides with managed "
        "tiers and weighted placement: raising either frees HBM sooner (low: more entries "
        "evicted first and demoted at step boundaries; high: fewer held back).",
    ),
    "prefetch_window": Param(
        "[0, 1048576] tokens",
        in_range(0, 1 << 20),
        int,
        "Prefetch radius W: a touch of block b proposes blocks within ±W tokens. Wider "
        "covers more at linearly growing speculative bandwidth; 0 disables the window.",
    ),
    "prefetch_distance_scale": Param(
        "(0, 1e9]",
        in_range(0.0, 1e9, lo_open=True),
        REAL,
        "Distance in tokens at which the RoPE locality term 1/(1 + d/scale) halves. "
        "Raising it flattens the ranking toward far blocks.",
    ),
    "prefetch_blend": Param(
        "two values in [0, 1] summing to 1 (rope, score)",
        _unit_triple_or_pair(2),
        (tuple, list),
        "Prefetch rank = b_rope·rope + b_score·score. Toward rope is a positional sliding "
        "window; toward score follows attention history (retrieval heads).",
    ),
    "prefetch_depth": Param(
        "[0, 16] layers",
        in_range(0, 16),
        int,
        "How many following layers a touch prefetches into. 0 disables prefetch.",
    ),
    "eviction_batch": Param(
        "[1, 65536] entries",
        in_range(1, 65536),
        int,
        "Most entries evicted by one policy pass. With eviction_passes 'batched' a pass "
        "evicts this many: larger evicts past the overflow more often and decides later "
        "admissions' room on older priorities; smaller keeps decisions fresh.",
    ),
    "persistent_metadata": Param(
        "true or false",
        lambda v: isinstance(v, bool),
        bool,
        "Keep an entry's score and last touch when its data leaves HBM or its context "
        "goes idle; off forgets them on eviction (the seed's Revision-1 behaviour).",
    ),
    "pinned_fraction": Param(
        "[0, 1]",
        in_range(0.0, 1.0),
        REAL,
        "Largest share of the HBM KV budget that pinned (anchor) entries may hold; "
        "anchors beyond it are ordinary entries. S1 pins 10 of 47 GB ≈ 0.21.",
    ),
    "decay_shift": Param(
        "[0, 8]",
        in_range(0, 8),
        int,
        "Integer mode: the recency-decay table is indexed by min(idle >> shift, 255). "
        "Larger covers a longer idle horizon at coarser resolution; see docs/policy.md "
        "for the error bound it implies.",
    ),
    "pcie_contention": Param(
        "(0, 1]",
        in_range(0.0, 1.0, lo_open=True),
        REAL,
        "Fraction of PCIe Gen5 x16 bandwidth the host-DRAM offload baseline sustains "
        "(the design's 0.32; the measured 87 % of spec: docs/design.md). Read by the "
        "transfer timeline's offload preset (`--timing offload`, `--versus-offload`): "
        "lower makes host offload slower against the device.",
    ),
    "eviction_passes": Param(
        "'exact' or 'batched'",
        one_of("exact", "batched"),
        str,
        "How an overflow is evicted. 'exact': exactly the overflow, the exact top-k of one "
        "ranking (eviction_batch only counts passes). 'batched': passes of eviction_batch "
        "victims, each ranked when it begins, until the overflow is covered; the last pass "
        "may evict past it (the RTL's batch slots). Default 'exact' until a calibration "
        "against the RTL's batch size says otherwise.",
    ),
    "cxl_order": Param(
        "'fifo' or 'policy'",
        one_of("fifo", "policy"),
        str,
        "Which CXL DRAM entries go down to NVMe when CXL DRAM is full. 'policy' (default): "
        "the running policy's own eviction order (highest priority first), so the policy "
        "ranks the lower tiers too; 'fifo': the earliest arrivals (the comparison baseline).",
    ),
    "tier_management": Param(
        "'static' or 'managed'",
        one_of("static", "managed"),
        str,
        "'managed' (default; scored policies): the placement rule also decides which HBM "
        "entries are evicted last (score ≥ keep, or P ≥ the low cut) and moves lower-tier "
        "entries at each step boundary (docs/policy.md, managed tiers). 'static' (the "
        "comparison baseline): placement decides once, as a victim leaves HBM.",
    ),
    "background_moves": Param(
        "[0, 1048576] entries per step",
        in_range(0, 1 << 20),
        int,
        "Managed tiers: most entries the firmware moves between tiers at one step boundary "
        "(demotions first, then raises). Higher follows the scores sooner at more background "
        "traffic; 0 leaves only the moves capacity forces.",
    ),
}


@dataclass(frozen=True)
class PolicyConfig:
    """Every parameter of the policy engine, validated on construction."""

    alpha: float = 0.2
    beta: float = 0.001
    touch_threshold: float = 0.01
    aggregation: str = "max"
    anchor_zone_size: int = 100
    keep_threshold: float = 0.10
    evict_threshold: float = 0.02
    placement_mode: str = "thresholds"
    placement_weights: tuple[float, float, float] = (0.25, 0.55, 0.20)
    placement_cuts: tuple[float, float] = (0.3, 0.6)
    prefetch_window: int = 128
    prefetch_distance_scale: float = 100.0
    prefetch_blend: tuple[float, float] = (0.6, 0.4)
    prefetch_depth: int = 2
    eviction_batch: int = 64
    persistent_metadata: bool = True
    pinned_fraction: float = 0.25
    decay_shift: int = 4
    pcie_contention: float = 0.32
    eviction_passes: str = "exact"
    cxl_order: str = "policy"
    tier_management: str = "managed"
    background_moves: int = 256
    # Parameters that belong to one policy (declared by it: ``Policy.parameters``), as
    # set here; a policy reads its own through ``policy.params``.
    policy_params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in PARAMS:
                object.__setattr__(
                    self, f.name, PARAMS[f.name].refuse(f.name, getattr(self, f.name))
                )
        table = own_params.table()
        given = dict(self.policy_params)
        for name in given:
            if name not in table:
                raise ConfigError(_unknown(name))
        checked = tuple(sorted((k, table[k].refuse(k, v)) for k, v in given.items()))
        object.__setattr__(self, "policy_params", checked)
        self._check_consistency()

    def effective(self) -> dict[str, Any]:
        """Every parameter with the value in use: the engine's, then every policy's own (as set
        here, else its default)."""
        flat = self.to_dict()
        return {**flat, **{k: flat.get(k, p.default) for k, p in own_params.table().items()}}

    def param(self, name: str) -> Any:
        """A policy's own parameter: as set here, else the default its policy declares."""
        return dict(self.policy_params).get(name, own_params.table()[name].default)

    def _check_consistency(self) -> None:
        if self.keep_threshold <= self.evict_threshold:
            raise ConfigError(
                f"keep_threshold = {self.keep_threshold!r} must be greater than "
                f"evict_threshold = {self.evict_threshold!r}"
            )
        for name in ("placement_weights", "prefetch_blend"):
            total = sum(getattr(self, name))
            if abs(total - 1.0) > 1e-9:
                raise ConfigError(
                    f"{name} = {getattr(self, name)!r} sums to {total:.6g}: must sum to 1"
                )
        lo, hi = self.placement_cuts
        if not 0.0 < lo < hi < 1.0:
            raise ConfigError(
                f"placement_cuts = {self.placement_cuts!r} is out of range: must be "
                f"{PARAMS['placement_cuts'].range_text}"
            )

    # --- construction helpers -------------------------------------------------

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> PolicyConfig:
        """Build from a flat mapping (the engine's parameters and any policy's own), refusing
        unknown keys with a suggestion."""
        table = own_params.table()
        own = {k: v for k, v in values.items() if k in PARAMS}
        theirs = {k: v for k, v in values.items() if k not in PARAMS}
        for key in theirs:
            if key not in table:
                raise ConfigError(_unknown(key))
        return cls(**own, policy_params=tuple(theirs.items()))

    @classmethod
    def load(cls, path: str | Path) -> PolicyConfig:
        """Read a TOML file: keys at the top level or under a ``[policy]`` table."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        if "policy" in data and isinstance(data["policy"], dict):
            extra = [k for k in data if k != "policy"]
            if extra:
                raise ConfigError(f"{path}: unexpected top-level key '{extra[0]}' beside [policy]")
            data = data["policy"]
        return cls.from_mapping(data)

    def to_dict(self) -> dict[str, Any]:
        """The flat mapping: every engine parameter, then each policy parameter set here."""
        flat = {f.name: getattr(self, f.name) for f in fields(self) if f.name in PARAMS}
        flat.update(self.policy_params)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}

    def save(self, path: str | Path) -> None:
        import tomli_w  # lazy: only save() writes TOML; `kvcxl --help` imports this module

        Path(path).write_text(tomli_w.dumps({"policy": self.to_dict()}))

    def with_(self, **changes: Any) -> PolicyConfig:
        """A copy with some parameters changed (validated like any other)."""
        return self.from_mapping({**self.to_dict(), **changes}) if changes else self

    def replace(self, **changes: Any) -> PolicyConfig:
        return replace(self, **changes)


def _unknown(key: str) -> str:
    known = [*PARAMS, *own_params.table()]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown parameter '{key}'{hint}; known: {', '.join(known)}"
