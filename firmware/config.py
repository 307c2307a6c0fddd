"""The one validated configuration of the policy engine.

Every policy parameter of the design (docs/design.md, "The policy" and
"Uncalibrated parameters") lives here with its
default, its allowed range and a sentence on which way it pushes.  Nothing else
in the project holds a default for these values.  An out-of-range or
inconsistent value is refused with a :class:`ConfigError` naming the parameter,
the value and the allowed range.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A policy parameter was refused."""


@dataclass(frozen=True)
class Param:
    """What a parameter means and what it may be."""

    range_text: str
    check: Callable[[Any], bool]
    kind: type | tuple[type, ...]
    doc: str


def _num(
    lo: float, hi: float, lo_open: bool = False, hi_open: bool = False
) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if not math.isfinite(v):
            return False
        above = v > lo if lo_open else v >= lo
        below = v < hi if hi_open else v <= hi
        return above and below

    return check


def _choice(*options: str) -> Callable[[Any], bool]:
    return lambda v: v in options


def _unit_triple_or_pair(n: int) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return len(v) == n and all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in v)

    return check


_REAL = (int, float)

PARAMS: dict[str, Param] = {
    "alpha": Param(
        "(0, 1]",
        _num(0.0, 1.0, lo_open=True),
        _REAL,
        "EMA smoothing factor: score[t] = α·w[t] + (1−α)·score[t−1]. Higher reacts faster "
        "to attention shifts and forgets sooner (half-life ln0.5/ln(1−α) steps); lower "
        "holds long-run importance. Design default 0.2 (3.1-step half-life); Appendix N "
        "found an interior optimum near 0.05 (docs/design.md).",
    ),
    "beta": Param(
        "[0, 1]",
        _num(0.0, 1.0),
        _REAL,
        "Recency-decay coefficient in r = 1 − exp(−β·steps_since_access); 1/β is the "
        "idleness horizon in decode steps. Raising it makes eviction recency-driven and "
        "puts long-lived, rarely touched entries at risk; lowering it lets stale entries "
        "linger. β = 0 leaves priority = 0 for every entry (pure index order).",
    ),
    "touch_threshold": Param(
        "[0, 1]",
        _num(0.0, 1.0),
        _REAL,
        "A read entry counts as touched (resets steps_since_access) only if its "
        "attention weight is at least this. Raising it lets weakly attended entries age "
        "although they are read every step (dense attention reads everything).",
    ),
    "aggregation": Param(
        "'max' or 'mean'",
        _choice("max", "mean"),
        str,
        "How the per-query-head weights of a GQA group combine into one KV-head weight. "
        "'max' protects an entry any head needs; 'mean' favours entries all heads use.",
    ),
    "anchor_zone_size": Param(
        "[0, 1048576] tokens",
        _num(0, 1 << 20),
        int,
        "Entries whose first token position is below this are pinned and never evicted "
        "(attention sinks, system prompt). Raising it spends pinned HBM on positions that "
        "may never be attended; lowering it risks evicting the sink.",
    ),
    "keep_threshold": Param(
        "(0, 1], > evict_threshold",
        _num(0.0, 1.0, lo_open=True),
        _REAL,
        "Threshold placement: score ≥ keep wants HBM. Raising it shrinks the hot set "
        "(more users, lower hit rate); lowering it does the reverse.",
    ),
    "evict_threshold": Param(
        "[0, 1), < keep_threshold",
        _num(0.0, 1.0, hi_open=True),
        _REAL,
        "Threshold placement: score < evict sinks to NVMe; between evict and keep lives "
        "in CXL DRAM. Raising it reclaims CXL DRAM sooner at the cost of more NVMe reads.",
    ),
    "placement_mode": Param(
        "'thresholds' or 'weighted'",
        _choice("thresholds", "weighted"),
        str,
        "Which placement rule decides an entry's tier.",
    ),
    "placement_weights": Param(
        "three values in [0, 1] summing to 1 (R, E, N)",
        _unit_triple_or_pair(3),
        (tuple, list),
        "Weighted placement P = wR·R + wE·E + wN·N with R = 1 − r, E = score, N = anchor. "
        "More E tracks sustained attention; more R reacts to recent touches; more N "
        "hardens the anchor zone.",
    ),
    "placement_cuts": Param(
        "two values 0 < low < high < 1",
        _unit_triple_or_pair(2),
        (tuple, list),
        "Cut points on P: below low → CXL DRAM, [low, high) → HBM, ≥ high → pinned HBM. "
        "Raising either frees HBM sooner.",
    ),
    "prefetch_window": Param(
        "[0, 1048576] tokens",
        _num(0, 1 << 20),
        int,
        "Prefetch radius W: a touch of block b proposes blocks within ±W tokens. Wider "
        "covers more at linearly growing speculative bandwidth; 0 disables the window.",
    ),
    "prefetch_distance_scale": Param(
        "(0, 1e9]",
        _num(0.0, 1e9, lo_open=True),
        _REAL,
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
        _num(0, 16),
        int,
        "How many following layers a touch prefetches into. 0 disables prefetch.",
    ),
    "eviction_batch": Param(
        "[1, 65536] entries",
        _num(1, 65536),
        int,
        "Most entries evicted by one policy pass. Larger amortises the selection; "
        "smaller keeps decisions fresh.",
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
        _num(0.0, 1.0),
        _REAL,
        "Largest share of the HBM KV budget that pinned (anchor) entries may hold; "
        "anchors beyond it are ordinary entries. S1 pins 10 of 47 GB ≈ 0.21.",
    ),
    "decay_shift": Param(
        "[0, 8]",
        _num(0, 8),
        int,
        "Integer mode: the recency-decay table is indexed by min(idle >> shift, 255). "
        "Larger covers a longer idle horizon at coarser resolution; see docs/policy.md "
        "for the error bound it implies.",
    ),
    "pcie_contention": Param(
        "(0, 1]",
        _num(0.0, 1.0, lo_open=True),
        _REAL,
        "Fraction of PCIe Gen5 x16 link bandwidth a host-DRAM offload baseline sustains "
        "(the design's 0.32, contradicted by the measured 87 % of spec; docs/design.md). "
        "Used only by the host-offload comparison of the tier model.",
    ),
    "sink_tokens": Param(
        "[0, 1048576] tokens",
        _num(0, 1 << 20),
        int,
        "Baselines sink-window (StreamingLLM) and h2o: the first S tokens never evicted.",
    ),
    "recent_tokens": Param(
        "[0, 1048576] tokens",
        _num(0, 1 << 20),
        int,
        "Baseline h2o: the most recent tokens of each context are never evicted; the "
        "rest compete on accumulated attention.",
    ),
    "lrfu_lambda": Param(
        "[0, 1]",
        _num(0.0, 1.0),
        _REAL,
        "Baseline lrfu (Lee et al. 1999): CRF weight (1/2)^(λ·age); 0 is LFU, 1 is LRU.",
    ),
    "seed": Param(
        "[0, 2**63)",
        _num(0, 2**63 - 1),
        int,
        "Seed of the random baseline's generator.",
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
    sink_tokens: int = 4
    recent_tokens: int = 128
    lrfu_lambda: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            p = PARAMS[f.name]
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            if not _kind_ok(value, p.kind):
                raise ConfigError(
                    f"{f.name} = {value!r} has the wrong type: expected {_kind_name(p.kind)} "
                    f"in {p.range_text}"
                )
            if isinstance(value, tuple):
                if not all(isinstance(x, _REAL) and not isinstance(x, bool) for x in value):
                    raise ConfigError(f"{f.name} = {value!r}: every element must be a number")
                value = tuple(float(x) for x in value)
                object.__setattr__(self, f.name, value)
            if not p.check(value):
                raise ConfigError(f"{f.name} = {value!r} is out of range: must be {p.range_text}")
        self._check_consistency()

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
        """Build from a mapping, refusing unknown keys with a suggestion."""
        unknown = [k for k in values if k not in PARAMS]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, PARAMS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown parameter '{key}'{hint}; known: {', '.join(PARAMS)}")
        return cls(**dict(values))

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
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def save(self, path: str | Path) -> None:
        import tomli_w  # lazy: only save() writes TOML; `kvcxl --help` imports this module

        Path(path).write_text(tomli_w.dumps({"policy": self.to_dict()}))

    def with_(self, **changes: Any) -> PolicyConfig:
        """A copy with some parameters changed (validated like any other)."""
        return self.from_mapping({**asdict(self), **changes}) if changes else self

    def replace(self, **changes: Any) -> PolicyConfig:
        return replace(self, **changes)


def _kind_ok(value: Any, kind: type | tuple[type, ...]) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int)
    return isinstance(value, kind)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if kind == _REAL:
        return "a number"
    if isinstance(kind, tuple):
        return "a list"
    return {int: "an integer", bool: "true or false", str: "a string"}.get(kind, kind.__name__)
