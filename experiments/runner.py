"""Runs experiments: every (case, seed) once, on local processes or a Dask cluster, with a
progress bar and resumable output (docs/validation.md, "Running, resuming").

Each finished run is appended at once as one JSON line to ``OUT/NAME-SCALE.jsonl`` under
its key — experiment, case, seed and the code fingerprint — and a run that finds its key
there is skipped, so a killed run continues where it stopped and a change to the code
that makes the numbers (:func:`fingerprint`) runs everything again.  Every (case, seed) is
one task, written the moment it finishes; tasks are submitted in (workload, seed) order, so
a worker that takes the next run of a stream finds it compiled (``_common.stream`` keeps
the last two per process).  While runs are out, the progress callback is told every few
seconds what each worker holds in memory (its RSS) and the most it has held (the kernel's
high-water mark, where it can tell): a look between runs alone would miss a run's peak.

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
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor
from concurrent.futures import wait as wait_local
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, NamedTuple

from kvcxl.common.meminfo import peak_rss, rss

from . import EXPERIMENTS, get

Run = tuple[str, dict[str, Any], int]  # (experiment, case, seed)
Memory = dict[str, int]  # worker -> bytes


class Look(NamedTuple):
    """One look at the workers' memory: each one's resident set now, and the most it has
    held since it started (the kernel's high-water mark, VmHWM; empty where the workers'
    kernel cannot be asked, as on a Dask cluster)."""

    rss: Memory
    peak: Memory


#: Seconds between two looks at the workers' memory while runs are out.
SAMPLE_S = 2.0

# What makes the numbers: the firmware, the simulator, workloads, timing, shapes and the
# experiments' shared replay; with each experiment's ``run`` (its arms) and its cases.
# Any change to these runs every (case, seed) again; a change to a report does not.
_SOURCES = ("firmware", "emu/sim", "emu/workloads", "experiments/_common.py",
            "emu/timing.py", "emu/shape.py", "common/sizes.py", "emu/timeline",
            "emu/serving.py")  # fmt: skip


def _root() -> Path:
    return Path(__file__).resolve().parents[1]


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


def run_one(run: Run) -> dict[str, Any]:
    """One run as its report row ``{**case, "seed": s, **metrics}``."""
    name, case, seed = run
    return {**case, "seed": seed, **get(name).run(case, seed)}


Where = dict[str, list[str]]  # case field -> the values kept ("14-18": a range of integers)


def parse_where(items: list[str]) -> Where:
    """``KEY=V1,V2,…`` items (``A-B``: the integers A … B) as a :data:`Where`."""
    out: Where = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k or not v:
            raise ValueError(f"--where {item!r}: must be KEY=VALUE[,VALUE…] (e.g. users=14-18)")
        out.setdefault(k, []).extend(x.strip() for x in v.split(",") if x.strip())
    return out


def _matches(value: Any, item: str) -> bool:
    if str(value) == item:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    lo, dash, hi = item.partition("-")
    try:
        if dash and lo:
            return float(lo) <= value <= float(hi)
        return float(item) == value
    except ValueError:
        return False


def with_steps(
    case: dict[str, Any], steps: int | None, warmup: int | None = None
) -> dict[str, Any]:
    """``case`` run for ``steps`` steps (None: its own), its warm-up ``warmup`` steps or
    else the same share of them (at least one step, and fewer than half)."""
    if steps is not None and steps < 4:
        raise ValueError(f"--steps {steps}: at least 4 (a warm-up and steps after it)")
    if "steps" not in case or "warmup" not in case:
        return case
    n = int(case["steps"]) if steps is None else steps
    if warmup is not None:
        if not 1 <= warmup <= (n - 1) // 2:
            raise ValueError(f"--warmup {warmup}: must be 1 … {(n - 1) // 2} at {n} steps "
                             "(fewer warm-up steps than steps measured)")  # fmt: skip
        return {**case, "steps": n, "warmup": warmup}
    w = round(int(case["warmup"]) * n / int(case["steps"]))
    return {**case, "steps": n, "warmup": min(max(1, w), (n - 1) // 2)}


def with_arms(name: str, cases: list[dict[str, Any]], arms: list[str]) -> list[dict[str, Any]]:
    """``cases`` with only the arms named (and the experiment's required ones), refused by
    name when the experiment has no arms to choose or an arm is none of its cases'."""
    exp = get(name)
    known = {a for c in cases for a in exp.arm_names(c)}
    if not known:
        raise ValueError(f"--arms: experiment {name!r} has no arms to choose")
    bad = [a for a in arms if a not in known]
    if bad:
        raise ValueError(
            f"--arms {', '.join(map(repr, bad))}: not an arm of {name!r} (its arms: "
            f"{', '.join(sorted(known))})"
        )
    return [exp.with_arms(c, set(arms)) for c in cases]


def cases_of(
    name: str,
    scale: str,
    where: Where | None = None,
    steps: int | None = None,
    arms: list[str] | None = None,
    attention: str | None = None,
    warmup: int | None = None,
) -> list[dict[str, Any]]:
    """Experiment ``name``'s cases at ``scale`` that ``where`` keeps (run for ``steps`` steps
    and ``warmup`` of them warm-up when given: :func:`with_steps`; with only the ``arms``
    named when given: :func:`with_arms`; with the synthetic ``attention`` chosen when given:
    ``Experiment.with_attention``), refused by name when it has none there."""
    try:
        cases = get(name).cases(scale)
    except KeyError as exc:  # a per-experiment table without this scale
        raise ValueError(f"experiment {name!r} has no scale {scale!r} (no entry {exc})") from None
    if steps is not None or warmup is not None:
        cases = [with_steps(c, steps, warmup) for c in cases]
    if arms:
        cases = with_arms(name, cases, arms)
    if attention is not None:
        cases = [get(name).with_attention(c, attention) for c in cases]
    for k, items in (where or {}).items():
        if not any(k in c for c in cases):
            raise ValueError(f"--where {k}=…: no case of {name!r} at {scale!r} has a field {k!r}")
        cases = [c for c in cases if k in c and any(_matches(c[k], i) for i in items)]
    if not cases:
        raise ValueError(f"--where keeps no case of {name!r} at scale {scale!r}")
    return cases


def plan(
    names: list[str],
    scale: str,
    seeds: int,
    out: Path,
    fps: dict[str, str],
    where: Where | None = None,
    steps: int | None = None,
    arms: list[str] | None = None,
    attention: str | None = None,
    warmup: int | None = None,
) -> tuple[list[Run], dict[str, dict[str, dict[str, Any]]], int]:
    """The runs still to do (in (workload, seed) order: the runs of one stream together),
    what is done, and the total."""
    groups: dict[tuple[str, int], list[Run]] = {}
    done: dict[str, dict[str, dict[str, Any]]] = {}
    total = 0
    for name in names:
        have = load(out_file(out, name, scale))
        done[name] = {}
        for case in cases_of(name, scale, where, steps, arms, attention, warmup):
            for s in range(seeds):
                total += 1
                k = key(name, case, s, fps[name])
                if k in have:
                    done[name][k] = have[k]
                else:
                    groups.setdefault((case["workload"], s), []).append((name, case, s))
    return [r for g in groups.values() for r in g], done, total


def _memory(pids: list[int]) -> Look:
    now = {f"pid {p}": m for p in pids if (m := rss(p)) is not None}
    most = {f"pid {p}": m for p in pids if (m := peak_rss(p)) is not None}
    return Look(now, most)


Event = tuple[Run, dict[str, Any]] | Look  # a finished run with its row, or a memory look


class WorkerLost(RuntimeError):
    """A local worker process died mid-run (the kernel's out-of-memory killer, most
    likely): the user's to act on (fewer jobs or a smaller run), not a bug."""

    exit_code = 1


def _lost(run: Run, jobs: int, look: Look) -> WorkerLost:
    name, case, seed = run
    peak = max([*look.rss.values(), *look.peak.values()], default=0)
    seen = f"; a worker had held {peak / 1e9:.1f} GB by the last look" if peak else ""
    return WorkerLost(
        f"a worker process died while running {name} {case.get('workload', '')} seed "
        f"{seed} (killed by the system: most likely out of memory{seen}); every run "
        "that finished is kept, and the same command resumes from them: run it again "
        f"with fewer workers (--jobs {max(1, jobs - 1)}) or fewer steps (--steps)"
    )


def _completed(runs: list[Run], jobs: int, backend: str, address: str | None) -> Iterator[Event]:
    """Each run with its row as runs finish, and between them (every ``SAMPLE_S`` seconds
    while runs are out) the workers' memory."""
    if backend == "serial" or (backend == "process" and (jobs == 1 or len(runs) <= 1)):
        for r in runs:
            yield r, run_one(r)
            yield _memory([os.getpid()])
    elif backend == "process":
        # forkserver: workers never inherit the caller's threads (as kvcxl.emu.sim.sweep)
        ctx = multiprocessing.get_context("forkserver")
        with ProcessPoolExecutor(max_workers=min(jobs, len(runs)), mp_context=ctx) as ex:
            futs = {ex.submit(run_one, r): r for r in runs}
            pending = set(futs)
            look = Look({}, {})
            while pending:
                finished, pending = wait_local(pending, SAMPLE_S, FIRST_COMPLETED)
                for f in finished:
                    try:
                        row = f.result()
                    except BrokenProcessPool:
                        raise _lost(futs[f], jobs, look) from None
                    yield futs[f], row
                # the pool's worker processes (a private map; empty if that ever changes)
                look = _memory(list(getattr(ex, "_processes", None) or {}))
                yield look
    elif backend == "dask":
        try:
            from dask.distributed import wait as wait_dask
        except ImportError:
            raise ValueError(
                "the dask backend needs the 'cluster' extra: pip install 'kvcxl[cluster]'"
            ) from None
        from kvcxl.emu.sim.sweep import _dask_client

        with _dask_client(address) as client:
            futs = {client.submit(run_one, r, pure=False): r for r in runs}
            pending = set(futs)
            while pending:
                try:
                    finished, pending = wait_dask(pending, SAMPLE_S, "FIRST_COMPLETED")
                except TimeoutError:
                    finished = set()
                for f in finished:
                    yield futs[f], f.result()
                workers = client.scheduler_info(n_workers=-1)["workers"].values()
                yield Look(
                    {f"worker {w['name']}": int(w["metrics"]["memory"]) for w in workers}, {}
                )
    else:
        raise ValueError(f"backend {backend!r}: must be 'process', 'serial' or 'dask'")


class Progress:
    """What a progress display is told: ``start(done, total, runs)`` once (``runs``: the
    runs still to do, for :func:`work` weights), then ``ran(run)`` per finished run and
    ``memory({worker: rss})`` every few seconds, with ``high_water({worker: peak})`` where
    the workers' high-water marks are known.  This base class displays nothing."""

    def start(self, done: int, total: int, runs: list[Run]) -> None:
        pass

    def ran(self, run: Run) -> None:
        pass

    def memory(self, mem: Memory) -> None:
        pass

    def high_water(self, peak: Memory) -> None:
        pass


def work(run: Run) -> float:
    """A run's relative size, for the ETA: its experiment's estimate (``Experiment.work``)."""
    return float(get(run[0]).work(run[1]))


def run(
    names: list[str],
    scale: str,
    seeds: int,
    out: Path,
    *,
    jobs: int | None = None,
    backend: str = "process",
    address: str | None = None,
    progress: Progress | None = None,
    where: Where | None = None,
    steps: int | None = None,
    arms: list[str] | None = None,
    attention: str | None = None,
    warmup: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run what is missing of ``names`` at ``scale`` on seeds 0 … seeds−1 into ``out``;
    returns every experiment's rows (done before and now), in case and seed order.
    ``where`` keeps only the cases whose fields take the values named (:func:`parse_where`);
    ``steps`` runs every case for that many steps, ``warmup`` of them warm-up
    (:func:`with_steps`); ``arms`` runs only the arms named (:func:`with_arms`);
    ``attention`` (``seed`` or ``fit``) runs the synthetic attention chosen
    (``Experiment.with_attention``; None: each case's own).

    ``progress`` is told of the start, of each finished run and of the workers' memory.
    """
    if seeds < 1:
        raise ValueError(f"seeds = {seeds}: must be >= 1")
    for n in names:
        get(n)
    out.mkdir(parents=True, exist_ok=True)
    fps = {n: fingerprint(n) for n in names}
    runs, done, total = plan(names, scale, seeds, out, fps, where, steps, arms, attention,
                             warmup)  # fmt: skip
    progress = progress or Progress()
    progress.start(total - len(runs), total, runs)
    files = {n: _append(out_file(out, n, scale)) for n in names}
    try:
        for event in _completed(runs, jobs or os.cpu_count() or 1, backend, address):
            if isinstance(event, Look):
                progress.memory(event.rss)
                if event.peak:
                    progress.high_water(event.peak)
                continue
            (name, case, s), row = event
            k = key(name, case, s, fps[name])
            files[name].write(json.dumps({"key": k, "row": row}) + "\n")
            files[name].flush()
            done[name][k] = row
            progress.ran((name, case, s))
    finally:
        for f in files.values():
            f.close()
    result = {}
    for name in names:
        order = [
            key(name, c, s, fps[name])
            for c in cases_of(name, scale, where, steps, arms, attention, warmup)
            for s in range(seeds)
        ]
        result[name] = [done[name][k] for k in order]
    return result


__all__ = ["EXPERIMENTS", "Progress", "fingerprint", "load", "plan", "run", "run_one", "work"]
