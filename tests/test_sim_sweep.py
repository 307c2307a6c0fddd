"""Sweeps give the same numbers serially, on local processes and on a Dask LocalCluster."""

from __future__ import annotations

import pytest

from kvcxl.emu.sim.sweep import SweepSpec, combine, run_sweep


def _spec() -> SweepSpec:
    return SweepSpec(
        workload="multi-turn", steps=12, seeds=[0, 1], policies=["lru", "ema"],
        budgets=["15%"], variants=[{}, {"alpha": 0.05}], audit=True,
    )  # fmt: skip


def _key(rows):
    return sorted((r["policy"], str(r["variant"]), r["hits"], r["reads"]) for r in rows)


def test_process_pool_matches_serial():
    serial = combine(run_sweep(_spec(), backend="serial"))
    pool = combine(run_sweep(_spec(), backend="process", jobs=2))
    assert _key(serial) == _key(pool)
    assert len(serial) == 4 and all(r["seeds"] == 2 for r in serial)
    assert all(r["wrong_victims"] == 0 for r in serial)


@pytest.mark.slow
def test_dask_local_cluster_matches_serial():
    pytest.importorskip("dask.distributed")
    serial = combine(run_sweep(_spec(), backend="serial"))
    dask = combine(run_sweep(_spec(), backend="dask"))
    assert _key(serial) == _key(dask)


def test_bad_spec_refused_before_work():
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        run_sweep(SweepSpec(workload="nope"))
    with pytest.raises(ValueError, match="belady is the demand-paging optimum"):
        run_sweep(SweepSpec(policies=["belady"], prefetch=True))
    with pytest.raises(ValueError, match="backend 'mpi'"):
        run_sweep(_spec(), backend="mpi")


def test_batched_sweeps_give_each_sweeps_rows() -> None:
    """run_sweeps compiles each (stream, seed) once for every spec sharing it; its rows are
    run_sweep's, spec by spec, in the same order (seeds, variants, budgets, policies)."""
    from kvcxl.emu.sim.sweep import SweepSpec, run_sweep, run_sweeps

    common = dict(workload="multi-turn", steps=8, seeds=[0, 1], budgets=["10%", "30%"])
    specs = [
        SweepSpec(policies=["lru", "ema"], **common),
        SweepSpec(policies=["ema"], variants=[{"alpha": 0.05}, {"alpha": 0.5}], **common),
        SweepSpec(policies=["lfu"], read="topk:2", **common),  # another stream
    ]
    batched = run_sweeps(specs, backend="serial")
    for spec, got in zip(specs, batched, strict=True):
        want = run_sweep(spec, backend="serial")
        assert [(r["seed"], r["policy"], r["budget"], r["variant"], r["hits"]) for r in got] == [
            (r["seed"], r["policy"], r["budget"], r["variant"], r["hits"]) for r in want
        ]


def test_results_tables_order_ties_by_name() -> None:
    """Policies with equal hit rates are listed by name, whatever order the rows and the
    string hashing of the process give them (a set's order changes with PYTHONHASHSEED), so
    two regenerations of docs/results.md are equal."""
    import os
    import subprocess
    import sys

    code = """
from kvcxl.emu.sim.sweep import render_markdown
def row(p, hit):
    return {"question": "ranking", "workload": "w", "policy": p, "budget": "10%",
            "variant": {}, "hit_rate": hit, "hit_rate_ci95": 0.0}
pols = ["sink-window", "belady", "h2o", "lru", "fifo", "random"]
doc = {"rows": [row(p, 0.1 if p in ("lru", "fifo") else 0.5) for p in pols],
       "budgets": ["10%"], "engine": "fast"}
lines = [ln for ln in render_markdown(doc).splitlines() if ln.startswith("| ")]
print(" ".join(ln.split(" | ")[0][2:] for ln in lines[1:7]))
"""
    seen = set()
    for seed in range(6):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
        seen.add(out.stdout.strip())
    assert seen == {"belady h2o random sink-window fifo lru"}
