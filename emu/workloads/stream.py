"""A workload or a trace compiled into one policy-independent stream of events.

Which entries exist and which are read with which weights does not depend on the
cache policy, so a workload is compiled once (:func:`compile_workload`) or a trace
converted once (:func:`from_trace`), and every policy and budget replays the same
:class:`ReadStream`.  Events, in order:

* CREATE — new entries (a prefill, or a decode step that opened a new block); their
  KV is written into HBM.  Entry ids are dense and handed out in creation order.
* READ — one layer of one decode step: the entries read (all decoding contexts
  together) with their attention weights.

Each event may also update context lengths (tokens), which recency-by-position
policies (sink-window, h2o) use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ...firmware.cache import unique_ids
from ..attention import (
    AttentionModel,
    AttentionParams,
    ContextAttention,
    preset_attention,
    sparse_mask,
)
from ..shape import ModelShape
from ..trace import Trace

CREATE, READ = 0, 1
MAX_ENTRIES = 60_000_000  # ~2.5 GB of per-entry arrays: beyond this, refuse rather than swap


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

    def read_batches(self) -> tuple[list[NDArray], NDArray]:
        """The read events' id arrays (batch i at time i) and their steps."""
        rm = np.flatnonzero(self.read_mask)
        return [self.ids[self.ev_off[i] : self.ev_off[i + 1]] for i in rm], self.ev_step[rm]

    def to_trace(self) -> Trace:
        """The read events as a :class:`Trace` (entry identities instead of ids)."""
        rm = np.flatnonzero(self.read_mask)
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
            shape=self.shape,
            evidence=self.evidence,
            source=self.source,
            extra=dict(self.info),
        )


class _Builder:
    """Accumulates events; owns the entry grids of every context."""

    def __init__(self, shape: ModelShape) -> None:
        self.shape = shape
        self.n = 0
        self.grids: dict[int, NDArray] = {}
        self.tokens: dict[int, int] = {}
        self.first_own_block: dict[int, int] = {}
        self.children: set[int] = set()  # contexts that share entries of a parent context
        self.e: list[tuple[NDArray, NDArray, NDArray, NDArray]] = []
        self.kind: list[int] = []
        self.step: list[int] = []
        self.layer: list[int] = []
        self.tok: list[int] = []
        self.payload_ids: list[NDArray] = []
        self.payload_w: list[NDArray] = []
        self.lens: list[list[tuple[int, int]]] = []
        self.pending_lens: list[tuple[int, int]] = []

    def _grid(self, ctx: int, nb: int) -> NDArray:
        s = self.shape
        g = self.grids.get(ctx)
        if g is None:
            g = np.full((s.layers, s.kv_heads, max(nb, 4)), -1, dtype=np.int64)
        elif g.shape[2] < nb:
            new = np.full((s.layers, s.kv_heads, max(nb, 2 * g.shape[2])), -1, dtype=np.int64)
            new[:, :, : g.shape[2]] = g
            g = new
        self.grids[ctx] = g
        return g

    def grow(self, ctx: int, tokens: int, step: int, parent: int | None = None) -> None:
        """Context ``ctx`` now holds ``tokens`` tokens; create entries of its new blocks."""
        s = self.shape
        bt = s.block_tokens
        if ctx not in self.tokens:
            start = 0
            if parent is not None:
                pt = self.tokens[parent]
                pb = -(-pt // bt)
                g = self._grid(ctx, pb)
                g[:, :, :pb] = self.grids[parent][:, :, :pb]
                start = pb * bt
                tokens += start
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
            ll, hh, bb = np.meshgrid(
                np.arange(L, dtype=np.int32),
                np.arange(H, dtype=np.int32),
                np.arange(ob, nb, dtype=np.int32),
                indexing="ij",
            )
            self.e.append((np.full(ids.size, ctx, np.int32), ll.ravel(), hh.ravel(), bb.ravel()))
            self.n += ids.size
            if self.n > MAX_ENTRIES:
                raise ValueError(
                    f"the workload creates more than {MAX_ENTRIES:,} entries "
                    f"({MAX_ENTRIES * s.entry_bytes / 2**30:,.0f} GiB of modelled KV) by step "
                    f"{step}: shrink --context-tokens, the sessions or --steps"
                )
            self._event(CREATE, step, -1, ids, np.zeros(ids.size, np.float32))

    def _event(
        self, kind: int, step: int, layer: int, ids: NDArray, w: NDArray, tokens: int = 0
    ) -> None:
        self.tok.append(tokens)
        self.kind.append(kind)
        self.step.append(step)
        self.layer.append(layer)
        self.payload_ids.append(ids)
        self.payload_w.append(w)
        self.lens.append(self.pending_lens)
        self.pending_lens = []

    def read(self, step: int, layer: int, ids: NDArray, w: NDArray, tokens: int) -> None:
        self._event(READ, step, layer, ids, w, tokens)

    def finish(self, evidence: str, source: str, info: dict[str, Any]) -> ReadStream:
        s = self.shape
        if self.pending_lens and self.kind:
            self.lens[-1].extend(self.pending_lens)
        sizes = np.array([a.size for a in self.payload_ids], dtype=np.int64)
        lsizes = np.array([len(x) for x in self.lens], dtype=np.int64)
        flat_lens = [x for group in self.lens for x in group]
        cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa: E731
        return ReadStream(
            shape=s,
            e_ctx=cat([e[0] for e in self.e], np.int32),
            e_layer=cat([e[1] for e in self.e], np.int32),
            e_head=cat([e[2] for e in self.e], np.int32),
            e_block=cat([e[3] for e in self.e], np.int32),
            ev_kind=np.array(self.kind, dtype=np.int8),
            ev_step=np.array(self.step, dtype=np.int64),
            ev_layer=np.array(self.layer, dtype=np.int32),
            ev_off=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            ev_tokens=np.array(self.tok, dtype=np.int64),
            ids=cat(self.payload_ids, np.int64),
            w=cat(self.payload_w, np.float32),
            len_off=np.concatenate([[0], np.cumsum(lsizes)]).astype(np.int64),
            len_ctx=np.array([c for c, _ in flat_lens], dtype=np.int64),
            len_tokens=np.array([t for _, t in flat_lens], dtype=np.int64),
            grids={
                c: g[:, :, : -(-self.tokens[c] // s.block_tokens)] for c, g in self.grids.items()
            },
            evidence=evidence,
            source=source,
            info=info,
        )


def merge_duplicates(ids: NDArray, w: NDArray) -> tuple[NDArray, NDArray]:
    """One read per entry per batch, with the largest weight.

    A block shared by several sequences of the serving batch (a shared prefix) is read
    once per layer for all of them, as prefix-sharing attention kernels do.  It also
    keeps Belady's farthest-next-use rule optimal: with one read per entry per batch,
    every use of an entry is worth the same.
    """
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    if s.size < 2 or np.all(s[1:] != s[:-1]):
        return ids, w
    first = np.ones(s.size, dtype=bool)
    first[1:] = s[1:] != s[:-1]
    starts = np.flatnonzero(first)
    return s[starts], np.maximum.reduceat(w[order], starts)


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
            b.grow(ctx, b.tokens.get(ctx, 0) + tokens, plan.step, parent)
        if not plan.decode:
            continue
        per_layer_ids: list[list[NDArray]] = [[] for _ in range(shape.layers)]
        per_layer_w: list[list[NDArray]] = [[] for _ in range(shape.layers)]
        for ctx in plan.decode:
            if ctx not in b.tokens:
                b.grow(ctx, 1, plan.step)
            n = b.tokens[ctx]
            nb = -(-n // shape.block_tokens)
            grid = b.grids[ctx][:, :, :nb]
            if workload.read_mode == "uniform":
                mask = rng.random(grid.shape) < frac
                w = (rng.random(grid.shape) * min(1.0, 2.0 / nb)).astype(np.float32)
            else:
                w = model.weights(att(ctx), n, rng)
                mask = sparse_mask(w, mode, value)
            for layer in range(shape.layers):
                m = mask[layer]
                per_layer_ids[layer].append(grid[layer][m])
                per_layer_w[layer].append(w[layer][m])
        shared = any(ctx in b.children for ctx in plan.decode)
        for layer in range(shape.layers):
            ids = np.concatenate(per_layer_ids[layer])
            w = np.concatenate(per_layer_w[layer]).astype(np.float32)
            if shared:
                ids, w = merge_duplicates(ids, w)
            b.read(plan.step, layer, ids, w, len(plan.decode) if layer == 0 else 0)
        for ctx in plan.decode:  # each decoding context appends its new token
            b.grow(ctx, b.tokens[ctx] + 1, plan.step)
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
    """A trace as a stream: entries are created (written to HBM) just before their first read."""
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
    grids: dict[int, NDArray] = {}
    for c in unique_ids(e_ctx).tolist():
        sel = np.flatnonzero(e_ctx == c)
        g = np.full((s.layers, s.kv_heads, int(e_block[sel].max()) + 1), -1, dtype=np.int64)
        g[e_layer[sel], e_head[sel], e_block[sel]] = sel
        grids[c] = g
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
        grids=grids,
        evidence=trace.evidence,
        source=trace.source,
        info={"trace": trace.source, **trace.extra},
        create_on_first_read=True,
    )
