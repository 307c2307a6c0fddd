"""Benchmark: one vectorised score update + victim selection over one S1 context.

One S1 context is 8,192 blocks × 640 KV-head queues = 5,242,880 entries.  Each run
records a dense step of attention weights, applies the EMA/idle update to every
entry (``end_step``), computes every entry's priority and selects one eviction
batch (64) and a large overflow (1/16 of the context) with the exact selection.
Figures are Measured wall-clock medians on this machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from .config import PolicyConfig
from .policies import make_policy
from .policies.base import Tick
from .select import select_victims
from .table import EntryTable

S1_BLOCKS = 8192
S1_QUEUES = 80 * 8


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_s1_step(quick: bool) -> dict:

    blocks = 512 if quick else S1_BLOCKS
    n = blocks * S1_QUEUES
    repeat = 3 if quick else 5
    rng = np.random.default_rng(0)
    table = EntryTable(block_tokens=16, capacity=n)
    q = np.arange(n, dtype=np.int64)
    table.append(0, q // (8 * blocks), (q // blocks) % 8, q % blocks)
    ids = np.arange(n, dtype=np.int64)
    weights = rng.random(n) / blocks
    out: dict = {"evidence": "Measured", "entries": n}
    for mode in ("float", "int"):
        policy = make_policy("ema", PolicyConfig(), table, mode=mode)
        policy.ensure(n)
        step = [0]

        def update(policy=policy, step=step) -> None:
            policy.on_access(ids, weights, Tick(step[0], step[0]))
            policy.end_step(Tick(step[0], step[0]))
            step[0] += 1

        def select(policy=policy, k: int = 64, step=step) -> None:
            select_victims(ids, policy.priority(ids, Tick(step[0], step[0])), k)

        update()  # warm: allocate, touch pages
        t_update = _median_time(update, repeat)
        t_sel64 = _median_time(select, repeat)
        t_sel_big = _median_time(lambda p=policy: select(p, n // 16), repeat)
        out[f"{mode}_score_update_ms"] = round(t_update * 1e3, 2)
        out[f"{mode}_select_64_ms"] = round(t_sel64 * 1e3, 2)
        out[f"{mode}_select_1_16th_ms"] = round(t_sel_big * 1e3, 2)
        out[f"{mode}_update_plus_select_64_ms"] = round((t_update + t_sel64) * 1e3, 2)
        out[f"{mode}_entry_updates_per_s"] = round(n / t_update)
    return out


def benches() -> dict[str, Callable[[bool], dict]]:
    return {"firmware.s1_score_update_and_selection": bench_s1_step}
