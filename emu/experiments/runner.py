"""Runs experiments: every (case, seed) once, on local processes or a Dask cluster, with a
progress bar and resumable output (docs/validation.md, "Running, resuming").

Each finished run is appended at once as one JSON line to ``OUT/NAME-SCALE.jsonl`` under
its key — experiment, case, seed and the code fingerprint — and a run that finds its key
there is skipped, so a killed run continues where it stopped and a change to the code
that makes the numbers (:func:`fingerprint`) runs everything again.  Runs of one workload
and seed are one task, so its streams are compiled once for every experiment.

Seed policy: seed s (0 … N−1) of every case is workload seed s (numpy's PCG64, the same
on every machine); every arm of a case and every case of a scale replays the same N
streams, so the comparisons between arms are paired.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from . import EXPERIMENTS, get

Task = list[tuple[str, dict[str, Any], int]]  # (experiment, case, seed) sharing one stream

# What makes the numbers: the firmware, the simulator, workloads, timing, shapes and the
# experiments' shared replay; with each experiment's ``run`` (its arms) and its cases.
# Any change to these runs every (case, seed) again; a change to a report does not.
_SOURCES = ("firmware", "emu/sim", "emu/workloads", "emu/experiments/_common.py",
            "emu/timing.py", "emu/shape.py", "common/sizes.py", "emu/timeline",
            "emu/serving.py")  # fmt: skip


def _root() -> Path:
    return Path(__file__).resolve().parents[2]


def fingerprint(name: str | None = None) -> str:
    """12 hex digits of SHA-256 over the sources that make the numbers (sorted by path) and
    the ``run`` method of experiment ``name``."""
    root, h = _root(), hashlib.sha256()
    if name is not None:
        h.update(inspect.getsource(type(get(name)).run).encode())
    files: list[Path] = []
    for s in _SOURCES:
        p = root / s
        files += sorted(p.rglob("*.py")) + sorted(p.rglob("*.toml")) if p.is_dir() else [p]
    for f in sorted(files):
        if "__pycache__" in f.parts:
            continue
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def key(name: str, case: dict[str, Any], seed: int, fp: str) -> str:
    return json.dumps([name, case, seed, fp], sort_keys=True)


def out_file(out: Path, name: str, scale: str) -> Path:
    return out / f"{name}-{scale}.jsonl"


def load(path: Path) -> dict[str, dict[str, Any]]:
    """Rows already in ``path`` by key; a line cut short by a killed run is ignored."""
    done: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
                done[rec["key"]] = rec["row"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return done


def _append(path: Path) -> Any:
    """``path`` open for appending lines, after ending a line a killed run cut short."""
    cut = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    f = path.open("a")
    if cut:
        f.write("\n")
    return f


def run_task(task: Task) -> list[dict[str, Any]]:
    """Every run of one task, as report rows ``{**case, "seed": s, **metrics}``."""
    return [{**case, "seed": seed, **get(name).run(case, seed)} for name, case, seed in task]


def plan(
    names: list[str], scale: str, seeds: int, out: Path, fps: dict[str, str]
) -> tuple[list[Task], dict[str, dict[str, dict[str, Any]]], int]:
    """The tasks still to run (grouped by workload and seed), what is done, and the total."""
    groups: dict[tuple[str, int], Task] = {}
    done: dict[str, dict[str, dict[str, Any]]] = {}
    total = 0
    for name in names:
        exp = get(name)
        have = load(out_file(out, name, scale))
        done[name] = {}
        for case in exp.cases(scale):
            for s in range(seeds):
                total += 1
                k = key(name, case, s, fps[name])
                if k in have:
                    done[name][k] = have[k]
                else:
                    groups.setdefault((case["workload"], s), []).append((name, case, s))
    return list(groups.values()), done, total


def _completed(
    tasks: list[Task], jobs: int, backend: str, address: str | None
) -> Iterator[tuple[Task, list[dict[str, Any]]]]:
    """Each task with its rows, as tasks finish."""
    if backend == "serial" or (backend == "process" and (jobs == 1 or len(tasks) <= 1)):
        for t in tasks:
            yield t, run_task(t)
    elif backend == "process":
        # forkserver: workers never inherit the caller's threads (as kvcxl.emu.sim.sweep)
        ctx = multiprocessing.get_context("forkserver")
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as ex:
            futs = {ex.submit(run_task, t): t for t in tasks}
            for f in as_completed(futs):
                yield futs[f], f.result()
    elif backend == "dask":
        try:
            from dask.distributed import as_completed as dask_completed
        except ImportError:
            raise ValueError(
                "the dask backend needs the 'cluster' extra: pip install 'kvcxl[cluster]'"
            ) from None
        from ..sim.sweep import _dask_client

        with _dask_client(address) as client:
            futs = {client.submit(run_task, t, pure=False): i for i, t in enumerate(tasks)}
            for f in dask_completed(list(futs)):
                yield tasks[futs[f]], f.result()
    else:
        raise ValueError(f"backend {backend!r}: must be 'process', 'serial' or 'dask'")


def run(
    names: list[str],
    scale: str,
    seeds: int,
    out: Path,
    *,
    jobs: int | None = None,
    backend: str = "process",
    address: str | None = None,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run what is missing of ``names`` at ``scale`` on seeds 0 … seeds−1 into ``out``;
    returns every experiment's rows (done before and now), in case and seed order.

    ``progress(done, total)`` returns the callable that is told of each finished run.
    """
    if seeds < 1:
        raise ValueError(f"seeds = {seeds}: must be >= 1")
    for n in names:
        get(n)
    out.mkdir(parents=True, exist_ok=True)
    fps = {n: fingerprint(n) for n in names}
    tasks, done, total = plan(names, scale, seeds, out, fps)
    tick = progress(total - sum(len(t) for t in tasks), total) if progress else None
    files = {n: _append(out_file(out, n, scale)) for n in names}
    try:
        for task, rows in _completed(tasks, jobs or os.cpu_count() or 1, backend, address):
            for (name, case, s), row in zip(task, rows, strict=True):
                k = key(name, case, s, fps[name])
                files[name].write(json.dumps({"key": k, "row": row}) + "\n")
                files[name].flush()
                done[name][k] = row
            if tick:
                tick(len(task))
    finally:
        for f in files.values():
            f.close()
    result = {}
    for name in names:
        order = [key(name, c, s, fps[name]) for c in get(name).cases(scale) for s in range(seeds)]
        result[name] = [done[name][k] for k in order]
    return result


__all__ = ["EXPERIMENTS", "fingerprint", "load", "plan", "run", "run_task"]
