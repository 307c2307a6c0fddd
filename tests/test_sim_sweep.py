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
