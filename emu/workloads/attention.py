"""Synthetic attention: per-block weights with sinks, a recent window, retrieval heads and noise.

For one decode step of one context the model gives, for every (layer, KV head,
block), the weight the host would report (docs/design.md, "Entries and attention
weights"): the block's share of the softmax mass, computed for each query head of the GQA
group and aggregated by ``max`` or ``mean``.  Per query head the mass is split into

* a **sink** share on block 0 (attention sinks; the share grows with depth, as
  measured on SmolLM2: layers 0–11 put under 12 % on block 0, layers 12–29 28–63 %),
* a **recent window** share spread over the newest tokens with exponential decay,
* a **retrieval** share that a few sharp heads put on a handful of *needle*
  blocks of the context (fixed per context: long-range reuse),
* the **background** rest, spread by a per-block *relevance* drawn once when the
  block is created (lognormal: a few heavy hitters) times per-step jitter.

Every parameter lives in :class:`AttentionParams`, so that real traces can fit
them (kvcxl.model.fit, ``kvcxl trace fit``; the committed fit is the data file
``attention_fit.toml`` beside this module, read here as :data:`MEASURED` and
:data:`FITTED`); every random draw comes from a seeded generator.  The
sink and recent shares are either a line over depth (``sink_mass_first`` …
``sink_mass_last``, one ``recent_mass``) or a per-layer *profile*: values at evenly
spaced relative depths 0 … 1, interpolated onto a deeper shape and averaged onto a
shallower one, so a profile fitted on SmolLM2's 30 layers also drives the 4-layer
``ci`` shape and the 80-layer ``s1`` one.
:func:`preset_attention` gives each model-shape preset its default parameters.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..shape import ModelShape
from .attention_kernel import fused_weights
from .topk import topk_blocks


@dataclass(frozen=True)
class AttentionParams:
    """Parameters of the synthetic attention model (fractions of each head's softmax mass)."""

    sink_mass_first: float = 0.05  # sink share at layer 0
    sink_mass_last: float = 0.45  # sink share at the last layer (linear in between)
    recent_mass: float = 0.34  # share on the newest tokens (SmolLM2: 34 % on the last 32)
    recent_tokens: float = 32.0  # e-folding distance of the recent window, in tokens
    relevance_sigma: float = 1.2  # lognormal σ of per-block relevance (heavy hitters)
    jitter_sigma: float = 0.3  # lognormal σ of per-step, per-block background jitter
    group_sigma: float = 0.25  # lognormal σ between the query heads of one GQA group
    # Lognormal σ (mean 1) of factors on each query head's own sink, recent and background
    # shares (renormalised), fixed per model: query heads of one group split their mass
    # differently, which a max over the group sees.
    split_sigma: float = 0.0
    retrieval_fraction: float = 0.05  # share of (layer, KV head) pairs that are retrieval heads
    retrieval_mass: float = 0.5  # share a retrieval head puts on the needles
    needles: int = 2  # needle blocks per context
    # Per-layer profiles (relative depth 0 … 1); when given they replace the line above.
    sink_profile: tuple[float, ...] = ()
    recent_profile: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in _PROFILES:  # JSON and TOML give lists: store tuples (hashable, frozen)
            v = getattr(self, name)
            if isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
                raise ValueError(
                    f"attention parameter {name} = {v!r}: must be a list of per-layer fractions"
                )
            object.__setattr__(self, name, tuple(float(x) for x in v))
        for f in fields(self):
            for v in np.atleast_1d(np.asarray(getattr(self, f.name), dtype=float)):
                if not np.isfinite(v) or v < 0:
                    raise ValueError(
                        f"attention parameter {f.name} = {float(v)!r}: must be finite and >= 0"
                    )
        for name in ("sink_mass_first", "sink_mass_last", "retrieval_fraction", "retrieval_mass",
                     *_PROFILES):  # fmt: skip
            v = np.asarray(getattr(self, name), dtype=float)
            if v.size and v.max() > 1:
                raise ValueError(f"attention parameter {name} = {v.max()!r}: must be <= 1")
        if len(self.sink_profile) == 1 or len(self.recent_profile) == 1:
            raise ValueError("attention profiles need at least 2 points (depth 0 and depth 1)")
        if self.sink_profile and self.recent_profile:
            if len(self.sink_profile) != len(self.recent_profile):
                raise ValueError(
                    f"attention profiles: sink_profile has {len(self.sink_profile)} points, "
                    f"recent_profile {len(self.recent_profile)}: give both per the same layers"
                )
        # Both profiles are piecewise linear: checking sink + recent <= 1 at every knot
        # of either checks it at every depth.
        knots = np.union1d(
            [0.0, 1.0],
            np.union1d(_depths(len(self.sink_profile)), _depths(len(self.recent_profile))),
        )
        total = self._sink_at(knots) + self._recent_at(knots)
        if total.max() > 1 + 1e-9:
            d = float(knots[int(total.argmax())])
            raise ValueError(
                f"attention parameters: sink + recent mass = {total.max():.4f} at relative "
                f"depth {d:.3f}: must be <= 1"
            )

    def _sink_at(self, depth: NDArray) -> NDArray:
        if self.sink_profile:
            return np.interp(depth, _depths(len(self.sink_profile)), self.sink_profile)
        return self.sink_mass_first + (self.sink_mass_last - self.sink_mass_first) * depth

    def _recent_at(self, depth: NDArray) -> NDArray:
        if self.recent_profile:
            return np.interp(depth, _depths(len(self.recent_profile)), self.recent_profile)
        return np.full(np.shape(depth), self.recent_mass)

    def sink_by_layer(self, layers: int) -> NDArray:
        """Sink share of each of ``layers`` layers (float32)."""
        if not self.sink_profile:
            return np.linspace(self.sink_mass_first, self.sink_mass_last, layers, dtype=np.float32)
        return _resample(self.sink_profile, layers)

    def recent_by_layer(self, layers: int) -> NDArray:
        """Recent-window share of each of ``layers`` layers (float32)."""
        if not self.recent_profile:
            return np.full(layers, self.recent_mass, dtype=np.float32)
        return _resample(self.recent_profile, layers)

    def with_(self, **changes: Any) -> AttentionParams:
        """A copy with some parameters changed (validated).

        Setting the line (``sink_mass_first``/``sink_mass_last``, ``recent_mass``)
        without its profile drops the profile, so an override is never shadowed.
        """
        known = {f.name for f in fields(self)}
        for k in changes:
            if k not in known:
                raise ValueError(
                    f"unknown attention parameter {k!r}: known are {', '.join(sorted(known))}"
                )
        base = asdict(self)
        if {"sink_mass_first", "sink_mass_last"} & changes.keys():
            base["sink_profile"] = ()
        if "recent_mass" in changes:
            base["recent_profile"] = ()
        return AttentionParams(**{**base, **changes})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_PROFILES = ("sink_profile", "recent_profile")


def _depths(n: int) -> NDArray:
    """Relative depth 0 … 1 of ``n`` evenly spaced layers (a single layer is depth 0).

    Layer ``i`` of ``n`` sits at ``i / (n − 1)``: the first layer at 0, the last at 1,
    whatever the model's layer count, so a profile fitted on 30 layers lands on 80 by
    where each layer sits in the stack, not by its index (layer 40 of 80, at 40/79, reads
    the fit two thirds of the way from its layer 14 to its layer 15, not its last layer).
    """
    return np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(n)


def _resample(profile: tuple[float, ...], layers: int) -> NDArray:
    """A per-layer profile of n points on ``layers`` layers (float32).

    Upsampling interpolates linearly over relative depth; downsampling averages the
    points that fall in each layer's share of depth, so a 4-layer shape keeps the mean
    mass of SmolLM2's 30 layers rather than sampling 4 of them.  ``layers == n`` gives
    the profile back.
    """
    v = np.asarray(profile, dtype=np.float64)
    n = v.size
    if layers >= n:
        return np.interp(_depths(layers), _depths(n), v).astype(np.float32)
    group = ((np.arange(n) + 0.5) * layers / n).astype(np.int64)
    return (np.bincount(group, v, layers) / np.bincount(group, minlength=layers)).astype(np.float32)


# --- the committed fit (attention_fit.toml) ----------------------------------------------------
FIT_FILE = Path(__file__).with_name("attention_fit.toml")


def load_fit(path: str | Path = FIT_FILE) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(measured, fitted)`` from an attention fit file (TOML arrays come back as tuples).

    ``measured``: the statistics of the captures the generator must reproduce;
    ``fitted``: the generator's parameters (``AttentionParams`` fields) that do.
    """
    with open(path, "rb") as f:
        data = tomllib.load(f)
    try:
        return _tuples(data["measured"]), _tuples(data["fitted"])
    except KeyError as exc:
        raise ValueError(f"{path}: an attention fit file needs a [{exc.args[0]}] table") from None


def _tuples(table: Mapping[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}


def format_fit(measured: Mapping[str, Any], fitted: Mapping[str, Any], comment: str = "") -> str:
    """The text of an attention fit file (what ``kvcxl trace fit --write`` writes).

    Numbers are written as Python's shortest round-trip form, so :func:`load_fit` reads
    back exactly the values given; ``comment`` lines go first, as TOML comments.
    """
    lines = [f"# {c}".rstrip() for c in comment.splitlines()]
    for name, table in (("measured", measured), ("fitted", fitted)):
        lines += ["", f"[{name}]"]
        for key, value in table.items():
            if isinstance(value, (list, tuple)):
                items = [_number(v) + "," for v in value]
                lines.append(f"{key} = [")
                row = "   "
                for item in items:
                    if len(row) + 1 + len(item) > 100:
                        lines.append(row)
                        row = "   "
                    row += " " + item
                lines += [row, "]"]
            else:
                lines.append(f"{key} = {_number(value)}")
    text = "\n".join(lines).lstrip("\n") + "\n"
    back = tomllib.loads(text)
    if back != {"measured": _lists(measured), "fitted": _lists(fitted)}:
        raise ValueError("attention fit: the values do not survive a TOML round trip")
    return text


def _number(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"attention fit: {v!r} is not a number")
    return repr(int(v)) if isinstance(v, (int, np.integer)) else repr(float(v))


def _lists(table: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: [_plain(x) for x in v] if isinstance(v, (list, tuple)) else _plain(v)
        for k, v in table.items()
    }


def _plain(v: Any) -> int | float:
    return int(v) if isinstance(v, (int, np.integer)) else float(v)


# Fitted on the three committed prompts (docs/model.md); tests/test_model_fit*.py check both
# against fresh runs of the generator and of the real model.
MEASURED, FITTED = load_fit()


def fitted_params() -> AttentionParams:
    """The generator's parameters fitted to SmolLM2-135M (docs/model.md), for the ci preset."""
    return AttentionParams().with_(**FITTED) if FITTED else AttentionParams()


def preset_attention(shape: ModelShape) -> AttentionParams:
    """Default generator parameters for a shape.

    ``ci`` and ``smollm2`` use the fit to SmolLM2-135M's measured attention
    (:data:`FITTED`, from ``attention_fit.toml``; docs/model.md); every other shape
    (``s1``, custom) keeps the seed-derived defaults of :class:`AttentionParams`, since
    the fit comes from a 135 M-parameter model and ``s1`` is a 70 B one.
    """
    if shape.name in FITTED_PRESETS:
        return fitted_params()
    return AttentionParams()


FITTED_PRESETS = ("ci", "smollm2")


#: ``kvcxl experiment --attention``'s choices: the generator's seed-derived defaults, or the
#: fit to SmolLM2-135M (:func:`fitted_params`) on any shape's layers by relative depth.
ATTENTION_CHOICES = ("seed", "fit")


def own_attention(preset_name: str) -> str:
    """The choice a preset runs by default: ``fit`` for the fitted presets, else ``seed``."""
    return "fit" if preset_name in FITTED_PRESETS else "seed"


def attention_for(shape: ModelShape, choice: str | None = None) -> AttentionParams:
    """A shape's generator parameters: ``None`` its preset's own (:func:`preset_attention`),
    ``"seed"`` the seed's defaults, ``"fit"`` the SmolLM2-135M fit on the shape's layers.

    The fit's per-layer sink and recent profiles (SmolLM2's 30 layers) are read by
    relative depth (:func:`_depths`): interpolated linearly onto a deeper shape (S1's 80
    layers: the fit stretched), averaged onto a shallower one (:func:`_resample`).
    """
    if choice is None:
        return preset_attention(shape)
    return fitted_params() if check_choice(choice) == "fit" else AttentionParams()


def check_choice(choice: str) -> str:
    """``choice`` when it is one of :data:`ATTENTION_CHOICES`, else a ValueError naming it."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(
            f"attention {choice!r}: must be one of {', '.join(map(repr, ATTENTION_CHOICES))}"
        )
    return choice


def attention_source(preset_name: str, choice: str | None = None, layers: int | None = None) -> str:
    """Where a shape's attention comes from, for reports: its preset's own (``choice``
    None), or the one chosen, named with the choice and, for the fit on ``layers`` other
    than its own, how its profiles were carried there."""
    if choice is None:
        fit = preset_name in FITTED_PRESETS
        return "fitted to SmolLM2-135M" if fit else "the seed's defaults"
    if check_choice(choice) == "seed":
        return "the seed's defaults (--attention seed)"
    own = len(fitted_params().sink_profile)
    how = ""
    if layers and own and layers != own:
        verb = "stretched over" if layers > own else "averaged onto"
        how = f" {verb} {layers} layers by relative depth"
    return f"fitted to SmolLM2-135M{how} (--attention fit)"


class ContextAttention:
    """Per-context state of the model: block relevance and needle positions."""

    def __init__(
        self,
        shape: ModelShape,
        params: AttentionParams,
        rng: np.random.Generator,
        needle_blocks: NDArray | None = None,
    ) -> None:
        self.shape = shape
        self.params = params
        self.rng = rng
        self.rel = np.zeros((shape.layers, shape.kv_heads, 0), dtype=np.float32)
        self.needle_blocks = needle_blocks
        self.n_blocks = 0

    def grow(self, n_blocks: int) -> None:
        """Draw relevance for blocks up to ``n_blocks`` (new blocks only)."""
        if n_blocks <= self.n_blocks:
            return
        s, p = self.shape, self.params
        new = self.rng.lognormal(
            0.0, p.relevance_sigma, size=(s.layers, s.kv_heads, n_blocks - self.n_blocks)
        ).astype(np.float32)
        self.rel = np.concatenate([self.rel, new], axis=2)
        self.n_blocks = n_blocks
        if self.needle_blocks is None and n_blocks >= 4:
            # Needles somewhere in the older part of the context, chosen once.
            hi = max(2, n_blocks // 2)
            self.needle_blocks = np.unique(self.rng.integers(1, hi, size=p.needles))


class AttentionModel:
    """Weights for every (layer, KV head, block) of a context at one decode step."""

    def __init__(
        self, shape: ModelShape, params: AttentionParams, aggregation: str, seed: int
    ) -> None:
        if aggregation not in ("max", "mean"):
            raise ValueError(f"aggregation = {aggregation!r}: must be 'max' or 'mean'")
        self.shape = shape
        self.params = params
        self.aggregation = aggregation
        L, H = shape.layers, shape.kv_heads
        p = params
        self.sink = p.sink_by_layer(L)
        self.recent = p.recent_by_layer(L)
        total = self.sink + self.recent
        if total.max() > 1 + 1e-6:
            raise ValueError(
                f"attention parameters: sink + recent mass = {total.max():.4f} at layer "
                f"{int(total.argmax())} of {L}: must be <= 1"
            )
        rng = np.random.default_rng([seed, 0xA77E])
        n_ret = round(p.retrieval_fraction * L * H)
        if p.retrieval_fraction > 0:
            n_ret = max(1, n_ret)
        self.retrieval = np.zeros((L, H), dtype=bool)
        self.retrieval.flat[rng.choice(L * H, size=min(n_ret, L * H), replace=False)] = True
        # Per query head factors on the sink, recent and background shares (drawn after the
        # retrieval heads, and only when used, so that split_sigma = 0 keeps every stream).
        self.split: NDArray | None = None
        if p.split_sigma > 0:
            z = rng.standard_normal((3, shape.group_size, L, H))
            self.split = np.exp(p.split_sigma * z - p.split_sigma**2 / 2).astype(np.float32)

    def weights(self, ctx: ContextAttention, n_tokens: int, rng: np.random.Generator) -> NDArray:
        """(layers, kv_heads, n_blocks) float32 weights for the query at position n_tokens − 1."""
        s, p = self.shape, self.params
        nb = -(-n_tokens // s.block_tokens)
        ctx.grow(nb)
        L, H, G = s.layers, s.kv_heads, s.group_size
        jitter = rng.lognormal(0.0, p.jitter_sigma, size=(H, nb)).astype(np.float32)
        # Recent window: exponential in the distance (tokens) of the block's last token.
        last_tok = np.minimum((np.arange(nb) + 1) * s.block_tokens, n_tokens) - 1
        dist = (n_tokens - 1 - last_tok).astype(np.float32)
        rec = np.exp(-dist / np.float32(max(p.recent_tokens, 1e-6)))
        rec /= rec.sum()
        ret_mass = np.where(self.retrieval, p.retrieval_mass, 0.0).astype(np.float32)
        needles = ctx.needle_blocks
        if needles is None or needles.size == 0:
            ret_mass[:] = 0.0
            needles = np.zeros(0, np.int64)
        sink = self.sink[:, None] * (1.0 - ret_mass)  # a retrieval head's mass goes to needles
        bg_mass = np.clip(1.0 - sink - self.recent[:, None] - ret_mass, 0.0, None)
        # Per query head: the background's weight (its mass times a gain drawn per head),
        # the recent window's and the sink's; split_sigma > 0 renormalises the three shares
        # (the normalisation of each row composes them).
        coef = np.empty((G, L, H), np.float32)
        recent = np.empty((G, L, H), np.float32)
        sinks = np.empty((G, L, H), np.float32)
        for g in range(G):
            gain = rng.lognormal(0.0, p.group_sigma, size=(L, H)).astype(np.float32)
            if self.split is None:
                coef[g] = bg_mass * gain
                recent[g] = self.recent[:, None]
                sinks[g] = sink
            else:
                coef[g] = (bg_mass * self.split[2, g]) * gain
                recent[g] = self.recent[:, None] * self.split[1, g]
                sinks[g] = sink * self.split[0, g]
        needle_add = ret_mass / max(needles.size, 1)
        out = np.empty((L, H, nb), np.float32)
        fused_weights(ctx.rel, jitter, coef, recent, sinks, rec.astype(np.float32),
                      needles[needles < nb].astype(np.int64), needle_add,
                      self.aggregation == "mean", out)  # fmt: skip
        return out


def sparse_mask(weights: NDArray, mode: str, value: float) -> NDArray:
    """Which blocks a sparse runtime reads: the top-k per (layer, head), or weight ≥ threshold.

    ``mode`` is ``"dense"`` (everything), ``"topk"`` (``value`` blocks per head, as
    Quest-style runtimes select) or ``"threshold"`` (weight ≥ ``value``).
    """
    if mode == "dense":
        return np.ones(weights.shape, dtype=bool)
    if mode == "topk":
        k = int(value)
        if k < 1:
            raise ValueError(f"top-k = {value!r}: must be >= 1")
        nb = weights.shape[-1]
        if k >= nb:
            return np.ones(weights.shape, dtype=bool)
        idx = topk_blocks(weights, k)
        mask = np.zeros(weights.shape, dtype=bool)
        np.put_along_axis(mask, idx, True, axis=-1)
        return mask
    if mode == "threshold":
        if not 0 <= value <= 1:
            raise ValueError(f"sparse threshold = {value!r}: must be in [0, 1]")
        return weights >= value
    raise ValueError(f"read mode {mode!r}: must be 'dense', 'topk' or 'threshold'")
