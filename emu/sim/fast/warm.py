"""Compile the fast engine's loops once, ahead of the first run (``kvcxl setup --only engine``).

numba compiles a policy's loop on its first call and keeps the machine code in
``$KVCXL_CACHE/fast/`` (docs/simulator.md, "Engines"); every later process loads it.  A
fresh machine would otherwise pay that compile inside its first command (`make demo`
compiles 15 policies' loops).  This replays a two-step stream through every (policy, mode)
the fast engine covers, in worker processes, so the cache holds each loop before any
figure is asked for.  Idempotent: a loop already cached loads in well under a second.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def _one(pair: tuple[str, str]) -> tuple[str, str, float]:
    from kvcxl.emu.shape import PRESETS
    from kvcxl.emu.sim.simulator import SimOptions, simulate
    from kvcxl.emu.workloads import compile_workload, make_workload

    policy, mode = pair
    stream = compile_workload(make_workload("zipf-sessions", PRESETS["ci"], seed=0), 2)
    t0 = time.perf_counter()
    simulate(
        stream,
        SimOptions(policy=policy, mode=mode, budget_bytes=stream.kv_bytes // 10, engine="fast"),
    )
    return policy, mode, time.perf_counter() - t0


def setup(force: bool = False) -> None:
    """Compile (or load) every covered (policy, mode) loop; ``force`` changes nothing
    (numba's cache is keyed by the sources: an edit compiles afresh by itself)."""
    from .compose import cache_dir, modules

    pairs = sorted(modules())
    jobs = min(len(pairs), os.cpu_count() or 1)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("forkserver")) as ex:
        for policy, mode, dt in ex.map(_one, pairs):
            print(f"  engine: {policy} ({mode}) ready in {dt:.1f} s", flush=True)
    print(
        f"engine: {len(pairs)} loops compiled or loaded in {time.perf_counter() - t0:.0f} s "
        f"(cache {cache_dir()})"
    )
