"""The timeline's scheduler: a discrete-event loop over the transfer log (docs/timeline.md).

Records are served in order by the compute chain; every transfer they issue runs its
stages on the resources (servers with a bandwidth), non-preemptively, in the order
(class, ready time, transfer number, stage number).  Decisions at an instant are taken
after everything else at that instant.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from .log import BACKGROUND_MOVES, EVICT_MOVES, FETCH_MOVES, TransferLog
from .resources import (
    BACKGROUND,
    CXL_NVME,
    DEMAND,
    MOVES,
    PREFETCH,
    RESOURCE_NAMES,
    Resources,
    stages,
)  # fmt: skip

#: The class of a record's fetches and write-backs by the role of the transfer; a CXL ->
#: NVMe spill and a step boundary's moves are always background.
ROLE_CLASS = {"demand": DEMAND, "prefetch": PREFETCH, "background": BACKGROUND}
_READY, _END, _TIMER = 0, 1, 2


@dataclass
class Schedule:
    """When everything happened (ns).  Per transfer: record, move, class, entries, issue,
    end; per stage: transfer, stage number, resources, ready, start, end; per record: the
    request time ``a``, data-ready time ``r`` and compute end ``c`` (None for a write),
    the prefetch arrival of each read record that prefetched."""

    transfers: list[dict] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)
    a: list[float | None] = field(default_factory=list)
    r: list[float | None] = field(default_factory=list)
    c: list[float | None] = field(default_factory=list)
    pf_arrival: dict[int, float] = field(default_factory=dict)
    busy_ns: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    horizon_ns: float = 0.0

    def arrays(self) -> ScheduleArrays:
        """The schedule as arrays (the form the compiled scheduler gives)."""
        tr, st = self.transfers, self.stages
        nan = float("nan")
        pf = np.full(len(self.a), nan)
        for j, x in self.pf_arrival.items():
            pf[j] = x
        return ScheduleArrays(
            np.asarray([x["record"] for x in tr], np.int64),
            np.asarray([MOVES.index(x["move"]) for x in tr], np.int64),
            np.asarray([x["cls"] for x in tr], np.int64),
            np.asarray([x["entries"] for x in tr], np.int64),
            np.asarray([x["issue"] for x in tr], np.float64),
            np.asarray([x["end"] for x in tr], np.float64),
            np.asarray([x["transfer"] for x in st], np.int64),
            np.asarray([x["stage"] for x in st], np.int64),
            np.asarray([x["ready"] for x in st], np.float64),
            np.asarray([x["start"] for x in st], np.float64),
            np.asarray([x["end"] for x in st], np.float64),
            *(np.asarray([nan if v is None else v for v in x], np.float64)
              for x in (self.a, self.r, self.c)),
            pf,
            np.asarray([self.busy_ns[k] for k in RESOURCE_NAMES], np.float64),
            np.asarray([self.bytes[k] for k in RESOURCE_NAMES], np.int64),
            float(self.horizon_ns),
        )  # fmt: skip


@dataclass
class ScheduleArrays:
    """A schedule as arrays: per transfer (record, move code of
    :data:`~.resources.MOVES`, class, entries, issue, end); per stage, ordered by (transfer,
    stage), (transfer, stage, ready, start, end); per record a, r, c and its prefetch's
    arrival (NaN: a write record / no prefetch); per resource of
    :data:`~.resources.RESOURCE_NAMES` busy server-ns and bytes; the horizon."""

    tr_record: NDArray
    tr_move: NDArray
    tr_cls: NDArray
    tr_entries: NDArray
    tr_issue: NDArray
    tr_end: NDArray
    st_transfer: NDArray
    st_stage: NDArray
    st_ready: NDArray
    st_start: NDArray
    st_end: NDArray
    a: NDArray
    r: NDArray
    c: NDArray
    pf_arrival: NDArray
    busy_ns: NDArray
    bytes: NDArray
    horizon_ns: float


class _Loop:
    def __init__(self, log: TransferLog, res: Resources) -> None:
        self.log, self.res, self.eb = log, res, log.entry_bytes
        self.free = res.servers()
        self.gbps = res.gbps()
        self.s = Schedule(busy_ns=dict.fromkeys(self.free, 0.0), bytes=dict.fromkeys(self.free, 0))
        n = len(log.records)
        self.s.a, self.s.r, self.s.c = [None] * n, [None] * n, [None] * n
        self.heap: list = []
        self.seq = 0
        self.waiting: list[tuple] = []
        self.plan: list[list] = []  # per transfer: its stages
        self.ended: list[bool] = []
        # the compute chain
        self.i, self.state, self.compute_end = 0, "idle", 0.0
        self.gate: list[int] = []
        self.pending_wb: list[int] = []
        self.group: dict[int, list[int]] = {}

    def push(self, t: float, kind: int, payload: tuple) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, payload))
        self.seq += 1

    def issue(self, t: float, rec: int, move: str, entries: int, cls: int) -> int:
        tid = len(self.plan)
        st = stages(move, entries, self.res)
        self.plan.append(st)
        self.ended.append(False)
        self.s.transfers.append({"record": rec, "move": move, "cls": cls, "entries": entries,
                                 "issue": t, "end": None})  # fmt: skip
        self.push(t + st[0][0], _READY, (tid, 0))
        return tid

    def issue_moves(self, t: float, rec: int, moves: dict[str, int], keys, role: str) -> list:
        """Issue ``moves`` in ``keys`` order; returns the fetches' and write-backs' numbers
        (a background transfer gates nothing)."""
        gated = []
        for k in keys:
            n = moves.get(k, 0)
            if n:
                cls = BACKGROUND if k == CXL_NVME else ROLE_CLASS[role]
                tid = self.issue(t, rec, k, n, cls)
                if cls != BACKGROUND:
                    gated.append(tid)
        return gated

    def advance(self, t: float) -> None:
        """Move the compute chain on as far as it goes at ``t``."""
        recs, s = self.log.records, self.s
        while True:
            if self.state == "compute":
                if t < self.compute_end:
                    return
                self.state = "idle"
            if self.state == "idle":
                if self.i == len(recs):
                    return
                rec = recs[self.i]
                if not rec.read:
                    self.pending_wb += self.issue_moves(t, self.i, rec.evict, EVICT_MOVES, "demand")
                    self.issue_moves(t, self.i, rec.background, BACKGROUND_MOVES, "background")
                    self.i += 1
                    continue
                s.a[self.i] = t
                g = self.issue_moves(t, self.i, rec.demand, FETCH_MOVES, "demand")
                g += self.issue_moves(t, self.i, rec.evict, EVICT_MOVES, "demand")
                g += self.pending_wb
                for j, _n in rec.waits:
                    g += self.group.get(j, [])
                self.gate, self.pending_wb, self.state = g, [], "gate"
            if self.state == "gate":
                if not all(self.ended[x] for x in self.gate):
                    return
                rec = recs[self.i]
                s.r[self.i] = t
                grp = self.issue_moves(t, self.i, rec.prefetch, FETCH_MOVES + EVICT_MOVES,
                                       "prefetch")  # fmt: skip
                if grp:
                    self.group[self.i] = grp
                self.compute_end = t + rec.compute_ns
                s.c[self.i] = self.compute_end
                self.push(self.compute_end, _TIMER, ())
                self.state = "compute"
                self.i += 1

    def handle(self, t: float, kind: int, payload: tuple) -> None:
        if kind == _READY:
            tid, k = payload
            self.waiting.append((self.s.transfers[tid]["cls"], t, tid, k))
        elif kind == _END:
            tid, k, held = payload
            for name in held:
                self.free[name] += 1
            if k + 1 < len(self.plan[tid]):
                self.push(t + self.plan[tid][k + 1][0], _READY, (tid, k + 1))
            else:
                self.ended[tid] = True
                self.s.transfers[tid]["end"] = t

    def dispatch(self, t: float) -> None:
        self.waiting.sort()
        keep = []
        for item in self.waiting:
            _cls, ready, tid, k = item
            held = self.plan[tid][k][1]
            if all(self.free[name] > 0 for name in held):
                nbytes = self.s.transfers[tid]["entries"] * self.eb
                dur = nbytes / min(self.gbps[name] for name in held)
                for name in held:
                    self.free[name] -= 1
                    self.s.busy_ns[name] += dur
                    self.s.bytes[name] += nbytes
                self.s.stages.append({"transfer": tid, "stage": k, "resources": held,
                                      "ready": ready, "start": t, "end": t + dur})  # fmt: skip
                self.push(t + dur, _END, (tid, k, held))
            else:
                keep.append(item)
        self.waiting = keep

    def run(self) -> Schedule:
        t = 0.0
        while True:
            while True:
                while self.heap and self.heap[0][0] == t:
                    _t, _seq, kind, payload = heapq.heappop(self.heap)
                    self.handle(t, kind, payload)
                self.advance(t)
                if not (self.heap and self.heap[0][0] == t):
                    break
            self.dispatch(t)
            if not self.heap:
                break
            t = self.heap[0][0]
        if self.i != len(self.log.records) or self.waiting:
            raise RuntimeError("timeline ended with records or stages unserved")
        s = self.s
        for j, grp in self.group.items():
            s.pf_arrival[j] = max(s.transfers[x]["end"] for x in grp)
        ends = [x["end"] for x in s.transfers] + [c for c in s.c if c is not None]
        s.horizon_ns = max(ends, default=0.0)
        s.stages.sort(key=lambda x: (x["transfer"], x["stage"]))
        return s


def run(log: TransferLog, res: Resources) -> Schedule:
    """Schedule every transfer of ``log`` on ``res`` (docs/timeline.md)."""
    return _Loop(log, res).run()
