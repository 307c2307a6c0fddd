"""What the guest agent replays: a read stream laid out in the device's trace area.

A :class:`kvcxl.emu.workloads.stream.ReadStream` (from a trace file or a synthetic
workload) becomes a list of events the agent sends through the ring in order —
CTX_LEN (context lengths), CREATE (new entries written to HBM), READ (one layer of
a decode step with its attention weights) — with the same batching the simulator
uses, so the firmware sees exactly the calls the simulator makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcxl.cxl import ring as L
from kvcxl.emu.shape import PRESETS
from kvcxl.emu.sim.simulator import SimOptions, simulate
from kvcxl.emu.trace import Trace
from kvcxl.emu.workloads import make_workload
from kvcxl.emu.workloads.stream import compile_workload, from_trace
from kvcxl.firmware.config import PolicyConfig

DEFAULT_WORKLOAD = "zipf-sessions"
DEFAULT_PARAMS = {"sessions": 12, "lanes": 2}
DEFAULT_STEPS = 24
DEFAULT_CONTEXT_TOKENS = 512
DEFAULT_BUDGET = 0.25  # HBM stand-in holds this fraction of all entries


@dataclass
class GuestTrace:
    stream: object  # ReadStream
    capacity: int  # HBM entries
    seed: int = 0x4B56
    source: str = ""

    @property
    def entry_bytes(self) -> int:
        return int(self.stream.shape.entry_bytes)

    @property
    def n_entries(self) -> int:
        return int(self.stream.n_entries)

    def budget_bytes(self) -> int:
        return self.capacity * self.entry_bytes


def default_trace(steps: int = DEFAULT_STEPS, seed: int = 1) -> GuestTrace:
    """The built-in trace: Zipf returns over 12 sessions on the ``ci`` model shape."""
    shape = PRESETS["ci"].with_(context_tokens=DEFAULT_CONTEXT_TOKENS)
    w = make_workload(DEFAULT_WORKLOAD, shape, seed=seed, **DEFAULT_PARAMS)
    stream = compile_workload(w, steps)
    cap = max(1, int(DEFAULT_BUDGET * stream.n_entries))
    src = f"{DEFAULT_WORKLOAD} {DEFAULT_PARAMS} seed {seed}, {steps} steps, shape ci/512"
    return GuestTrace(stream, cap, source=src)


def load_trace(path: str | Path, budget: float = DEFAULT_BUDGET) -> GuestTrace:
    """A trace file (kvcxl trace format, docs/trace-format.md) as a guest trace."""
    if not 0 < budget <= 1:
        raise ValueError(f"budget = {budget}: must be a fraction of the entries in (0, 1]")
    stream = from_trace(Trace.load(path))
    cap = max(1, int(budget * stream.n_entries))
    return GuestTrace(stream, cap, source=str(path))


def events(gt: GuestTrace) -> list[tuple[int, int, int, np.ndarray]]:
    """(kind, step, layer, records) in the order the agent sends them."""
    s = gt.stream
    out: list[tuple[int, int, int, np.ndarray]] = []
    for a in range(s.n_events):
        step, layer = int(s.ev_step[a]), int(s.ev_layer[a])
        lo, hi = int(s.len_off[a]), int(s.len_off[a + 1])
        if hi > lo:
            rec = np.zeros(hi - lo, L.CTX_LEN_REC)
            rec["ctx"], rec["tokens"] = s.len_ctx[lo:hi], s.len_tokens[lo:hi]
            out.append((L.EV_CTX_LEN, step, layer, rec))
        ids = s.ids[int(s.ev_off[a]) : int(s.ev_off[a + 1])]
        if s.ev_kind[a] == 0:  # CREATE
            if ids.size == 0:
                continue
            rec = np.zeros(ids.size, L.CREATE_REC)
            rec["entry"] = ids
            rec["ctx"], rec["layer"] = s.e_ctx[ids], s.e_layer[ids]
            rec["head"], rec["block"] = s.e_head[ids], s.e_block[ids]
            out.append((L.EV_CREATE, step, layer, rec))
        else:
            rec = np.zeros(ids.size, L.ATTN_REC)
            rec["entry"] = ids
            rec["weight"] = s.w[int(s.ev_off[a]) : int(s.ev_off[a + 1])]
            out.append((L.EV_READ, step, layer, rec))
    return out


_LIMITS = {L.EV_CREATE: L.CREATE_MAX, L.EV_READ: L.ATTN_MAX, L.EV_CTX_LEN: L.CTX_LEN_MAX}
_NAMES = {L.EV_CREATE: "CREATE", L.EV_READ: "READ", L.EV_CTX_LEN: "CTX_LEN"}


def encode(gt: GuestTrace, media_bytes: int) -> bytes:
    """The trace area's bytes; a clear error when the trace does not fit the device."""
    evs = events(gt)
    for kind, step, _layer, rec in evs:
        if rec.size > _LIMITS[kind]:
            raise ValueError(
                f"a {_NAMES[kind]} event of step {step} has {rec.size} records; the ring takes "
                f"at most {_LIMITS[kind]} per command (use fewer lanes or shorter contexts)"
            )
        if kind == L.EV_READ and rec.size and float(rec["weight"].max()) > 1:
            # the ring's ATTN takes the Attention Report's weights, within [0, 1]
            raise ValueError(
                f"a READ event of step {step} has a weight of {float(rec['weight'].max()):g}; "
                "the ring takes attention weights within [0, 1]"
            )
    eb = gt.entry_bytes
    if eb % 64:
        raise ValueError(f"entry size {eb} B is not a multiple of the 64-byte line")
    need = L.KV_BASE + gt.n_entries * eb + (4 << 20)  # + the bench's 4 MiB at the top
    if need > media_bytes:
        raise ValueError(
            f"the trace's {gt.n_entries} entries of {eb} B need a {need >> 20} MiB device; "
            f"the device has {media_bytes >> 20} MiB (raise --device-mib)"
        )
    batches = np.zeros(len(evs), L.TRACE_BATCH)
    off = L.TRACE_HDR_FMT.size + batches.nbytes
    chunks = []
    for i, (kind, step, layer, rec) in enumerate(evs):
        batches[i] = (step, layer & 0xFFFF, kind, rec.size, off)  # layer −1: not per layer
        chunks.append(rec.tobytes())
        off += rec.nbytes
    if off > L.TRACE_SIZE:
        raise ValueError(f"the trace needs {off} B; the trace area holds {L.TRACE_SIZE} B")
    n_records = int(sum(r.size for k, _, _, r in evs if k == L.EV_READ))
    hdr = L.TRACE_HDR_FMT.pack(
        L.TRACE_MAGIC,
        1,
        L.TRACE_HDR_FMT.size,
        gt.n_entries,
        len(evs),
        eb,
        gt.capacity,
        n_records,
        gt.seed,
        int(gt.stream.shape.block_tokens),
    )
    return hdr + batches.tobytes() + b"".join(chunks)


def simulate_victims(
    gt: GuestTrace, policy: str = "ema", config: object = None, mode: str = "float"
) -> list[int]:
    """The victim sequence of the simulator of kvcxl.emu on the same stream and budget."""
    opts = SimOptions(
        policy=policy,
        budget_bytes=gt.budget_bytes(),
        config=config or PolicyConfig(),
        record_victims=True,
        audit=True,
        mode=mode,
    )
    res = simulate(gt.stream, opts)
    return [int(i) for ids, _prio, _step in res["_victims"] for i in ids]
