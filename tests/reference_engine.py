"""A second, deliberately plain implementation of the simulator's replay.

Written from the documentation only — docs/simulator.md ("What is simulated",
"Replay, exactly") and docs/policy.md (formulas, engine semantics, the policy
table, the fixed-point contract) — and NOT from ``kvcxl.firmware`` or the body of
``kvcxl.emu.sim.simulator``: nothing from ``kvcxl.firmware`` is imported here except
that the caller hands in a ``PolicyConfig`` whose fields (and ``param(name)``, a policy's
own parameter) are read as plain values.
Dicts, sets, lists and loops; victims are found by sorting every eligible entry.
``tests/test_sim_differential.py`` compares it with the simulator step by step.

Where the documentation was silent or ambiguous, the reading taken is marked
``READING:`` below, so that the docs can be completed; the simulator agrees with
every one of them except where tests/test_sim_differential.py says otherwise.

Inputs:

* a trace as records ``(step, context, layer, head, block, weight)`` plus a
  ``ModelShape`` (:func:`replay_trace`), or
* a compiled workload stream (``ReadStream``; :func:`replay_stream`), read through
  its documented fields only: ``ev_kind`` (CREATE = 0, READ = 1), ``ev_step``,
  ``ev_off``, ``ids``, ``w``, ``len_off``/``len_ctx``/``len_tokens`` and
  ``e_ctx``/``e_layer``/``e_head``/``e_block``.

Output (:func:`replay_trace` / :func:`replay_stream`): a dict with

* ``read_steps`` — the read steps in stream order (steps with at least one read),
* ``per_step`` — ``reads``, ``hits`` (lists) and ``bytes_moved`` (a dict per read
  step, every tier pair present), warm-up included,
* ``victims`` — ``{step: Counter({(context, layer, head, block): times})}``,
* ``reads``, ``hits``, ``bytes_moved`` — totals after the warm-up read steps.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import reference_queues

PAIRS = ("host->hbm", "hbm->cxl", "hbm->nvme", "cxl->hbm", "nvme->hbm", "cxl->nvme")
POLICIES = ("ema", "lru", "fifo", "lfu", "lrfu", "sink-window", "h2o", "random", "belady")
# The queue policies (their plain versions: tests/reference_queues.py).
QUEUE_POLICIES = reference_queues.QUEUE_POLICIES
GRANULARITIES = ("layer", "step", "request")
CREATE, READ = 0, 1

HBM, CXL, NVME = "hbm", "cxl", "nvme"
INF = math.inf

# --- the random policy's hash (docs/policy.md: key = SplitMix64(seed, batch time, id)) ---
MASK64 = (1 << 64) - 1
GOLD = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB


def splitmix64(x: int) -> int:
    z = (x + GOLD) & MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def random_priority(seed: int, time: int, entry: int) -> int:
    base = splitmix64((seed * GOLD + time) & MASK64)
    key = splitmix64((entry ^ base) & MASK64)
    return key >> 11


# --- the Q0.16 contract (docs/policy.md, "The fixed-point contract") ---------------------
def q16(x: float) -> int:
    """clamp(rint(x·65536), 0, 65535), half to even."""
    v = int(np.rint(float(x) * 65536.0))
    return min(max(v, 0), 65535)


def alpha_q16(alpha: float) -> int:
    """α as round(α·65536), in 1 … 65536."""
    return min(max(round(float(alpha) * 65536.0), 1), 65536)


def decay_table_q16(beta: float, shift: int) -> list[int]:
    """DECAY[i] = q16(1 − exp(−β·(i << shift))), 256 entries."""
    return [q16(1.0 - math.exp(-float(beta) * (i << shift))) for i in range(256)]


# --- the replay plan ----------------------------------------------------------------------
@dataclass
class Op:
    """One unit of replay: a write (new KV) or one read batch."""

    kind: str  # "write", "read" or "lens" (lengths only)
    step: int
    ids: list[int] = field(default_factory=list)  # write: entries written
    reads: list[tuple[int, float]] = field(default_factory=list)  # read: (id, weight)
    lens: list[tuple[int, int]] = field(default_factory=list)  # (context, tokens) set first


def _merge(pairs: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Reads of the same entry in one batch are one read with the largest weight.

    READING: the merged read keeps the position of the entry's first read.
    """
    best: dict[int, float] = {}
    for i, w in pairs:
        if i not in best or w > best[i]:
            best[i] = w
    return list(best.items())


def plan_trace(
    records: list[tuple[int, int, int, int, int, float]], shape: Any, granularity: str
) -> tuple[list[Op], list[tuple[int, int, int, int]]]:
    """A trace's records as write and read ops, and the entry identities by id."""
    if granularity not in GRANULARITIES:
        raise ValueError(granularity)
    bt = shape.block_tokens
    # Stable sort by (step, layer); ids dense in order of first appearance.
    order = sorted(range(len(records)), key=lambda k: (int(records[k][0]), int(records[k][2])))
    ident_of: dict[tuple[int, int, int, int], int] = {}
    idents: list[tuple[int, int, int, int]] = []
    layer_batches: list[tuple[int, list[tuple[int, float]]]] = []  # (step, reads) per (step, layer)
    last_key = None
    for k in order:
        step, ctx, layer, head, block, w = records[k]
        ident = (int(ctx), int(layer), int(head), int(block))
        if ident not in ident_of:
            ident_of[ident] = len(idents)
            idents.append(ident)
        w32 = float(np.float32(w))  # the trace stores weights as float32
        key = (int(step), int(layer))
        if key != last_key:
            layer_batches.append((int(step), []))
            last_key = key
        layer_batches[-1][1].append((ident_of[ident], w32))
    # READING: a trace's layer batch lists its distinct entries in record order (a
    # duplicate merged into its first record) — the order --granularity request replays.
    layer_batches = [(s, _merge(r)) for s, r in layer_batches]

    # Group into the replay's batches.
    if granularity == "layer":
        batches = layer_batches
    elif granularity == "step":
        batches = []
        for s, r in layer_batches:
            if batches and batches[-1][0] == s:
                batches[-1] = (s, _merge(batches[-1][1] + r))
            else:
                batches.append((s, list(r)))
    else:  # request: every read is its own batch, in its layer batch's order
        batches = [(s, [rw]) for s, r in layer_batches for rw in r]

    created: set[int] = set()
    length: dict[int, int] = {}
    ops: list[Op] = []
    for s, r in batches:
        new = sorted({i for i, _ in r if i not in created})
        if new:
            created.update(new)
            lens = []
            for i in new:  # a trace's length: (highest block created so far + 1) × block_tokens
                ctx, _, _, block = idents[i]
                tok = max(length.get(ctx, 0), (block + 1) * bt)
                length[ctx] = tok
                lens.append((ctx, tok))
            ops.append(Op("write", s, ids=new, lens=lens))
        ops.append(Op("read", s, reads=r))
    return ops, idents


def plan_stream(stream: Any, granularity: str) -> tuple[list[Op], list[tuple[int, int, int, int]]]:
    """A workload stream's events as write and read ops, and the entry identities by id."""
    if granularity not in GRANULARITIES:
        raise ValueError(granularity)
    if getattr(stream, "create_on_first_read", False):
        raise ValueError("a trace's stream: replay the trace's records with replay_trace")
    kinds = [int(k) for k in stream.ev_kind]
    steps = [int(s) for s in stream.ev_step]
    off = [int(o) for o in stream.ev_off]
    loff = [int(o) for o in stream.len_off]
    ids = [int(i) for i in stream.ids]
    ws = [float(x) for x in np.asarray(stream.w, dtype=np.float32)]
    lctx = [int(c) for c in stream.len_ctx]
    ltok = [int(t) for t in stream.len_tokens]
    idents = list(
        zip(
            (int(x) for x in stream.e_ctx),
            (int(x) for x in stream.e_layer),
            (int(x) for x in stream.e_head),
            (int(x) for x in stream.e_block),
            strict=True,
        )
    )
    ops: list[Op] = []
    prev_read_event = False
    for e, kind in enumerate(kinds):
        lens = list(zip(lctx[loff[e] : loff[e + 1]], ltok[loff[e] : loff[e + 1]], strict=True))
        evi = ids[off[e] : off[e + 1]]
        evw = ws[off[e] : off[e + 1]]
        if kind == CREATE:
            ops.append(Op("write", steps[e], ids=sorted(evi), lens=lens))
            prev_read_event = False
            continue
        reads = _merge(list(zip(evi, evw, strict=True)))
        if granularity == "layer":
            ops.append(Op("read", steps[e], reads=reads, lens=lens))
        elif granularity == "step":
            # READING: "consecutive READ events of a step" — a CREATE in between splits them.
            if prev_read_event and ops[-1].step == steps[e]:
                ops[-1].reads = _merge(ops[-1].reads + reads)
                ops[-1].lens += lens
            else:
                ops.append(Op("read", steps[e], reads=reads, lens=lens))
        else:
            if not reads and lens:
                # READING (untested: no workload emits an empty READ event): an empty
                # event makes no request; its lengths still apply.
                ops.append(Op("lens", steps[e], lens=lens))
            for k, rw in enumerate(reads):
                ops.append(Op("read", steps[e], reads=[rw], lens=lens if k == 0 else []))
        prev_read_event = True
    return ops, idents


# --- the replay -------------------------------------------------------------------------
class Replay:
    """HBM residency, one policy, three exclusive tiers (docs/simulator.md)."""

    def __init__(
        self,
        ops: list[Op],
        idents: list[tuple[int, int, int, int]],
        shape: Any,
        *,
        policy: str,
        budget_bytes: int,
        config: Any,
        cxl_entries: int | None = None,
        warmup_steps: int = 0,
        mode: str = "float",
    ) -> None:
        if policy not in POLICIES + QUEUE_POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        if mode not in ("float", "int"):
            raise ValueError(mode)
        self.ops, self.idents, self.shape = ops, idents, shape
        self.policy, self.cfg, self.warmup = policy, config, warmup_steps
        self.int_mode = policy == "ema" and mode == "int"
        self.eb = shape.entry_bytes
        self.bt = shape.block_tokens
        self.capacity = budget_bytes // self.eb
        self.pin_slots = math.floor(config.pinned_fraction * self.capacity)
        self.cxl_cap = len(idents) if cxl_entries is None else cxl_entries
        self.persistent = bool(config.persistent_metadata)
        self.queues = (
            reference_queues.make(policy, self.capacity, config)
            if policy in QUEUE_POLICIES
            else None
        )

        self.resident: set[int] = set()
        self.pinned: set[int] = set()
        self.tier: dict[int, str] = {}
        self.cxl_arrival: dict[int, int] = {}  # id -> batch time of its arrival in CXL DRAM
        self.length: dict[int, int] = {}
        self.state: dict[int, dict[str, Any]] = {}  # the policy's per-entry metadata
        self.batch_time = -1  # time of the last read batch

        if self.int_mode:
            self.alpha_q = alpha_q16(config.alpha)
            self.decay = decay_table_q16(config.beta, config.decay_shift)
            self.touch_q = q16(config.touch_threshold)
        # Belady's future: read-batch times of each entry.
        self.future: dict[int, list[int]] = {}
        t = -1
        for op in ops:
            if op.kind == "read":
                t += 1
                for i, _ in op.reads:
                    self.future.setdefault(i, []).append(t)

    # ---- policy state -----------------------------------------------------------------
    def _fresh(self) -> dict[str, Any]:
        p = self.policy
        if p == "ema":
            return {
                "score": 0 if self.int_mode else 0.0,
                "idle": 0,
                "stepw": None,
                "touched": False,
            }
        if p == "lru":
            return {"last": 0}
        if p == "fifo":
            return {"admit": 0}
        if p == "lfu":
            return {"count": 0, "last": 0}
        if p == "lrfu":
            return {"log_crf": -INF, "last": 0}
        if p == "h2o":
            return {"acc": 0.0}
        return {}

    def _wants_pin(self, i: int) -> bool:
        first_token = self.idents[i][3] * self.bt
        if self.policy == "ema":
            return first_token < self.cfg.anchor_zone_size
        if self.policy in ("sink-window", "h2o"):
            return first_token < self.cfg.param("sink_tokens")
        return False

    def _on_insert(self, i: int, t: int) -> None:
        # READING: persistent off drops the state at eviction and on re-admission;
        # persistent on keeps it, and an entry's state begins at its first admission
        # (its creation): score 0, idle 0, no reads.
        if not self.persistent or i not in self.state:
            self.state[i] = self._fresh()
        st = self.state[i]
        # READING: an admission counts as a use for LRU and LFU's recency ("last") and
        # sets FIFO's admission time (every admission, whatever persistent_metadata).
        if self.policy in ("lru", "lfu"):
            st["last"] = t
        elif self.policy == "fifo":
            st["admit"] = t

    def _on_access(self, i: int, w: float, t: int) -> None:
        if self.queues is not None:
            self.queues.read(i)
            return
        st = self.state[i]
        p = self.policy
        if p == "ema":
            if self.int_mode:
                wq = q16(w)
                st["stepw"] = wq if st["stepw"] is None else max(st["stepw"], wq)
                if wq >= self.touch_q:
                    st["touched"] = True
                    st["idle"] = 0
            else:
                st["stepw"] = w if st["stepw"] is None else max(st["stepw"], w)
                if w >= self.cfg.touch_threshold:
                    st["touched"] = True
                    st["idle"] = 0
        elif p == "lru":
            st["last"] = t
        elif p == "lfu":
            st["count"] += 1
            st["last"] = t
        elif p == "lrfu":
            lam = self.cfg.param("lrfu_lambda")
            st["log_crf"] = float(np.logaddexp2(st["log_crf"] - lam * (t - st["last"]), 0.0))
            st["last"] = t
        elif p == "h2o":
            st["acc"] += w

    def _end_step(self) -> None:
        if self.policy != "ema":
            return
        a = self.cfg.alpha
        for st in self.state.values():
            w = st["stepw"]
            if self.int_mode:
                wq = 0 if w is None else w
                aq = self.alpha_q
                st["score"] = (aq * wq + (65536 - aq) * st["score"] + 32768) >> 16
                st["idle"] = 0 if st["touched"] else min(st["idle"] + 1, 65535)
            else:
                wf = 0.0 if w is None else w
                st["score"] = st["score"] * (1.0 - a) + a * wf
                st["idle"] = 0 if st["touched"] else st["idle"] + 1
            st["stepw"] = None
            st["touched"] = False

    def _age(self, i: int) -> int:
        ctx, _, _, block = self.idents[i]
        last_token = block * self.bt + self.bt - 1
        return max(self.length.get(ctx, 0) - 1 - last_token, 0)

    def _evict_key(self, i: int, t: int, belady_t: int) -> tuple:
        """Ascending key = evicted first: (−priority, id) for a numeric priority."""
        p = self.policy
        st = self.state.get(i)
        if p == "ema":
            if self.int_mode:
                d = self.decay[min(st["idle"] >> self.cfg.decay_shift, 255)]
                prio = ((65535 - st["score"]) * d + 32768) >> 16
            else:
                prio = (1.0 - st["score"]) * (-math.expm1(-self.cfg.beta * st["idle"]))
            return (-prio, i)
        if p == "lru":
            return (st["last"], i)
        if p == "fifo":
            return (st["admit"], i)
        if p == "lfu":
            return (st["count"], st["last"], i)
        if p == "lrfu":
            prio = -(st["log_crf"] - self.cfg.param("lrfu_lambda") * (t - st["last"]))
            return (-prio, i)
        if p == "sink-window":
            return (-self._age(i), i)
        if p == "h2o":
            if self._age(i) < self.cfg.param("recent_tokens"):
                return (1, 0.0, i)  # evicted last, among themselves lower id first
            return (0, st["acc"], i)
        if p == "random":
            return (-random_priority(int(self.cfg.param("seed")), t, i), i)
        if p == "belady":
            nxt = INF
            for u in self.future.get(i, ()):
                if u > belady_t:
                    nxt = u
                    break
            return (-nxt, i)
        raise AssertionError(p)

    # ---- admission, eviction, tiers ---------------------------------------------------
    def _admit(self, i: int, t: int) -> None:
        self.resident.add(i)
        self.tier[i] = HBM
        if self._wants_pin(i) and len(self.pinned) < self.pin_slots:
            self.pinned.add(i)
        self._on_insert(i, t)

    def _placement(self, i: int) -> str:
        if self.policy != "ema" or self.cfg.placement_mode != "thresholds":
            return CXL
        st = self.state[i]
        if self.int_mode:
            # READING: integer mode compares the Q0.16 score's value, score / 65536,
            # with evict_threshold (not with q16(evict_threshold): they differ when the
            # threshold rounds down, e.g. 0.15 → 9830 and a score of exactly 9830).
            return NVME if st["score"] / 65536 < self.cfg.evict_threshold else CXL
        return NVME if st["score"] < self.cfg.evict_threshold else CXL

    def _evict(self, protected: set[int], t: int, belady_t: int, moved: Counter) -> list[int]:
        over = len(self.resident) - self.capacity
        if over <= 0:
            if self.queues is not None:
                self.queues.end_op()
            return []
        base = self.resident - self.pinned
        if self.policy == "belady":
            cand = base  # bypass: may evict what it just read or wrote
        else:
            cand = base - protected
            # READING: "unless the batch (write) alone overflows" — when the entries
            # outside the batch cannot cover the overflow (pinned ones included), the
            # batch's entries compete too, on an equal footing.
            if len(cand) < over:
                cand = base
        if self.queues is not None:
            victims = self.queues.evict(set(cand), over)
        elif over == 1:
            victims = [min(cand, key=lambda i: self._evict_key(i, t, belady_t))]
        else:
            victims = sorted(cand, key=lambda i: self._evict_key(i, t, belady_t))[:over]
        for v in victims:
            dest = self._placement(v)
            self.resident.discard(v)
            self.tier[v] = dest
            if dest == CXL:
                moved["hbm->cxl"] += self.eb
                # READING: "arrived earliest" is measured in the batch time the policy
                # sees (Tick.time: a write carries the last read batch's time, so it ties
                # with that batch; Belady's −1 before any read), ties to the lower id.
                self.cxl_arrival[v] = belady_t if self.policy == "belady" else t
            else:
                moved["hbm->nvme"] += self.eb
            if not self.persistent:
                self.state.pop(v, None)
        return victims

    def _spill(self, moved: Counter) -> None:
        # CXL DRAM over its capacity: the earliest arrivals (ties: lower id) spill to NVMe.
        while len(self.cxl_arrival) > self.cxl_cap:
            v = min(self.cxl_arrival, key=lambda i: (self.cxl_arrival[i], i))
            del self.cxl_arrival[v]
            self.tier[v] = NVME
            moved["cxl->nvme"] += self.eb

    def _write(self, op: Op, moved: Counter) -> list[int]:
        t = max(self.batch_time, 0)  # a write carries the last read batch's time (0 before)
        # READING: a write of an entry already resident does not admit it again (queues).
        new = [i for i in sorted(op.ids) if i not in self.resident]
        for i in sorted(op.ids):
            moved["host->hbm"] += self.eb
            self._admit(i, t)
        if self.queues is not None:
            self.queues.admit(new)
        victims = self._evict(set(op.ids), t, self.batch_time, moved)
        self._spill(moved)
        return victims

    def _read(self, op: Op, moved: Counter) -> tuple[int, int, list[int]]:
        self.batch_time += 1
        t = self.batch_time
        ids = [i for i, _ in op.reads]
        hits = sum(1 for i in ids if i in self.resident)
        missed = sorted(i for i in ids if i not in self.resident)
        for i in missed:
            src = self.tier.get(i)
            if src == CXL:
                moved["cxl->hbm"] += self.eb
                del self.cxl_arrival[i]
            elif src == NVME:
                moved["nvme->hbm"] += self.eb
            else:
                raise AssertionError(f"entry {i} read before it was written")
            self._admit(i, t)
        if self.queues is not None:
            self.queues.admit(missed)
        for i, w in op.reads:
            self._on_access(i, w, t)
        victims = self._evict(set(ids), t, t, moved)
        self._spill(moved)
        return len(ids), hits, victims

    def run(self) -> dict[str, Any]:
        steps_seen: list[int] = []
        per_step: dict[int, dict[str, Any]] = {}
        victims: dict[int, Counter] = {}
        moved_at: list[tuple[int, Counter]] = []
        cur: int | None = None
        for op in self.ops:
            if op.kind == "lens":
                for ctx, tok in op.lens:
                    self.length[ctx] = max(self.length.get(ctx, 0), tok)
                continue
            if cur is not None and op.step != cur:
                self._end_step()  # the policy's end_step whenever the step changes
            cur = op.step
            for ctx, tok in op.lens:  # a length never shrinks
                self.length[ctx] = max(self.length.get(ctx, 0), tok)
            moved: Counter = Counter()
            if op.kind == "write":
                vs = self._write(op, moved)
            else:
                n, h, vs = self._read(op, moved)
                if n:
                    if op.step not in per_step:
                        per_step[op.step] = {"reads": 0, "hits": 0}
                        steps_seen.append(op.step)
                    per_step[op.step]["reads"] += n
                    per_step[op.step]["hits"] += h
            moved_at.append((op.step, moved))
            if vs:
                c = victims.setdefault(op.step, Counter())
                for v in vs:
                    c[self.idents[v]] += 1
        if cur is not None:
            self._end_step()  # ... and once after the last event

        # Bytes moved belong to the first read step at or after their event's step.
        # READING: bytes of events after the last read step belong to no read step.
        bytes_by_step = {s: dict.fromkeys(PAIRS, 0) for s in steps_seen}
        for s, moved in moved_at:
            target = next((r for r in steps_seen if r >= s), None)
            if target is None:
                continue
            for k, v in moved.items():
                bytes_by_step[target][k] += v

        reads = [per_step[s]["reads"] for s in steps_seen]
        hits = [per_step[s]["hits"] for s in steps_seen]
        bmoved = [bytes_by_step[s] for s in steps_seen]
        w = self.warmup
        total = dict.fromkeys(PAIRS, 0)
        for d in bmoved[w:]:
            for k in PAIRS:
                total[k] += d[k]
        return {
            "read_steps": steps_seen,
            "per_step": {"reads": reads, "hits": hits, "bytes_moved": bmoved},
            "victims": victims,
            "reads": sum(reads[w:]),
            "hits": sum(hits[w:]),
            "bytes_moved": total,
            "budget_entries": self.capacity,
        }


def _replay_class(policy: str) -> type:
    """Every tier rule (so the defaults are followed) for the policies it ranks; the queue
    policies keep the base rules, which are theirs under every setting: they are not
    scored (managed tiers leave them static) and rank CXL DRAM by arrival (as ``fifo``)."""
    return Replay if policy in QUEUE_POLICIES else TieredReplay


def replay_trace(
    records: list[tuple[int, int, int, int, int, float]],
    shape: Any,
    *,
    policy: str,
    budget_bytes: int,
    config: Any,
    cxl_entries: int | None = None,
    warmup_steps: int = 0,
    granularity: str = "layer",
    mode: str = "float",
) -> dict[str, Any]:
    """Replay trace records ``(step, context, layer, head, block, weight)``."""
    ops, idents = plan_trace(records, shape, granularity)
    return _replay_class(policy)(
        ops,
        idents,
        shape,
        policy=policy,
        budget_bytes=budget_bytes,
        config=config,
        cxl_entries=cxl_entries,
        warmup_steps=warmup_steps,
        mode=mode,
    ).run()


def replay_stream(
    stream: Any,
    *,
    policy: str,
    budget_bytes: int,
    config: Any,
    cxl_entries: int | None = None,
    warmup_steps: int = 0,
    granularity: str = "layer",
    mode: str = "float",
) -> dict[str, Any]:
    """Replay a compiled workload stream's events."""
    ops, idents = plan_stream(stream, granularity)
    return _replay_class(policy)(
        ops,
        idents,
        stream.shape,
        policy=policy,
        budget_bytes=budget_bytes,
        config=config,
        cxl_entries=cxl_entries,
        warmup_steps=warmup_steps,
        mode=mode,
    ).run()


# ==== Tiers below HBM and eviction passes (docs/policy.md, "Tiers below HBM" and "Engine
# semantics": eviction_passes, cxl_order, tier_management) — written from that page. ====
class TieredReplay(Replay):
    """:class:`Replay` with ``eviction_passes``, ``cxl_order`` and managed tiers (threshold
    and weighted placement; the EMA is the scored policy here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        self.managed = cfg.tier_management == "managed" and self.policy == "ema"
        self.weighted = cfg.placement_mode == "weighted"
        self.pending: Counter = Counter()  # a step boundary's moves, booked with the next event
        self.pending_victims: list[int] = []  # a step boundary's evictions (weighted)
        self.raised = 0  # bytes NVMe -> CXL DRAM (a pair the base books do not list)
        self.last_t = (0, -1)  # (t, belady_t) of the latest eviction: a spill ranks at it

    def _score(self, i: int) -> float:
        st = self.state.get(i) or self._fresh()
        # READING: integer mode compares score_q / 65536 with the thresholds (as placement).
        return st["score"] / 65536 if self.int_mode else st["score"]

    def _placement(self, i: int) -> str:
        return CXL if self.managed else super()._placement(i)

    def _p(self, i: int) -> float:
        """Weighted placement's P = wR·(1 − r) + wE·score + wN·anchor."""
        cfg = self.cfg
        st = self.state.get(i) or self._fresh()
        r = -math.expm1(-cfg.beta * st["idle"])
        anchor = 1.0 if self.idents[i][3] * self.bt < cfg.anchor_zone_size else 0.0
        w_r, w_e, w_n = cfg.placement_weights
        return w_r * (1.0 - r) + w_e * self._score(i) + w_n * anchor

    def _layer(self, i: int) -> int:
        """Which eviction layer (0 first) placement puts a resident entry in."""
        if not self.weighted:
            return 0 if self._score(i) < self.cfg.keep_threshold else 1
        low, high = self.cfg.placement_cuts
        p = self._p(i)
        return 0 if p < low else (1 if p < high else 2)

    def _leave(self, v: int, t: int, belady_t: int, moved: Counter) -> None:
        dest = self._placement(v)
        self.resident.discard(v)
        self.tier[v] = dest
        if dest == CXL:
            moved["hbm->cxl"] += self.eb
            self.cxl_arrival[v] = belady_t if self.policy == "belady" else t
        else:
            moved["hbm->nvme"] += self.eb
        if not self.persistent:
            # READING: dropped state restarts as a fresh entry's and keeps ageing at step
            # boundaries (a CXL DRAM entry's place in the policy's order depends on it).
            self.state[v] = self._fresh()

    def _evict(self, protected: set[int], t: int, belady_t: int, moved: Counter) -> list[int]:
        over = len(self.resident) - self.capacity
        if over <= 0:
            return []
        self.last_t = (t, belady_t)
        base = self.resident - self.pinned
        cand = base if self.policy == "belady" else base - protected
        if len(cand) < over:
            cand = base
        if self.managed:  # what placement wants in HBM goes only when the rest cannot
            layers = [set(), set(), set()]
            for i in cand:
                layers[self._layer(i)].add(i)
        else:
            layers = [cand]
        batched = self.cfg.eviction_passes == "batched"
        victims: list[int] = []
        left = over
        while left > 0:
            k = self.cfg.eviction_batch if batched else left
            chosen: list[int] = []
            for lay in layers:  # each pass ranks what is still resident when it begins
                rest = sorted(
                    (i for i in lay if i in self.resident),
                    key=lambda i: self._evict_key(i, t, belady_t),
                )
                chosen += rest[: k - len(chosen)]
                if len(chosen) == k:
                    break
            if not chosen:
                break
            for v in chosen:
                self._leave(v, t, belady_t, moved)
            victims += chosen
            left -= len(chosen)
        return victims

    def _spill_key(self, i: int) -> tuple:
        if self.cfg.cxl_order == "fifo":
            return (self.cxl_arrival[i], i)
        # The policy's own order; an entry whose state was forgotten ranks as a fresh one.
        fresh = i not in self.state
        if fresh:
            self.state[i] = self._fresh()
        key = self._evict_key(i, *self.last_t)
        if fresh:
            del self.state[i]
        return key

    def _spill(self, moved: Counter) -> None:
        while len(self.cxl_arrival) > self.cxl_cap:
            v = min(self.cxl_arrival, key=self._spill_key)
            del self.cxl_arrival[v]
            self.tier[v] = NVME
            moved["cxl->nvme"] += self.eb

    def _end_step(self) -> None:
        super()._end_step()
        budget = self.cfg.background_moves
        if not self.managed or budget == 0:
            return
        if self.weighted:
            # P < low wants CXL DRAM: such resident, unpinned entries leave HBM, lowest first.
            out = sorted(
                (i for i in self.resident - self.pinned if self._p(i) < self.cfg.placement_cuts[0]),
                key=lambda i: (self._p(i), i),
            )[:budget]
            t = max(self.batch_time, 0)
            self.last_t = (t, t)
            for v in out:
                self._leave(v, t, t, self.pending)
            self.pending_victims += out
            self._spill(self.pending)
            return
        ev = self.cfg.evict_threshold
        down = sorted(
            (i for i in self.cxl_arrival if self._score(i) < ev), key=lambda i: (self._score(i), i)
        )[:budget]
        for i in down:
            del self.cxl_arrival[i]
            self.tier[i] = NVME
            self.pending["cxl->nvme"] += self.eb
        room = self.cxl_cap - len(self.cxl_arrival)
        up = sorted(
            (i for i, tr in self.tier.items() if tr == NVME and self._score(i) >= ev),
            key=lambda i: (-self._score(i), i),
        )[: min(budget - len(down), room)]
        for i in up:
            self.cxl_arrival[i] = max(self.batch_time, 0)
            self.tier[i] = CXL
            self.raised += self.eb

    def _write(self, op: Op, moved: Counter) -> list[int]:
        moved.update(self.pending)
        self.pending.clear()
        before, self.pending_victims = self.pending_victims, []
        return before + super()._write(op, moved)

    def _read(self, op: Op, moved: Counter) -> tuple[int, int, list[int]]:
        moved.update(self.pending)
        self.pending.clear()
        before, self.pending_victims = self.pending_victims, []
        n, hits, victims = super()._read(op, moved)
        return n, hits, before + victims

    def run(self) -> dict[str, Any]:
        out = super().run()
        if self.pending and out["read_steps"]:  # the last boundary's: the last read step's
            k = len(out["read_steps"]) - 1
            for pair, v in self.pending.items():
                out["per_step"]["bytes_moved"][k][pair] += v
                if k >= self.warmup:
                    out["bytes_moved"][pair] += v
        if self.pending_victims:  # the last boundary's evictions: the last event's step
            c = out["victims"].setdefault(self.ops[-1].step, Counter())
            for v in self.pending_victims:
                c[self.idents[v]] += 1
        out["raised_bytes"] = self.raised
        return out


def replay_stream_tiered(
    stream: Any,
    *,
    policy: str,
    budget_bytes: int,
    config: Any,
    cxl_entries: int | None = None,
    warmup_steps: int = 0,
    granularity: str = "layer",
    mode: str = "float",
) -> dict[str, Any]:
    """:func:`replay_stream` with the tier rules of :class:`TieredReplay`."""
    ops, idents = plan_stream(stream, granularity)
    return TieredReplay(
        ops, idents, stream.shape, policy=policy, budget_bytes=budget_bytes, config=config,
        cxl_entries=cxl_entries, warmup_steps=warmup_steps, mode=mode,
    ).run()  # fmt: skip


# ==== Prefetch (docs/policy.md "Formulas: Prefetch", docs/simulator.md "Prefetch"),
# written from those pages. ====
class PrefetchReplay(TieredReplay):
    """:class:`TieredReplay` with ``--prefetch``: after each read batch its strongest touches
    propose neighbours in the next layers; the best non-resident ones come into HBM."""

    def __init__(
        self, *args: Any, limit: int = 64, prefixes: list[tuple[int, int, int]] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.limit = limit
        self.prefix = {c: (p, nb) for c, p, nb in prefixes}  # ctx -> (parent, shared blocks)
        self.by_ident = {ident: i for i, ident in enumerate(self.idents)}
        self.flagged: set[int] = set()  # prefetched, not read or evicted since
        self.prefetched: dict[int, list[int]] = {}  # step -> ids, in fetch order
        self.useful = self.wasted = 0

    def _lookup(self, ctx: int, layer: int, head: int, block: int) -> int | None:
        i = self.by_ident.get((ctx, layer, head, block))
        if i is not None and i in self.tier:  # an entry exists once it has been written
            return i
        if ctx in self.prefix:
            parent, nb = self.prefix[ctx]
            if block < nb:
                return self._lookup(parent, layer, head, block)
        return None

    def _rank(self, dist_blocks: int, i: int) -> float:
        cfg = self.cfg
        st = self.state.get(i) or self._fresh()
        score = st["score"] if self.policy == "ema" else 0.0
        if self.int_mode:
            b_rope = round(cfg.prefetch_blend[0] * 65536)
            rope = q16(1.0 / (1.0 + dist_blocks * self.bt / cfg.prefetch_distance_scale))
            return (b_rope * rope + (65536 - b_rope) * score + 32768) >> 16
        rope = 1.0 / (1.0 + dist_blocks * self.bt / cfg.prefetch_distance_scale)
        return cfg.prefetch_blend[0] * rope + cfg.prefetch_blend[1] * score

    def _read(self, op: Op, moved: Counter) -> tuple[int, int, list[int]]:
        for i, _ in op.reads:  # a prefetched entry read while resident was useful
            if i in self.flagged and i in self.resident:
                self.useful += 1
                self.flagged.discard(i)
        n, hits, victims = super()._read(op, moved)
        self._unflag(victims)
        cfg = self.cfg
        if cfg.prefetch_depth == 0:
            return n, hits, victims
        # READING: the strongest touches, ties to the lower entry id.
        touches = sorted(
            ((i, w) for i, w in op.reads if w >= cfg.touch_threshold), key=lambda r: (-r[1], r[0])
        )[: self.limit]
        wb = cfg.prefetch_window // self.bt
        best: dict[int, int] = {}  # candidate -> smallest distance in blocks
        for i, _ in touches:
            ctx, layer, head, block = self.idents[i]
            for dl in range(1, cfg.prefetch_depth + 1):
                for db in range(-wb, wb + 1):
                    if block + db < 0:
                        continue
                    c = self._lookup(ctx, layer + dl, head, block + db)
                    if c is None or c in self.resident:
                        continue
                    best[c] = min(best.get(c, abs(db)), abs(db))
        chosen = sorted(best, key=lambda c: (-self._rank(best[c], c), c))[: self.limit]
        if not chosen:
            return n, hits, victims
        t = self.batch_time
        for i in sorted(chosen):
            src = self.tier[i]
            moved["cxl->hbm" if src == CXL else "nvme->hbm"] += self.eb
            self.cxl_arrival.pop(i, None)
            self._admit(i, t)
        self.flagged |= set(chosen)
        self.prefetched.setdefault(op.step, []).extend(chosen)
        more = self._evict(set(chosen), t, t, moved)
        self._spill(moved)
        self._unflag(more)
        return n, hits, victims + more

    def _write(self, op: Op, moved: Counter) -> list[int]:
        victims = super()._write(op, moved)
        self._unflag(victims)  # a write's victims leave HBM too
        return victims

    def _unflag(self, victims: list[int]) -> None:
        for v in victims:
            if v in self.flagged:
                self.wasted += 1
                self.flagged.discard(v)

    def run(self) -> dict[str, Any]:
        out = super().run()
        total = sum(len(v) for v in self.prefetched.values())
        out["prefetched"] = self.prefetched
        out["prefetched_entries"] = total
        out["prefetch_useful"] = self.useful
        return out


def replay_stream_prefetch(
    stream: Any,
    *,
    policy: str,
    budget_bytes: int,
    config: Any,
    limit: int = 64,
    cxl_entries: int | None = None,
    warmup_steps: int = 0,
    granularity: str = "layer",
    mode: str = "float",
) -> dict[str, Any]:
    """:func:`replay_stream_tiered` with prefetch (``limit`` = ``--prefetch-limit``)."""
    ops, idents = plan_stream(stream, granularity)
    return PrefetchReplay(
        ops, idents, stream.shape, policy=policy, budget_bytes=budget_bytes, config=config,
        cxl_entries=cxl_entries, warmup_steps=warmup_steps, mode=mode, limit=limit,
        prefixes=[(int(c), int(p), int(b)) for c, p, b in stream.prefixes],
    ).run()  # fmt: skip
