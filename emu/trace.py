"""The kvcxl attention trace: a versioned, columnar ``.npz`` file of entry reads (and writes).

One record is one read of one entry — block ``block`` of KV head ``head`` of layer
``layer`` of context ``context`` — in decode step ``step``, with the attention
weight the host reported for it (docs/design.md, "Entries and attention weights": the
sum of the block's softmax weights, aggregated over the GQA group by ``aggregation``).
Records are ordered by step.
Version 2 adds two optional columns: ``op`` (0 read, 1 write: the host writing an
entry's KV, e.g. a prefill or a new block) and ``tokens`` (on a write, the context's
length after it); with ``op`` the record order is the event order.  A trace without
them is saved as version 1.  The format is specified in docs/trace-format.md.

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
evidence class, an ``op`` other than 0 or 1, a ``tokens`` value on a read or a weight on
a write.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kvcxl.common.evidence import RESULTS

from .shape import PRESETS, ModelShape, ShapeError

FORMAT = "kvcxl-trace"
VERSION = 2  # the newest version this build writes; it reads every one of VERSIONS
VERSIONS = (1, 2)
OP_READ, OP_WRITE = 0, 1
# A trace is a result of this project (a real model's capture, a simulator's export, a
# generator's output), never an input taken from elsewhere: the result classes alone.
EVIDENCE_CLASSES = RESULTS
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
#: Optional columns of version 2 (absent: every record is a read).
OPTIONAL_COLUMNS: dict[str, tuple[str, np.dtype]] = {
    "op": ("i", np.dtype(np.int8)),
    "tokens": ("i", np.dtype(np.int64)),
}


def _distinct(a: NDArray) -> int:
    s = np.sort(a)
    return int(s.size and 1 + np.count_nonzero(s[1:] != s[:-1]))


class TraceError(ValueError):
    """A trace was refused; the message names the problem."""


def _column(name: str, values: ArrayLike) -> NDArray:
    kind, dtype = COLUMNS[name] if name in COLUMNS else OPTIONAL_COLUMNS[name]
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
            label = name if name in ("step", "op", "tokens") else f"{name} id"
            raise TraceError(f"negative {label} {lo} at record {i}")
        if hi > np.iinfo(dtype).max:
            label = name if name in ("step", "op", "tokens") else f"{name} id"
            raise TraceError(f"{label} {hi} does not fit in {dtype}")
    return np.ascontiguousarray(a, dtype=dtype)


@dataclass
class Trace:
    """Columns of entry reads plus metadata; validated on construction.

    ``shape`` is the model shape the ids index (layers, KV heads, block size); the
    trace's block size is ``shape.block_tokens``.  ``evidence`` is one of
    Measured (captured from a real model run), Simulated (a synthetic workload) or
    Analytical model.  ``extra`` holds any further JSON-serialisable metadata.

    Version 2 (all optional): ``op`` per record, 0 = read, 1 = write (with it the record
    order is the event order); ``tokens`` per record, on a write the context's length
    in tokens after it (0: not given; 0 on every read); ``prefixes``, a list of
    ``(context, parent, blocks)``: the context's first ``blocks`` blocks are the
    parent's entries (a shared prefix; reads of them name the parent).
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
    op: NDArray | None = None
    tokens: NDArray | None = None
    prefixes: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in COLUMNS:
            setattr(self, name, _column(name, getattr(self, name)))
        if self.tokens is not None and self.op is None:
            raise TraceError("array 'tokens' without 'op': lengths belong to write records")
        if self.op is not None:
            self.op = _column("op", self.op)
            n_op = self.op.size
            self.tokens = (
                np.zeros(n_op, np.int64) if self.tokens is None else _column("tokens", self.tokens)
            )
        n = self.step.size
        for name in self.columns():
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
            if self.op is not None:
                self._check_ops()
        self.prefixes = self._check_prefixes(self.prefixes)

    def _check_ops(self) -> None:
        op, tokens = self.op, self.tokens
        bad = np.flatnonzero((op != OP_READ) & (op != OP_WRITE))
        if bad.size:
            i = int(bad[0])
            raise TraceError(
                f"op {int(op[i])} at record {i} is unknown: must be 0 (read) or 1 (write)"
            )
        rd = op == OP_READ
        bad = np.flatnonzero(rd & (tokens != 0))
        if bad.size:
            i = int(bad[0])
            raise TraceError(
                f"tokens {int(tokens[i])} at record {i} is on a read record: must be 0"
            )
        bad = np.flatnonzero(~rd & (self.weight != 0))
        if bad.size:
            i = int(bad[0])
            raise TraceError(
                f"weight {float(self.weight[i]):g} at record {i} is on a write record: must be 0"
            )

    @staticmethod
    def _check_prefixes(prefixes: Any) -> list[tuple[int, int, int]]:
        out = []
        for p in prefixes or []:
            try:
                c, parent, blocks = (int(x) for x in p)
            except (TypeError, ValueError):
                raise TraceError(
                    f"prefix {p!r}: must be [context, parent, blocks] (three integers)"
                ) from None
            if c < 0 or parent < 0 or blocks < 1 or c == parent:
                raise TraceError(
                    f"prefix {p!r}: context and parent must be distinct ids >= 0, blocks >= 1"
                )
            out.append((c, parent, blocks))
        return out

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
    @property
    def version(self) -> int:
        """The lowest format version that holds this trace (2 with writes or prefixes)."""
        return 2 if self.op is not None or self.prefixes else 1

    def columns(self) -> tuple[str, ...]:
        """The columns this trace has (the six of version 1, then ``op`` and ``tokens``)."""
        return (*COLUMNS, *(OPTIONAL_COLUMNS if self.op is not None else ()))

    @property
    def read_mask(self) -> NDArray:
        """Which records are reads."""
        return np.ones(len(self), bool) if self.op is None else self.op == OP_READ

    def meta(self) -> dict[str, Any]:
        meta = {
            "format": FORMAT,
            "version": self.version,
            "shape": self.shape.to_dict(),
            "block_tokens": self.shape.block_tokens,
            "aggregation": self.aggregation,
            "evidence": self.evidence,
            "source": self.source,
            "extra": self.extra,
        }
        if self.prefixes:
            meta["prefixes"] = [list(p) for p in self.prefixes]
        return meta

    def __len__(self) -> int:
        return int(self.step.size)

    @property
    def n_steps(self) -> int:
        s = self.step  # sorted by construction: count the changes
        return int(s.size and 1 + np.count_nonzero(s[1:] != s[:-1]))

    def info(self) -> dict[str, Any]:
        """Summary figures of the trace (what ``kvcxl trace info`` prints).

        ``records`` counts the read records (the requests a replay serves), as in
        version 1 where every record is a read; ``write_records`` the write records.
        """
        n = len(self)
        keys = self.entry_keys()
        reads = int(np.count_nonzero(self.read_mask))
        return {
            **{k: v for k, v in self.meta().items() if k != "extra"},
            "records": reads,
            "write_records": n - reads,
            "steps": self.n_steps,
            "first_step": int(self.step[0]) if n else None,
            "last_step": int(self.step[-1]) if n else None,
            "contexts": _distinct(self.context),
            "distinct_entries": _distinct(keys),
            "max_block": int(self.block.max()) if n else None,
            "weight_mean": float(self.weight.mean()) if n else None,
            "weight_max": float(self.weight.max()) if n else None,
            "entry_bytes": self.shape.entry_bytes,
            "read_bytes": reads * self.shape.entry_bytes,
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
            op=None if self.op is None else self.op[lo:hi],
            tokens=None if self.tokens is None else self.tokens[lo:hi],
            prefixes=list(self.prefixes),
        )

    # --- files -----------------------------------------------------------------------
    def save(self, path: str | Path, *, compress: bool = True) -> Path:
        """Write the trace as ``.npz`` (compressed by default; version 1 unless it needs 2)."""
        path = Path(path)
        arrays = {c: getattr(self, c) for c in self.columns()}
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
        # Reading an array inflates and CRC-checks it only now: a damaged member fails here,
        # with whatever numpy's readers raise (zlib, zipfile, header parsing errors).
        try:
            with npz:
                arrays = {name: npz[name] for name in npz.files}
        except Exception as exc:
            raise TraceError(
                f"{path}: corrupt trace file (an array does not read back: "
                f"{type(exc).__name__}: {exc})"
            ) from None
        return cls._from_arrays(path, arrays)

    @classmethod
    def _from_arrays(cls, path: Path, npz: dict[str, np.ndarray]) -> Trace:
        """Validate the arrays of a trace file and build the trace."""
        if "meta" not in npz:
            raise TraceError(f"{path}: missing array 'meta' (not a kvcxl trace?)")
        try:
            meta = json.loads(str(npz["meta"][()]))
        except (json.JSONDecodeError, ValueError) as exc:
            raise TraceError(f"{path}: array 'meta' is not valid JSON: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise TraceError(f"{path}: metadata 'format' is not {FORMAT!r}")
        version = meta.get("version")
        if version not in VERSIONS or isinstance(version, bool):
            raise TraceError(
                f"{path}: unknown trace version {version!r} (this build reads versions "
                f"{', '.join(map(str, VERSIONS))})"
            )
        for key in ("shape", "aggregation", "evidence"):
            if key not in meta:
                raise TraceError(f"{path}: metadata is missing {key!r}")
        missing = [c for c in COLUMNS if c not in npz]
        if missing:
            raise TraceError(f"{path}: missing array {missing[0]!r}")
        cols = {c: npz[c] for c in COLUMNS}
        extra_cols = [c for c in OPTIONAL_COLUMNS if c in npz]
        if extra_cols and version < 2:
            raise TraceError(
                f"{path}: array {extra_cols[0]!r} in a version {version} file (it needs version 2)"
            )
        cols.update({c: npz[c] for c in extra_cols})
        if version < 2 and "prefixes" in meta:
            raise TraceError(f"{path}: metadata 'prefixes' in a version {version} file")
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
                prefixes=meta.get("prefixes") or [],
            )
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None
