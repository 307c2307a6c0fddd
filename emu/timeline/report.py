"""The timeline's figures (docs/timeline.md, "Outputs"): step times, utilisation, queueing,
prefetch lateness, write-back bytes and energy per token.  Simulated; energy prices the
simulated bytes with the Analytical model inputs of :data:`kvcxl.emu.serving.INPUTS`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics import linear_percentiles
from ..serving import INPUTS, nvme_pj_per_bit
from .engine import Schedule
from .log import TransferLog
from .resources import WRITE_BACKS, Resources

CLASS_NAMES = ("demand", "prefetch", "background")


def step_times(log: TransferLog, s: Schedule, n_steps: int) -> np.ndarray:
    """Per read step: the end of its last read record's compute minus the previous step's."""
    last = np.zeros(n_steps, np.float64)
    seen = np.zeros(n_steps, bool)
    for i, rec in enumerate(log.records):
        if rec.read:
            last[rec.pos] = max(last[rec.pos], s.c[i])
            seen[rec.pos] = True
    # a read step without a read record (none in practice) takes no time
    ends = np.maximum.accumulate(np.where(seen, last, 0.0))
    return np.diff(np.concatenate([[0.0], ends]))


def report(
    log: TransferLog, s: Schedule, res: Resources, n_steps: int, warm: int, wasted_entries: int
) -> dict[str, Any]:
    """Every figure of the timeline over one schedule; ``warm`` read steps excluded from
    tokens/s and the step statistics (utilisation, delays and bytes cover the whole run)."""
    eb = log.entry_bytes
    step_ns = step_times(log, s, n_steps)
    tokens = np.zeros(n_steps, np.int64)
    for rec in log.records:
        if rec.read:
            tokens[rec.pos] += rec.tokens
    m_ns, m_tok = step_ns[warm:], tokens[warm:]
    h = s.horizon_ns
    servers = res.servers()
    util = {k: (s.busy_ns[k] / (servers[k] * h) if h > 0 else 0.0) for k in servers}
    over = {k: u for k, u in util.items() if u > 1.0 + 1e-9}
    if over:  # a server holds one stage at a time: never, unless the scheduler is wrong
        raise RuntimeError(f"timeline utilisation above 1: {over}")
    delays: dict[str, list[float]] = {c: [] for c in CLASS_NAMES}
    for st in s.stages:
        delays[CLASS_NAMES[s.transfers[st["transfer"]]["cls"]]].append(st["start"] - st["ready"])
    queue = {}
    for c, d in delays.items():
        a = np.asarray(d)
        queue[c] = {
            "stages": int(a.size),
            "mean_ns": float(a.mean()) if a.size else 0.0,
            "p99_ns": float(linear_percentiles(a, (99,))[0]) if a.size else 0.0,
            "total_ns": float(a.sum()),
        }
    late = 0
    for i, rec in enumerate(log.records):
        for j, n in rec.waits:
            if s.pf_arrival.get(j, 0.0) > s.a[i]:
                late += n
    wb = sum(x["entries"] for x in s.transfers if x["move"] in WRITE_BACKS) * eb
    link = INPUTS["link_pj_per_bit"].value
    pj = {"link_rd": link, "link_wr": link, "dram": INPUTS["dram_pj_per_bit"].value,
          "nvme": nvme_pj_per_bit(res.nvme_gbps)}  # fmt: skip
    device_j = sum(s.bytes[k] * 8 * pj[k] for k in pj) * 1e-12
    gpu_j = INPUTS["gpu_power_w"].value * h * 1e-9
    all_tokens = int(tokens.sum())
    total = float(m_ns.sum())
    return {
        "evidence": "Simulated",
        "step_ns": step_ns.tolist(),
        "tokens_per_s": float(m_tok.sum()) / (total * 1e-9) if total > 0 else None,
        "horizon_ns": h,
        "compute_end_ns": max((c for c in s.c if c is not None), default=0.0),
        "utilisation": util,
        "busy_ns": dict(s.busy_ns),
        "bytes": dict(s.bytes),
        "queueing": queue,
        "transfers": len(s.transfers),
        "late_prefetch_bytes": late * eb,
        "wasted_prefetch_bytes": int(wasted_entries) * eb,
        "prefetched_bytes": sum(
            x["entries"] for x in s.transfers if x["cls"] == 1 and x["move"].endswith("->hbm")
        )
        * eb,
        "write_back_bytes": wb,
        "energy_mj_per_token": (gpu_j + device_j) / all_tokens * 1e3 if all_tokens else None,
        "energy_evidence": "Simulated bytes × Analytical model inputs (docs/serving.md)",
    }
