"""A workload or a trace compiled into one policy-independent stream of events.

Which entries exist and which are read with which weights does not depend on the
cache policy, so a workload is compiled once (:func:`compile_workload`) or a trace
converted once (:func:`from_trace`), and every policy and budget replays the same
:class:`ReadStream`.  Events, in order:

* CREATE — a write: new entries (a prefill, or a decode step that opened a new block);
  their KV is written into HBM.  Entry ids are dense and handed out in creation order.
* READ — one layer of one decode step: the entries read (all decoding contexts
  together) with their attention weights.

Each event may also update context lengths (tokens), which recency-by-position
policies (sink-window, h2o) use.  A workload's step is at most one write event (the
prefills and new contexts of the step), its non-empty layer reads in order, then at
most one write event (the token every decoding context appended: new blocks and
lengths); all of a workload's length updates ride on its write events.

A trace's entries that no write record creates are written just before the batch
that first reads them (``create_on_first_read``; per event :attr:`ReadStream.ev_lazy`
when a trace mixes both): the stream marks where with a CREATE event placed before
the layer that first reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcxl.common.meminfo import available_bytes
from kvcxl.firmware.cache import unique_ids

from ..shape import ModelShape
from ..trace import OP_WRITE, Trace
from .attention import (
    AttentionModel,
    AttentionParams,
    ContextAttention,
    preset_attention,
    sparse_mask,
)
from .column import Column
from .topk import topk_read

CREATE, READ = 0, 1
#: What building a stream holds per entry at its peak (its id, context, layer, head and
#: block, its place in its context's grid, its relevance and a step's weights): 46.5–47.8
#: bytes (Measured as the peak RSS over the build: S1, retrieval, 2 lanes, 1 and 4 steps of
#: top-256; 32.5–33.7 kept after; 50.5 by the same measure while the columns were joined
#: from their parts at the end).
BUILD_BYTES_PER_ENTRY = 48
#: A workload may create entries while their arrays take at most this share of the memory
#: available when it starts (refused rather than swapped), and at least MIN_ENTRIES.
MEMORY_SHARE = 0.5
MIN_ENTRIES = 60_000_000
MAX_ENTRIES: int | None = None  # a fixed cap instead (tests)


def entry_cap() -> tuple[int, str]:
    """How many entries a workload may create on this machine now (MAX_ENTRIES if set), and
    what set it, in words for the refusal."""
    if MAX_ENTRIES is not None:
        return MAX_ENTRIES, "the builder's fixed cap (MAX_ENTRIES)"
    have = available_bytes() or 0
    by_memory = int(have * MEMORY_SHARE) // BUILD_BYTES_PER_ENTRY
    if by_memory < MIN_ENTRIES:
        return MIN_ENTRIES, f"the builder's floor of {MIN_ENTRIES:,} entries"
    return by_memory, (
        f"more than this machine's memory holds ({BUILD_BYTES_PER_ENTRY} bytes an entry in "
        f"{MEMORY_SHARE:.0%} of the {have / 1e9:.1f} GB available)"
    )


@dataclass
class ReadStream:
    shape: ModelShape
    e_ctx: NDArray  # per entry, creation order
    e_layer: NDArray
    e_head: NDArray
    e_block: NDArray
    ev_kind: NDArray  # per event
    ev_step: NDArray
    ev_layer: NDArray
    ev_off: NDArray  # n_events + 1 offsets into ids / w
    ev_tokens: NDArray  # tokens decoded (contexts stepping) counted on a step's first read event
    ids: NDArray
    w: NDArray
    len_off: NDArray  # n_events + 1 offsets into len_ctx / len_tokens
    len_ctx: NDArray
    len_tokens: NDArray
    grids: dict[int, NDArray]  # context -> (layers, kv_heads, blocks) entry ids, −1 for none
    evidence: str = "Simulated"
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    # True for a trace: an entry is written into HBM just before the batch that first reads
    # it, whatever the replay's granularity (the CREATE events mark layer batches).
    create_on_first_read: bool = False
    # Per event, for a trace that has write records AND reads of entries no write record
    # creates: True marks a CREATE event that stands for "written just before the batch that
    # first reads them" (placed before their layer's READ event); False an explicit write.
    # None: every CREATE is lazy if create_on_first_read, else none is.
    ev_lazy: NDArray | None = None
    # Shared prefixes: (context, parent, blocks): the context's first `blocks` blocks are the
    # parent's entries (its grid holds their ids; prefetch proposes them).
    prefixes: list[tuple[int, int, int]] = field(default_factory=list)
    # What replays derive from the stream alone (a replay plan, per granularity), built
    # once: a sweep replays one stream under many policies and budgets.  Not a field of the
    # stream's value (``dataclasses.replace`` starts a new one); see :meth:`derived`.
    _derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def derived(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()``, kept under ``key`` for the stream's life: for data that depends on
        the stream alone.  The stream's arrays are not to be changed in place after a
        replay (a changed stream is a new one: ``dataclasses.replace``)."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    @property
    def lazy_creates(self) -> NDArray:
        """Per event: a CREATE event the replay performs on first read instead (see ev_lazy)."""
        if self.ev_lazy is not None:
            return self.ev_lazy
        return (self.ev_kind == CREATE) & bool(self.create_on_first_read)

    @property
    def has_lazy_creates(self) -> bool:
        """Some entries are created on first read (a lazy CREATE event)."""
        return self.derived("has_lazy_creates", lambda: bool(self.lazy_creates.any()))

    @property
    def n_entries(self) -> int:
        return int(self.e_ctx.size)

    @property
    def n_events(self) -> int:
        return int(self.ev_kind.size)

    @property
    def read_mask(self) -> NDArray:
        return self.ev_kind == READ

    @property
    def n_reads(self) -> int:
        starts, ends = self.ev_off[:-1], self.ev_off[1:]
        return int((ends - starts)[self.read_mask].sum())

    @property
    def n_steps(self) -> int:
        s = self.ev_step[self.read_mask]
        return int(unique_ids(s).size)

    @property
    def kv_bytes(self) -> int:
        """Bytes of every entry the stream creates (nothing is dropped: the footprint)."""
        return self.n_entries * self.shape.entry_bytes

    def to_trace(self, writes: bool = True) -> Trace:
        """The stream as a :class:`Trace` (entry identities instead of ids).

        With ``writes`` (default) a stream that writes (a workload) becomes a version-2
        trace whose records are its events in order — write records for its CREATE events
        (with the context lengths), read records for its READ events — which
        :func:`from_trace` turns back into the same stream, so it replays identically.
        Without writes, or for a stream that has none (a version-1 trace's), the reads
        alone: a version-1 trace, whose entries a replay writes just before their first read.
        """
        rm = np.flatnonzero(self.read_mask)
        explicit = (self.ev_kind == CREATE) & ~self.lazy_creates
        if writes and (explicit.any() or not _layer_ordered(self.ev_step[rm], self.ev_layer[rm])):
            return self._to_trace_v2()
        sizes = self.ev_off[rm + 1] - self.ev_off[rm]
        sel = (
            np.concatenate([np.arange(self.ev_off[i], self.ev_off[i + 1]) for i in rm])
            if rm.size
            else np.zeros(0, np.int64)
        )
        ids = self.ids[sel]
        return Trace(
            step=np.repeat(self.ev_step[rm], sizes),
            context=self.e_ctx[ids],
            layer=self.e_layer[ids],
            head=self.e_head[ids],
            block=self.e_block[ids],
            weight=self.w[sel],
            **self._trace_meta(v2=False),
        )

    def _trace_meta(self, v2: bool = True) -> dict[str, Any]:
        agg = self.info.get("aggregation", "max")
        return {
            "shape": self.shape,
            "aggregation": agg if agg in ("max", "mean") else "max",
            "evidence": self.evidence,
            "source": self.source,
            "extra": dict(self.info),
            "prefixes": list(self.prefixes) if v2 else [],  # a version-1 trace has none
        }

    def _to_trace_v2(self) -> Trace:
        """Every event as records: writes (op 1) and reads (op 0), in event order."""
        lazy = self.lazy_creates
        cols: dict[str, list[NDArray]] = {k: [] for k in ("step", "id", "w", "op", "tok")}
        last_own: dict[int, int] = {}  # context -> an entry of its own created so far
        for e in range(self.n_events):
            a, z = int(self.ev_off[e]), int(self.ev_off[e + 1])
            ids = self.ids[a:z]
            step = int(self.ev_step[e])
            if self.ev_kind[e] != CREATE:
                cols["step"].append(np.full(ids.size, step, np.int64))
                cols["id"].append(ids)
                cols["w"].append(self.w[a:z])
                cols["op"].append(np.zeros(ids.size, np.int8))
                cols["tok"].append(np.zeros(ids.size, np.int64))
                continue
            if ids.size:
                c = self.e_ctx[ids].astype(np.int64)
                last_own.update(zip(c.tolist(), ids.tolist(), strict=True))
            if lazy[e]:  # its reads create these entries
                continue
            lens: dict[int, int] = {}
            lo, hi = int(self.len_off[e]), int(self.len_off[e + 1])
            for ci, ti in zip(self.len_ctx[lo:hi].tolist(), self.len_tokens[lo:hi].tolist(),
                              strict=True):  # fmt: skip
                lens[ci] = max(lens.get(ci, 0), ti)
            made = set(self.e_ctx[ids].tolist())
            upd = sorted(ci for ci in lens if ci not in made)
            for ci in upd:
                if ci not in last_own:
                    raise ValueError(
                        f"context {ci} changes length at step {step} before it has an entry of "
                        "its own: a trace cannot express that"
                    )
            tok = np.array([lens.get(ci, 0) for ci in self.e_ctx[ids].tolist()], np.int64)
            ref = np.array([last_own[ci] for ci in upd], np.int64)
            n = ids.size + ref.size
            cols["step"].append(np.full(n, step, np.int64))
            cols["id"].append(np.concatenate([ids, ref]))
            cols["w"].append(np.zeros(n, np.float32))
            cols["op"].append(np.full(n, OP_WRITE, np.int8))
            cols["tok"].append(np.concatenate([tok, [lens[ci] for ci in upd]]).astype(np.int64))
        cat = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in cols.items()}
        ids = cat["id"].astype(np.int64)
        return Trace(
            step=cat["step"],
            context=self.e_ctx[ids],
            layer=self.e_layer[ids],
            head=self.e_head[ids],
            block=self.e_block[ids],
            weight=cat["w"].astype(np.float32),
            op=cat["op"].astype(np.int8),
            tokens=cat["tok"],
            **self._trace_meta(),
        )


def _layer_ordered(steps: NDArray, layers: NDArray) -> bool:
    """Whether READ events run in strictly ascending (step, layer) order (a v1 trace's order)."""
    if steps.size < 2:
        return True
    ds, dl = np.diff(steps), np.diff(layers)
    return bool(np.all((ds > 0) | ((ds == 0) & (dl > 0))))


class _Builder:
    """Accumulates events; owns the entry grids of every context.

    Creations and length updates wait in ``pending_*`` until :meth:`flush` writes them as
    one CREATE event: before a step's first read and at the step's end, so a step is at
    most one write, its reads layer by layer, at most one write.
    """

    def __init__(self, shape: ModelShape) -> None:
        self.shape = shape
        self.n = 0
        self.max_n, self.cap_why = entry_cap()
        self.grids: dict[int, NDArray] = {}
        self.tokens: dict[int, int] = {}
        self.first_own_block: dict[int, int] = {}
        self.children: set[int] = set()  # contexts that share entries of a parent context
        # each entry's (context, layer, head, block), written as the entries are created
        self.e = tuple(Column(np.int32) for _ in range(4))
        self.kind: list[int] = []
        self.step: list[int] = []
        self.layer: list[int] = []
        self.tok: list[int] = []
        self.sizes: list[int] = []  # each event's ids (and weights)
        # the events' ids and weights; a creation's ids are written when it is made (no
        # read is written before the creations pending: :meth:`read` flushes them first)
        self.ids = Column(np.int64)
        self.w = Column(np.float32)
        self.lens: list[list[tuple[int, int]]] = []
        self.pending_lens: list[tuple[int, int]] = []
        self.pending_n = 0  # entries created since the last write event
        self.prefixes: list[tuple[int, int, int]] = []

    def _grid(self, ctx: int, nb: int) -> NDArray:
        s = self.shape
        g = self.grids.get(ctx)
        if g is None:
            g = np.full((s.layers, s.kv_heads, max(nb, 4)), -1, dtype=np.int64)
        elif g.shape[2] < nb:
            # doubled (amortised growth), but never past a context's longest (S1's 16 users
            # would hold 0.75 GB of grid no block can use)
            most = -(-s.context_tokens // s.block_tokens)
            new = np.full((s.layers, s.kv_heads, max(nb, min(2 * g.shape[2], most))), -1, np.int64)
            new[:, :, : g.shape[2]] = g
            g = new
        self.grids[ctx] = g
        return g

    def grow(
        self,
        ctx: int,
        tokens: int,
        step: int,
        parent: int | None = None,
        shared: int | None = None,
    ) -> None:
        """Context ``ctx`` now holds ``tokens`` tokens; create entries of its new blocks.
        A new context with a ``parent`` starts from the parent's first ``shared`` tokens
        (None: all of them), rounded up to whole blocks."""
        s = self.shape
        bt = s.block_tokens
        if ctx not in self.tokens:
            start = 0
            if parent is not None:
                pt = self.tokens[parent] if shared is None else min(shared, self.tokens[parent])
                pb = -(-pt // bt)
                g = self._grid(ctx, pb)
                g[:, :, :pb] = self.grids[parent][:, :, :pb]
                start = pb * bt
                tokens += start
                if pb:
                    self.prefixes.append((ctx, parent, pb))
            self.tokens[ctx] = start
            self.first_own_block[ctx] = -(-start // bt)
            if parent is not None:
                self.children.add(ctx)
        old = self.tokens[ctx]
        tokens = min(tokens, s.context_tokens)
        if tokens <= old:
            return
        ob, nb = -(-old // bt), -(-tokens // bt)
        self.tokens[ctx] = tokens
        self.pending_lens.append((ctx, tokens))
        if nb > ob:
            g = self._grid(ctx, nb)
            k = nb - ob
            L, H = s.layers, s.kv_heads
            ids = np.arange(self.n, self.n + L * H * k, dtype=np.int64)
            g[:, :, ob:nb] = ids.reshape(L, H, k)
            i32 = np.int32
            for col, part in zip(
                self.e,
                (
                    np.full(1, ctx, i32),
                    np.arange(L, dtype=i32)[:, None, None],
                    np.arange(H, dtype=i32)[None, :, None],
                    np.arange(ob, nb, dtype=i32)[None, None, :],
                ),
                strict=True,
            ):
                col.append(np.broadcast_to(part, (L, H, k)))
            self.n += ids.size
            if self.n > self.max_n:
                raise ValueError(
                    f"the workload creates more than {self.max_n:,} entries "
                    f"({self.max_n * s.entry_bytes / 2**30:,.0f} GiB of modelled KV) by step "
                    f"{step}, {self.cap_why}: shrink --context-tokens, the sessions or --steps"
                )
            self.ids.append(ids)
            self.pending_n += ids.size

    def decode_token(self, ctx: int, step: int) -> None:
        """``ctx`` appends the token it decoded; a context at its cap still reports its length
        (a no-op update that says it decoded, which a trace's tokens-decoded rule counts)."""
        before = len(self.pending_lens)
        self.grow(ctx, self.tokens[ctx] + 1, step)
        if len(self.pending_lens) == before:
            self.pending_lens.append((ctx, self.tokens[ctx]))

    def flush(self, step: int) -> None:
        """One write event: every creation and length update since the last one."""
        if not self.pending_n and not self.pending_lens:
            return
        self.w.skip(self.pending_n)  # a write's weights are zeros (the ids are written)
        self._event(CREATE, step, -1, self.pending_n)
        self.pending_n = 0

    def _event(self, kind: int, step: int, layer: int, size: int, tokens: int = 0) -> None:
        self.tok.append(tokens)
        self.kind.append(kind)
        self.step.append(step)
        self.layer.append(layer)
        self.sizes.append(size)
        self.lens.append(self.pending_lens)
        self.pending_lens = []

    def read(
        self, step: int, layer: int, parts: list[tuple[NDArray, NDArray]], tokens: int
    ) -> bool:
        """A layer's reads, after the pending writes: ``parts`` of (ids, weights) of one
        shape each, read in C order. A layer that reads nothing is no event (no batch: it
        would only advance the batch clock).  Returns whether it was one."""
        size = sum(int(ids.size) for ids, _ in parts)
        if size == 0:
            return False
        self.flush(step)
        for ids, w in parts:
            self.ids.append(ids)
            self.w.append(w)
        self._event(READ, step, layer, size, tokens)
        return True

    def finish(self, evidence: str, source: str, info: dict[str, Any]) -> ReadStream:
        s = self.shape
        self.flush(self.step[-1] if self.step else 0)
        sizes = np.array(self.sizes, dtype=np.int64)
        lsizes = np.array([len(x) for x in self.lens], dtype=np.int64)
        flat_lens = [x for group in self.lens for x in group]
        return ReadStream(
            shape=s,
            e_ctx=self.e[0].take(),
            e_layer=self.e[1].take(),
            e_head=self.e[2].take(),
            e_block=self.e[3].take(),
            ev_kind=np.array(self.kind, dtype=np.int8),
            ev_step=np.array(self.step, dtype=np.int64),
            ev_layer=np.array(self.layer, dtype=np.int32),
            ev_off=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            ev_tokens=np.array(self.tok, dtype=np.int64),
            ids=self.ids.take(),
            w=self.w.take(),
            len_off=np.concatenate([[0], np.cumsum(lsizes)]).astype(np.int64),
            len_ctx=np.array([c for c, _ in flat_lens], dtype=np.int64),
            len_tokens=np.array([t for _, t in flat_lens], dtype=np.int64),
            grids={
                c: g[:, :, : -(-self.tokens[c] // s.block_tokens)] for c, g in self.grids.items()
            },
            evidence=evidence,
            source=source,
            info=info,
            prefixes=list(self.prefixes),
        )


def merge_duplicates(ids: NDArray, w: NDArray) -> tuple[NDArray, NDArray]:
    """One read per entry per batch, with the largest weight.

    A block shared by several sequences of the serving batch (a shared prefix) is read
    once per layer for all of them, as prefix-sharing attention kernels do.  It also
    keeps Belady's farthest-next-use rule optimal: with one read per entry per batch,
    every use of an entry is worth the same.  The merged read keeps the place of the
    entry's first record, so a duplicate never reorders a batch (one request per read
    replays the batch in that order).
    """
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    if s.size < 2 or np.all(s[1:] != s[:-1]):
        return ids, w
    first = np.ones(s.size, dtype=bool)
    first[1:] = s[1:] != s[:-1]
    starts = np.flatnonzero(first)
    keep = np.argsort(order[starts], kind="stable")  # first records, in batch order
    return s[starts][keep], np.maximum.reduceat(w[order], starts)[keep]


def parse_read_mode(text: str) -> tuple[str, float]:
    """``dense``, ``topk:K`` or ``threshold:T`` → (mode, value)."""
    if text == "dense":
        return "dense", 0.0
    mode, _, value = text.partition(":")
    if mode not in ("topk", "threshold") or not value:
        raise ValueError(f"read mode {text!r}: use 'dense', 'topk:K' or 'threshold:T'")
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"read mode {text!r}: {value!r} is not a number") from None
    sparse_mask(np.zeros((1, 1, 1), np.float32), mode, v)  # validates the value
    return mode, v


def compile_workload(
    workload: Any,
    steps: int,
    *,
    attention: AttentionParams | None = None,
    aggregation: str = "max",
    read: str = "dense",
    progress: Any = None,
) -> ReadStream:
    """Run ``workload`` (a :class:`~kvcxl.emu.workloads.base.Workload`) for ``steps`` steps."""
    if steps < 1:
        raise ValueError(f"steps = {steps} is out of range: must be >= 1")
    shape = workload.shape
    attention = attention or preset_attention(shape)
    mode, value = parse_read_mode(read)
    model = AttentionModel(shape, attention, aggregation, workload.seed)
    rng = np.random.default_rng([workload.seed, 0xC0DE])
    b = _Builder(shape)
    ctx_att: dict[int, ContextAttention] = {}

    def att(ctx: int) -> ContextAttention:
        if ctx not in ctx_att:
            ctx_att[ctx] = ContextAttention(
                shape,
                attention,
                np.random.default_rng([workload.seed, 0xB10C, ctx]),
                workload.needle_blocks(ctx),
            )
        return ctx_att[ctx]

    for ctx, tokens in workload.shared_contexts():
        b.grow(ctx, tokens, 0)
    frac = float(workload.params.get("read_fraction", 0.25))
    for plan in workload.plans(steps):
        for ctx, tokens, parent in plan.prefill:
            shared = workload.shared_tokens(ctx) if parent is not None else None
            b.grow(ctx, b.tokens.get(ctx, 0) + tokens, plan.step, parent, shared)
        if not plan.decode:
            b.flush(plan.step)
            continue
        # each decoding context's (ids, weights, mask or None for all of them), every layer;
        # a top-k read's ids and weights are its blocks' alone
        got: list[tuple[NDArray, NDArray, NDArray | None]] = []
        for ctx in plan.decode:
            if ctx not in b.tokens:
                b.grow(ctx, 1, plan.step)
            n = b.tokens[ctx]
            nb = -(-n // shape.block_tokens)
            grid = b.grids[ctx][:, :, :nb]
            mask: NDArray | None
            if workload.read_mode == "uniform":
                mask = rng.random(grid.shape) < frac
                w = (rng.random(grid.shape) * min(1.0, 2.0 / nb)).astype(np.float32)
            else:
                w = model.weights(att(ctx), n, rng)
                if mode == "topk" and int(value) < nb:  # the blocks read, taken at once
                    grid, w = topk_read(w, grid, int(value))
                mask = None if mode in ("dense", "topk") else sparse_mask(w, mode, value)
            got.append((grid, w, mask))
        shared = any(ctx in b.children for ctx in plan.decode)
        decoded = len(plan.decode)  # counted on the step's first read event
        for layer in range(shape.layers):
            # read in place, the contexts in order (a dense read is the whole grid's layer)
            parts = [
                (g[layer], x[layer]) if m is None else (g[layer][m[layer]], x[layer][m[layer]])
                for g, x, m in got
            ]
            if shared:  # one read per entry (merged across the contexts)
                ids = np.concatenate([i.ravel() for i, _ in parts])
                ws = np.concatenate([x.ravel() for _, x in parts]).astype(np.float32, copy=False)
                parts = [merge_duplicates(ids, ws)]
            if b.read(plan.step, layer, parts, decoded):
                decoded = 0
        del got
        for ctx in plan.decode:  # each decoding context appends its new token
            b.decode_token(ctx, plan.step)
        b.flush(plan.step)
        if progress is not None:
            progress(1)
    info = {
        "workload": workload.name,
        "seed": workload.seed,
        "steps": steps,
        "read": read,
        "aggregation": aggregation,
        "params": dict(workload.params),
        "attention": attention.to_dict(),
    }
    return b.finish("Simulated", f"workload {workload.name} seed {workload.seed}", info)


def from_trace(trace: Trace) -> ReadStream:
    """A trace as a stream (docs/trace-format.md).

    Version 1 (no ``op`` column): every record is a read; the records are served by step,
    then layer; entries are created (written to HBM) just before their first read.
    Version 2 with ``op``: the records are the events in order; a write record creates its
    entry (or, for an existing one, only updates its context's length), and an entry no
    write created is created just before its first read, as in version 1.
    """
    stream = _from_reads(trace) if trace.op is None else _from_events(trace)
    if trace.prefixes:
        _share_prefixes(stream.grids, trace.prefixes, trace.shape)
        stream.prefixes = list(trace.prefixes)
    return stream


def _from_reads(trace: Trace) -> ReadStream:
    """A version-1 trace (reads only): entries created just before their first read."""
    s = trace.shape
    order = np.lexsort((trace.layer, trace.step))  # by step, then layer; stable
    step, layer = trace.step[order], trace.layer[order]
    keys = trace.entry_keys()[order]
    w = trace.weight[order]
    # Dense ids in order of first appearance (a stable sort: np.unique's hash path is slow).
    srt = np.argsort(keys, kind="stable")
    ks = keys[srt]
    new = np.ones(ks.size, dtype=bool)
    new[1:] = ks[1:] != ks[:-1]
    group = np.cumsum(new) - 1  # distinct-key index of each sorted record
    first = srt[new]  # first record (in batch order) of each distinct key
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    ids = np.empty(keys.size, dtype=np.int64)
    ids[srt] = rank[group]
    by_id = order[np.sort(first)]  # record (original index) that first read each id
    e_ctx = trace.context[by_id]
    e_layer, e_head, e_block = trace.layer[by_id], trace.head[by_id], trace.block[by_id]
    # Batches: runs of equal (step, layer).
    if step.size:
        cut = np.flatnonzero((step[1:] != step[:-1]) | (layer[1:] != layer[:-1])) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [step.size]])
    else:
        starts = ends = np.zeros(0, dtype=np.int64)
    kinds, evsteps, evlayers, pids, pws, lens, toks = [], [], [], [], [], [], []
    ctx_sorted = trace.context[order]
    seen_step = -1
    made = 0
    bt = s.block_tokens
    ctx_len: dict[int, int] = {}  # a context never shrinks: its longest block end so far
    for a, z in zip(starts.tolist(), ends.tolist(), strict=True):
        top = int(ids[a:z].max()) + 1
        if top > made:
            new = np.arange(made, top, dtype=np.int64)
            kinds.append(CREATE)
            evsteps.append(int(step[a]))
            evlayers.append(-1)
            pids.append(new)
            pws.append(np.zeros(new.size, np.float32))
            # Context length: the end of its highest block created so far (blocks full).
            c = e_ctx[new].astype(np.int64)
            tok = (e_block[new].astype(np.int64) + 1) * bt
            grown: dict[int, int] = {}
            for ci, ti in zip(c.tolist(), tok.tolist(), strict=True):
                if ti > ctx_len.get(ci, 0):
                    ctx_len[ci] = grown[ci] = ti
            lens.append(sorted(grown.items()))
            toks.append(0)
            made = top
        kinds.append(READ)
        evsteps.append(int(step[a]))
        evlayers.append(int(layer[a]))
        bid, bw = merge_duplicates(ids[a:z], w[a:z])
        pids.append(bid)
        pws.append(bw)
        lens.append([])
        if int(step[a]) != seen_step:  # contexts read in this step each decode one token
            seen_step = int(step[a])
            hi = int(np.searchsorted(step, seen_step, side="right"))
            toks.append(int(unique_ids(ctx_sorted[a:hi]).size))
        else:
            toks.append(0)
    events = (kinds, evsteps, evlayers, pids, pws, lens, toks)
    return _trace_stream(trace, e_ctx, e_layer, e_head, e_block, events, create_on_first_read=True)


def _trace_stream(
    trace: Trace,
    e_ctx: NDArray,
    e_layer: NDArray,
    e_head: NDArray,
    e_block: NDArray,
    events: tuple[list, list, list, list, list, list, list],
    **flags: Any,
) -> ReadStream:
    """A trace's stream from its entries and per-event lists (kinds, steps, layers, ids,
    weights, length updates, tokens decoded), the one assembly both trace readers use."""
    s = trace.shape
    kinds, evsteps, evlayers, pids, pws, lens, toks = events
    sizes = np.array([p.size for p in pids], dtype=np.int64)
    lsizes = np.array([len(x) for x in lens], dtype=np.int64)
    flat = [x for group in lens for x in group]
    return ReadStream(
        shape=s,
        e_ctx=e_ctx.astype(np.int32),
        e_layer=e_layer.astype(np.int32),
        e_head=e_head.astype(np.int32),
        e_block=e_block.astype(np.int32),
        ev_kind=np.array(kinds, dtype=np.int8),
        ev_step=np.array(evsteps, dtype=np.int64),
        ev_layer=np.array(evlayers, dtype=np.int32),
        ev_off=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        ev_tokens=np.array(toks, dtype=np.int64),
        ids=np.concatenate(pids) if pids else np.zeros(0, np.int64),
        w=np.concatenate(pws).astype(np.float32) if pws else np.zeros(0, np.float32),
        len_off=np.concatenate([[0], np.cumsum(lsizes)]).astype(np.int64),
        len_ctx=np.array([c for c, _ in flat], dtype=np.int64),
        len_tokens=np.array([t for _, t in flat], dtype=np.int64),
        grids=_grids(s, e_ctx, e_layer, e_head, e_block),
        evidence=trace.evidence,
        source=trace.source,
        info={"trace": trace.source, **trace.extra},
        **flags,
    )


def _grids(
    s: ModelShape, e_ctx: NDArray, e_layer: NDArray, e_head: NDArray, e_block: NDArray
) -> dict[int, NDArray]:
    """Context -> (layers, kv_heads, blocks) entry ids (−1 for none), from the entries."""
    grids: dict[int, NDArray] = {}
    for c in unique_ids(e_ctx).tolist():
        sel = np.flatnonzero(e_ctx == c)
        g = np.full((s.layers, s.kv_heads, int(e_block[sel].max()) + 1), -1, dtype=np.int64)
        g[e_layer[sel], e_head[sel], e_block[sel]] = sel
        grids[c] = g
    return grids


def _share_prefixes(
    grids: dict[int, NDArray], prefixes: list[tuple[int, int, int]], s: ModelShape
) -> None:
    """A context's first blocks are its parent's entries (as the workload's grids hold them)."""
    for c, parent, nb in prefixes:
        pg = grids.get(parent)
        if pg is None:
            continue
        k = min(nb, pg.shape[2])
        g = grids.get(c)
        if g is None:
            g = np.full((s.layers, s.kv_heads, k), -1, dtype=np.int64)
        elif g.shape[2] < k:
            g = np.concatenate(
                [g, np.full((s.layers, s.kv_heads, k - g.shape[2]), -1, np.int64)], axis=2
            )
        g[:, :, :k] = pg[:, :, :k]
        grids[c] = g


def _first_appearance(keys: NDArray) -> tuple[NDArray, NDArray]:
    """Dense ids in order of first appearance, and the record that first holds each id."""
    srt = np.argsort(keys, kind="stable")  # a stable sort: np.unique's hash path is slow
    ks = keys[srt]
    new = np.ones(ks.size, dtype=bool)
    new[1:] = ks[1:] != ks[:-1]
    group = np.cumsum(new) - 1
    first = srt[new]
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    ids = np.empty(keys.size, dtype=np.int64)
    ids[srt] = rank[group]
    return ids, np.sort(first)


def _ctx_max(ctx: NDArray, tokens: NDArray) -> list[tuple[int, int]]:
    """(context, largest tokens) per context, ascending, ignoring tokens <= 0."""
    keep = tokens > 0
    c, t = ctx[keep].astype(np.int64), tokens[keep].astype(np.int64)
    if c.size == 0:
        return []
    o = np.lexsort((t, c))
    c, t = c[o], t[o]
    last = np.ones(c.size, dtype=bool)
    last[:-1] = c[1:] != c[:-1]
    return list(zip(c[last].tolist(), t[last].tolist(), strict=True))


def _decoded_per_step(trace: Trace) -> dict[int, int]:
    """Tokens decoded per step of a version-2 trace (docs/trace-format.md).

    The distinct contexts with a write record after the step's first read (each decoding
    context writes the token it produced after reading); a step without such a write
    counts, as in version 1, the distinct contexts it reads.
    """
    is_w = trace.op == OP_WRITE
    step, ctx = trace.step, trace.context.astype(np.int64)
    rd = np.flatnonzero(~is_w)
    if rd.size == 0:
        return {}
    steps, first = np.unique(step[rd], return_index=True)
    first_read = rd[first]

    def distinct_per_step(st: NDArray, c: NDArray) -> dict[int, int]:
        if st.size == 0:
            return {}
        o = np.lexsort((c, st))
        st, c = st[o], c[o]
        new = np.ones(st.size, dtype=bool)
        new[1:] = (st[1:] != st[:-1]) | (c[1:] != c[:-1])
        u, n = np.unique(st[new], return_counts=True)
        return dict(zip(u.tolist(), n.tolist(), strict=True))

    wr = np.flatnonzero(is_w)
    pos = np.minimum(np.searchsorted(steps, step[wr]), steps.size - 1)
    after = (steps[pos] == step[wr]) & (wr > first_read[pos])
    by_writes = distinct_per_step(step[wr[after]], ctx[wr[after]])
    by_reads = distinct_per_step(step[rd], ctx[rd])
    return {s: by_writes.get(s, by_reads[s]) for s in steps.tolist()}


def _from_events(trace: Trace) -> ReadStream:
    """A version-2 trace with ``op``: its records are the events, in file order."""
    s = trace.shape
    bt = s.block_tokens
    n = len(trace)
    is_w = trace.op == OP_WRITE
    step, layer, ctx = trace.step, trace.layer, trace.context
    ids, by_id = _first_appearance(trace.entry_keys())
    first = np.zeros(n, dtype=bool)
    first[by_id] = True  # the record that creates its entry (a write) or first reads it
    e_ctx, e_layer, e_head, e_block = (
        ctx[by_id],
        layer[by_id],
        trace.head[by_id],
        trace.block[by_id],
    )
    block_end = (trace.block.astype(np.int64) + 1) * bt  # v1's length: blocks assumed full
    # Events: runs of equal (step, op) for writes, equal (step, op, layer) for reads.
    if n:
        cut = (step[1:] != step[:-1]) | (is_w[1:] != is_w[:-1])
        cut |= ~is_w[1:] & (layer[1:] != layer[:-1])
        starts = np.concatenate([[0], np.flatnonzero(cut) + 1])
        ends = np.concatenate([starts[1:], [n]])
    else:
        starts = ends = np.zeros(0, dtype=np.int64)
    decoded = _decoded_per_step(trace)
    any_writes = bool(is_w.any())
    kinds: list[int] = []
    evsteps: list[int] = []
    evlayers: list[int] = []
    pids: list[NDArray] = []
    pws: list[NDArray] = []
    lens: list[list[tuple[int, int]]] = []
    toks: list[int] = []
    lazy: list[bool] = []
    seen_step = None
    for a, z in zip(starts.tolist(), ends.tolist(), strict=True):
        st = int(step[a])
        new = ids[a:z][first[a:z]]  # ascending and consecutive: ids follow first appearance
        if is_w[a]:
            # A write creates its new entries; every record may set its context's length.
            tok = trace.tokens[a:z]
            length = np.where(tok > 0, tok, np.where(first[a:z], block_end[a:z], 0))
            kinds.append(CREATE)
            evsteps.append(st)
            evlayers.append(-1)
            pids.append(new)
            pws.append(np.zeros(new.size, np.float32))
            lens.append(_ctx_max(ctx[a:z], length))
            toks.append(0)
            lazy.append(False)
            continue
        if new.size:  # entries no write created: written just before the batch first reading them
            sel = np.flatnonzero(first[a:z]) + a
            kinds.append(CREATE)
            evsteps.append(st)
            evlayers.append(-1)
            pids.append(new)
            pws.append(np.zeros(new.size, np.float32))
            lens.append(_ctx_max(ctx[sel], block_end[sel]))
            toks.append(0)
            lazy.append(True)
        bid, bw = merge_duplicates(ids[a:z], trace.weight[a:z])
        kinds.append(READ)
        evsteps.append(st)
        evlayers.append(int(layer[a]))
        pids.append(bid)
        pws.append(bw)
        lens.append([])
        toks.append(decoded[st] if st != seen_step else 0)
        seen_step = st
        lazy.append(False)
    ev_lazy = np.array(lazy, dtype=bool)
    events = (kinds, evsteps, evlayers, pids, pws, lens, toks)
    return _trace_stream(
        trace, e_ctx, e_layer, e_head, e_block, events,
        # Without writes it is a version-1 trace in file order: every CREATE is lazy.
        create_on_first_read=not any_writes,
        ev_lazy=ev_lazy if any_writes and ev_lazy.any() else None,
    )  # fmt: skip
