"""The timeline's figures (docs/timeline.md, "Outputs"): step times, utilisation, queueing,
prefetch lateness, write-back bytes and energy per token.  Simulated; energy prices the
simulated bytes with the Analytical model inputs of :data:`kvcxl.emu.serving.INPUTS`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics import linear_percentiles
from ..serving import INPUTS, nvme_pj_per_bit
from .engine import Schedule, ScheduleArrays
from .log import LogArrays, TransferLog
from .resources import MOVES, RESOURCE_NAMES, WRITE_BACKS, Resources

CLASS_NAMES = ("demand", "prefetch", "background")
#: Per move code: a write-back; a fetch into HBM.
_IS_WRITE_BACK = np.asarray([k in WRITE_BACKS for k in MOVES])
_IS_FETCH = np.asarray([k.endswith("->hbm") for k in MOVES])


def step_times(log: LogArrays, s: ScheduleArrays, n_steps: int) -> np.ndarray:
    """Per read step: the end of its last read record's compute minus the previous step's."""
    last = np.zeros(n_steps, np.float64)
    seen = np.zeros(n_steps, bool)
    np.maximum.at(last, log.pos[log.read], s.c[log.read])
    seen[log.pos[log.read]] = True
    # a read step without a read record (none in practice) takes no time
    ends = np.maximum.accumulate(np.where(seen, last, 0.0))
    return np.diff(np.concatenate([[0.0], ends]))


def report(
    log: TransferLog | LogArrays,
    s: Schedule | ScheduleArrays,
    res: Resources,
    n_steps: int,
    warm: int,
    wasted_entries: int,
) -> dict[str, Any]:
    """Every figure of the timeline over one schedule; ``warm`` read steps excluded from
    tokens/s and the step statistics (utilisation, delays and bytes cover the whole run).
    The engine's objects or their array forms (the fast engine's): the same figures."""
    if isinstance(log, TransferLog):
        log = log.arrays()
    if isinstance(s, Schedule):
        s = s.arrays()
    eb = log.entry_bytes
    step_ns = step_times(log, s, n_steps)
    tokens = np.zeros(n_steps, np.int64)
    np.add.at(tokens, log.pos[log.read], log.tokens[log.read])
    m_ns, m_tok = step_ns[warm:], tokens[warm:]
    h = s.horizon_ns
    servers = res.servers()
    busy = dict(zip(RESOURCE_NAMES, s.busy_ns.tolist(), strict=True))
    nbytes = dict(zip(RESOURCE_NAMES, s.bytes.tolist(), strict=True))
    util = {k: (busy[k] / (servers[k] * h) if h > 0 else 0.0) for k in servers}
    over = {k: u for k, u in util.items() if u > 1.0 + 1e-9}
    if over:  # a server holds one stage at a time: never, unless the scheduler is wrong
        raise RuntimeError(f"timeline utilisation above 1: {over}")
    st_cls = s.tr_cls[s.st_transfer]
    wait = s.st_start - s.st_ready
    queue = {}
    for code, c in enumerate(CLASS_NAMES):
        a = wait[st_cls == code]
        queue[c] = {
            "stages": int(a.size),
            "mean_ns": float(a.mean()) if a.size else 0.0,
            "p99_ns": float(linear_percentiles(a, (99,))[0]) if a.size else 0.0,
            "total_ns": float(a.sum()),
        }
    # entries a read waits for whose prefetch arrives after the read's request time
    waiter = np.repeat(np.arange(log.read.size), np.diff(log.wait_off))
    arrival = s.pf_arrival[log.wait_rec]
    arrival[np.isnan(arrival)] = 0.0  # (a record without prefetch: arrived at 0)
    late = int(log.wait_n[arrival > s.a[waiter]].sum())
    entries = s.tr_entries
    wb = int(entries[_IS_WRITE_BACK[s.tr_move]].sum()) * eb
    fetched = int(entries[(s.tr_cls == 1) & _IS_FETCH[s.tr_move]].sum()) * eb
    link = INPUTS["link_pj_per_bit"].value
    pj = {"link_rd": link, "link_wr": link, "dram": INPUTS["dram_pj_per_bit"].value,
          "nvme": nvme_pj_per_bit(res.nvme_gbps)}  # fmt: skip
    device_j = sum(nbytes[k] * 8 * pj[k] for k in pj) * 1e-12
    # The GPU's time is its steps' (docs/serving.md): the transfers that run past the last
    # compute (a step boundary's background moves) cost the device, not the GPU.
    gpu_j = INPUTS["gpu_power_w"].value * float(step_ns.sum()) * 1e-9
    all_tokens = int(tokens.sum())
    total = float(m_ns.sum())
    c_read = s.c[log.read]
    return {
        "evidence": "Simulated",
        "step_ns": step_ns.tolist(),
        "tokens_per_s": float(m_tok.sum()) / (total * 1e-9) if total > 0 else None,
        "horizon_ns": h,
        "compute_end_ns": float(c_read.max()) if c_read.size else 0.0,
        "utilisation": util,
        "busy_ns": busy,
        "bytes": nbytes,
        "queueing": queue,
        "transfers": int(entries.size),
        "late_prefetch_bytes": late * eb,
        "wasted_prefetch_bytes": int(wasted_entries) * eb,
        "prefetched_bytes": fetched,
        "write_back_bytes": wb,
        "energy_mj_per_token": (gpu_j + device_j) / all_tokens * 1e3 if all_tokens else None,
        "energy_evidence": "Simulated bytes × Analytical model inputs (docs/serving.md)",
    }
