"""The kvcxl attention trace: a versioned, columnar ``.npz`` file of entry reads.

One record is one read of one entry — block ``block`` of KV head ``head`` of layer
``layer`` of context ``context`` — in decode step ``step``, with the attention
weight the host reported for it (SPEC §3: the sum of the block's softmax weights,
aggregated over the GQA group by ``aggregation``).  Records are ordered by step.
The format is specified in docs/trace-format.md.

Build one in memory and save it::

    from kvcxl.emu.shape import PRESETS
    from kvcxl.emu.trace import Trace

    t = Trace(step=..., context=..., layer=..., head=..., block=..., weight=...,
              shape=PRESETS["smollm2"].with_(context_tokens=600),
              evidence="Measured", source="SmolLM2-135M-Instruct, prompt 3")
    t.save("run.npz")
    t = Trace.load("run.npz")   # validates; a malformed file raises TraceError

Loading refuses, with a :class:`TraceError` naming the problem: a missing array, a
wrong dtype, columns of unequal length, a negative id, an id beyond the model
shape, steps out of order, a NaN or negative weight, an unknown format version or
evidence class.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .shape import PRESETS, ModelShape, ShapeError

FORMAT = "kvcxl-trace"
VERSION = 1
EVIDENCE_CLASSES = ("Measured", "Simulated", "Analytical model")
AGGREGATIONS = ("max", "mean")

#: Column name → (numpy kind it must have on load, dtype it is stored as).
COLUMNS: dict[str, tuple[str, np.dtype]] = {
    "step": ("i", np.dtype(np.int64)),
    "context": ("i", np.dtype(np.int32)),
    "layer": ("i", np.dtype(np.int32)),
    "head": ("i", np.dtype(np.int32)),
    "block": ("i", np.dtype(np.int32)),
    "weight": ("f", np.dtype(np.float32)),
}


def _distinct(a: NDArray) -> int:
    s = np.sort(a)
    return int(s.size and 1 + np.count_nonzero(s[1:] != s[:-1]))


class TraceError(ValueError):
    """A trace was refused; the message names the problem."""


def _column(name: str, values: ArrayLike) -> NDArray:
    kind, dtype = COLUMNS[name]
    a = np.asarray(values)
    if a.ndim != 1:
        raise TraceError(f"array {name!r} has {a.ndim} dimensions: must be one-dimensional")
    ok = a.dtype.kind in ("i", "u") if kind == "i" else a.dtype.kind == "f"
    if a.size == 0 and a.dtype.kind in "iuf":
        ok = True
    if not ok:
        want = "an integer type" if kind == "i" else "a floating-point type"
        raise TraceError(f"array {name!r} has dtype {a.dtype}: must be {want}")
    if kind == "i" and a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0:
            i = int(np.argmax(a < 0))
            label = "step" if name == "step" else f"{name} id"
            raise TraceError(f"negative {label} {lo} at record {i}")
        if hi > np.iinfo(dtype).max:
            raise TraceError(f"{name} id {hi} does not fit in {dtype}")
    return np.ascontiguousarray(a, dtype=dtype)


@dataclass
class Trace:
    """Columns of entry reads plus metadata; validated on construction.

    ``shape`` is the model shape the ids index (layers, KV heads, block size); the
    trace's block size is ``shape.block_tokens``.  ``evidence`` is one of
    Measured (captured from a real model run), Simulated (a synthetic workload) or
    Analytical model.  ``extra`` holds any further JSON-serialisable metadata.
    """

    step: NDArray
    context: NDArray
    layer: NDArray
    head: NDArray
    block: NDArray
    weight: NDArray
    shape: ModelShape = field(default_factory=lambda: PRESETS["ci"])
    aggregation: str = "max"
    evidence: str = "Simulated"
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in COLUMNS:
            setattr(self, name, _column(name, getattr(self, name)))
        n = self.step.size
        for name in COLUMNS:
            size = getattr(self, name).size
            if size != n:
                raise TraceError(
                    f"array {name!r} has {size} values, 'step' has {n}: "
                    "columns must have equal length"
                )
        if isinstance(self.shape, dict):
            try:
                self.shape = ModelShape.from_dict(self.shape)
            except (ShapeError, TypeError) as exc:
                raise TraceError(f"metadata 'shape' is invalid: {exc}") from None
        if self.aggregation not in AGGREGATIONS:
            raise TraceError(
                f"aggregation {self.aggregation!r} is unknown: must be one of {AGGREGATIONS}"
            )
        if self.evidence not in EVIDENCE_CLASSES:
            raise TraceError(
                f"evidence {self.evidence!r} is unknown: must be one of {EVIDENCE_CLASSES}"
            )
        if n:
            back = np.flatnonzero(self.step[1:] < self.step[:-1])
            if back.size:
                i = int(back[0]) + 1
                raise TraceError(
                    f"steps out of order: record {i} has step {int(self.step[i])} "
                    f"after step {int(self.step[i - 1])}"
                )
            bad = np.flatnonzero(~np.isfinite(self.weight))
            if bad.size:
                i = int(bad[0])
                raise TraceError(f"weight at record {i} is {self.weight[i]}: must be finite")
            neg = np.flatnonzero(self.weight < 0)
            if neg.size:
                i = int(neg[0])
                raise TraceError(f"negative weight {float(self.weight[i]):g} at record {i}")
            for name, limit, what in (
                ("layer", self.shape.layers, "layers"),
                ("head", self.shape.kv_heads, "KV heads"),
            ):
                col = getattr(self, name)
                over = np.flatnonzero(col >= limit)
                if over.size:
                    i = int(over[0])
                    raise TraceError(
                        f"{name} id {int(col[i])} at record {i} is out of range for the model "
                        f"shape ({limit} {what})"
                    )

    # --- construction -------------------------------------------------------------
    @classmethod
    def from_arrays(cls, **kwargs: Any) -> Trace:
        """Same as the constructor; named for symmetry with :meth:`load`."""
        return cls(**kwargs)

    @classmethod
    def empty(cls, **meta: Any) -> Trace:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z, np.zeros(0, dtype=np.float32), **meta)

    # --- metadata -------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "shape": self.shape.to_dict(),
            "block_tokens": self.shape.block_tokens,
            "aggregation": self.aggregation,
            "evidence": self.evidence,
            "source": self.source,
            "extra": self.extra,
        }

    def __len__(self) -> int:
        return int(self.step.size)

    @property
    def n_steps(self) -> int:
        s = self.step  # sorted by construction: count the changes
        return int(s.size and 1 + np.count_nonzero(s[1:] != s[:-1]))

    def info(self) -> dict[str, Any]:
        """Summary figures of the trace (what ``kvcxl trace info`` prints)."""
        n = len(self)
        keys = self.entry_keys()
        return {
            **{k: v for k, v in self.meta().items() if k != "extra"},
            "records": n,
            "steps": self.n_steps,
            "first_step": int(self.step[0]) if n else None,
            "last_step": int(self.step[-1]) if n else None,
            "contexts": _distinct(self.context),
            "distinct_entries": _distinct(keys),
            "max_block": int(self.block.max()) if n else None,
            "weight_mean": float(self.weight.mean()) if n else None,
            "weight_max": float(self.weight.max()) if n else None,
            "entry_bytes": self.shape.entry_bytes,
            "read_bytes": n * self.shape.entry_bytes,
            "extra": self.extra,
        }

    def entry_keys(self) -> NDArray:
        """One int64 per record identifying its entry (context, layer, head, block)."""
        nb = int(self.block.max()) + 1 if len(self) else 1
        return (
            (self.context.astype(np.int64) * self.shape.layers + self.layer) * self.shape.kv_heads
            + self.head
        ) * nb + self.block

    def slice_steps(self, first: int, last: int) -> Trace:
        """Records with ``first <= step <= last`` (a view on the same metadata)."""
        lo = int(np.searchsorted(self.step, first, side="left"))
        hi = int(np.searchsorted(self.step, last, side="right"))
        return Trace(
            *(getattr(self, c)[lo:hi] for c in COLUMNS),
            shape=self.shape,
            aggregation=self.aggregation,
            evidence=self.evidence,
            source=self.source,
            extra=dict(self.extra),
        )

    # --- files -----------------------------------------------------------------------
    def save(self, path: str | Path, *, compress: bool = True) -> Path:
        """Write the trace as ``.npz`` (compressed by default)."""
        path = Path(path)
        arrays = {c: getattr(self, c) for c in COLUMNS}
        arrays["meta"] = np.array(json.dumps(self.meta(), sort_keys=True))
        saver = np.savez_compressed if compress else np.savez
        with open(path, "wb") as f:  # a file object: numpy must not append ".npz"
            saver(f, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read and validate a trace file; :class:`TraceError` names what is wrong."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"trace file {path} does not exist")
        try:
            npz = np.load(path, allow_pickle=False)
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            raise TraceError(f"{path}: not a kvcxl trace (.npz) file: {exc}") from None
        if not hasattr(npz, "files"):
            raise TraceError(f"{path}: not a kvcxl trace (.npz) file: holds a single array")
        with npz:
            if "meta" not in npz.files:
                raise TraceError(f"{path}: missing array 'meta' (not a kvcxl trace?)")
            try:
                meta = json.loads(str(npz["meta"][()]))
            except (json.JSONDecodeError, ValueError) as exc:
                raise TraceError(f"{path}: array 'meta' is not valid JSON: {exc}") from None
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise TraceError(f"{path}: metadata 'format' is not {FORMAT!r}")
            version = meta.get("version")
            if version != VERSION:
                raise TraceError(
                    f"{path}: unknown trace version {version!r} (this build reads version "
                    f"{VERSION})"
                )
            for key in ("shape", "aggregation", "evidence"):
                if key not in meta:
                    raise TraceError(f"{path}: metadata is missing {key!r}")
            missing = [c for c in COLUMNS if c not in npz.files]
            if missing:
                raise TraceError(f"{path}: missing array {missing[0]!r}")
            cols = {c: npz[c] for c in COLUMNS}
        if not isinstance(meta["shape"], dict):
            raise TraceError(f"{path}: metadata 'shape' must be a table of dimensions")
        if "block_tokens" in meta and meta["block_tokens"] != meta["shape"].get("block_tokens"):
            raise TraceError(
                f"{path}: metadata block_tokens {meta['block_tokens']!r} disagrees with the "
                f"shape's {meta['shape'].get('block_tokens')!r}"
            )
        try:
            return cls(
                **cols,
                shape=meta["shape"],
                aggregation=meta["aggregation"],
                evidence=meta["evidence"],
                source=str(meta.get("source", "")),
                extra=dict(meta.get("extra") or {}),
            )
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None
