"""Model shapes and the analytic KV-cache sizing of scenario S1 (Analytical model;
docs/design.md, "Scenario S1").

A :class:`ModelShape` holds the dimensions that decide how many KV entries a
context has and how many bytes each holds.  An *entry* is one block of one KV head
of one layer (docs/design.md, "Entries and attention weights"):
``2 × block_tokens × d_head × dtype_bytes`` bytes (K and V).

Presets (every field overridable with :meth:`ModelShape.with_`):

``s1``       Llama-2-70B at 128 K tokens, scenario S1 (docs/design.md).
``ci``       a small shape that keeps tests and demos fast (4 layers, 2 KV heads, 1 K tokens).
``smollm2``  SmolLM2-135M (30 layers, 9 Q / 3 KV heads, d_head 64), the real model of the traces.

>>> s = PRESETS["s1"]
>>> s.kv_bytes_per_token, s.block_bytes / 2**20, s.context_bytes / 2**30
(327680, 5.0, 40.0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

GB = 10**9
GIB = 2**30


class ShapeError(ValueError):
    """A model-shape dimension was refused."""


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer's KV cache."""

    name: str = "custom"
    layers: int = 80
    q_heads: int = 64
    kv_heads: int = 8
    d_head: int = 128
    dtype_bytes: int = 2
    block_tokens: int = 16
    context_tokens: int = 131072

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "name":
                continue
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"{f.name} = {v!r} is out of range: must be an integer >= 1")
        if self.q_heads % self.kv_heads:
            raise ShapeError(
                f"q_heads = {self.q_heads} must be a multiple of kv_heads = {self.kv_heads} (GQA)"
            )

    # --- derived sizes ------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head (GQA group)."""
        return self.q_heads // self.kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer and KV head for one token: 2 · layers · kv_heads · d_head · B."""
        return 2 * self.layers * self.kv_heads * self.d_head * self.dtype_bytes

    @property
    def entry_bytes(self) -> int:
        """One entry (one block of one KV head of one layer), K and V."""
        return 2 * self.block_tokens * self.d_head * self.dtype_bytes

    @property
    def block_bytes(self) -> int:
        """One block across every layer and KV head."""
        return self.kv_bytes_per_token * self.block_tokens

    @property
    def blocks_per_context(self) -> int:
        return math.ceil(self.context_tokens / self.block_tokens)

    @property
    def heads_total(self) -> int:
        """KV-head queues the policy tracks: layers × kv_heads (S1: 640)."""
        return self.layers * self.kv_heads

    @property
    def entries_per_context(self) -> int:
        return self.heads_total * self.blocks_per_context

    @property
    def context_bytes(self) -> int:
        """KV bytes of one full context (S1: 40 GiB)."""
        return self.kv_bytes_per_token * self.context_tokens

    # --- construction ---------------------------------------------------------------
    def with_(self, **changes: Any) -> ModelShape:
        """A copy with some dimensions changed (validated); ``None`` values are ignored."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = [k for k in changes if k not in {f.name for f in fields(self)}]
        if unknown:
            raise ShapeError(f"unknown model-shape field {unknown[0]!r}")
        return replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelShape:
        known = {f.name for f in fields(cls)}
        unknown = [k for k in d if k not in known]
        if unknown:
            raise ShapeError(f"unknown model-shape field {unknown[0]!r}")
        return cls(**d)


PRESETS: dict[str, ModelShape] = {
    "s1": ModelShape("s1", 80, 64, 8, 128, 2, 16, 131072),
    "ci": ModelShape("ci", 4, 6, 2, 64, 2, 16, 1024),
    "smollm2": ModelShape("smollm2", 30, 9, 3, 64, 2, 16, 2048),
}


def preset(name: str) -> ModelShape:
    """A preset by name, with a clear error naming the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ShapeError(f"unknown preset {name!r}; choose from: {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class Deployment:
    """What sits in the GPU's HBM besides the KV cache, and the tiers behind it (S1 defaults)."""

    users: int = 8
    hbm_bytes: int = 192 * GB
    weights_bytes: int = 140 * GB
    activations_bytes: int = 5 * GB
    pinned_bytes: int = 10 * GB
    cxl_bytes: int = 1000 * GB
    nvme_bytes: int = 16000 * GB


def sizing(shape: ModelShape, dep: Deployment | None = None) -> dict[str, Any]:
    """Scenario S1's KV sizing (docs/design.md) for ``shape`` serving ``dep.users`` full contexts.

    Every figure is an Analytical model: arithmetic on the stated inputs.
    """
    dep = dep or Deployment()
    if dep.users < 1:
        raise ShapeError(f"users = {dep.users} is out of range: must be >= 1")
    per_user = shape.context_bytes
    kv_budget = dep.hbm_bytes - dep.weights_bytes - dep.activations_bytes
    evictable = kv_budget - dep.pinned_bytes
    # The design rounds the per-user size to whole GB before adding (8 × 43 GB).
    per_user_gb_rounded = round(per_user / GB)
    need = dep.weights_bytes + dep.users * per_user + dep.activations_bytes
    total_kv = dep.users * per_user
    return {
        "evidence": "Analytical model",
        "shape": shape.to_dict(),
        "deployment": asdict(dep),
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "kv_kib_per_token": shape.kv_bytes_per_token / 1024,
        "entry_bytes": shape.entry_bytes,
        "block_bytes": shape.block_bytes,
        "block_mib": shape.block_bytes / 2**20,
        "blocks_per_context": shape.blocks_per_context,
        "kv_head_queues": shape.heads_total,
        "entries_per_context": shape.entries_per_context,
        "context_bytes": per_user,
        "context_gib": per_user / GIB,
        "context_gb": per_user / GB,
        "users": dep.users,
        "hbm_needed_bytes": need,
        "hbm_needed_gb": need / GB,
        "hbm_needed_gb_seed_rounding": (
            dep.weights_bytes / GB + dep.users * per_user_gb_rounded + dep.activations_bytes / GB
        ),
        "hbm_ratio": need / dep.hbm_bytes,
        "hbm_kv_budget_bytes": kv_budget,
        "hbm_evictable_bytes": evictable,
        "hbm_kv_fraction_of_demand": kv_budget / total_kv if total_kv else 0.0,
        "users_fitting_hbm": max(kv_budget // per_user, 0),
        "users_fitting_hbm_cxl": max((kv_budget + dep.cxl_bytes) // per_user, 0),
        "users_fitting_all_tiers": max((kv_budget + dep.cxl_bytes + dep.nvme_bytes) // per_user, 0),
    }


def format_sizing(r: dict[str, Any]) -> str:
    """A short human-readable report of :func:`sizing`."""
    s = r["shape"]
    lines = [
        f"KV sizing for {s['name']}: {s['layers']} layers, {s['q_heads']} Q / {s['kv_heads']} KV "
        f"heads, d_head {s['d_head']}, {s['dtype_bytes']} B/value, {s['block_tokens']}-token "
        f"blocks, {s['context_tokens']:,} tokens/context  (Analytical model)",
        f"  KV per token          {r['kv_bytes_per_token']:,} B = {r['kv_kib_per_token']:g} KiB",
        f"  entry (block × head)  {r['entry_bytes']:,} B",
        f"  block (all heads)     {r['block_bytes']:,} B = {r['block_mib']:.2f} MiB",
        f"  per context           {r['context_bytes']:,} B = {r['context_gib']:.2f} GiB "
        f"= {r['context_gb']:.2f} GB",
        f"  KV-head queues        {r['kv_head_queues']:,}; entries/context "
        f"{r['entries_per_context']:,}",
        f"  {str(r['users']) + ' users need':<22}{r['hbm_needed_gb']:.1f} GB "
        f"(seed rounding: {r['hbm_needed_gb_seed_rounding']:.0f} GB) = "
        f"{r['hbm_ratio']:.2f}× the {r['deployment']['hbm_bytes'] / GB:.0f} GB HBM",
        f"  HBM left for KV       {r['hbm_kv_budget_bytes'] / GB:.0f} GB "
        f"({r['hbm_evictable_bytes'] / GB:.0f} GB evictable), "
        f"{100 * r['hbm_kv_fraction_of_demand']:.1f} % of the KV demand",
        f"  full contexts that fit: HBM {r['users_fitting_hbm']}, +CXL "
        f"{r['users_fitting_hbm_cxl']}, +NVMe {r['users_fitting_all_tiers']}",
    ]
    return "\n".join(lines)
