"""Sweeps: many (seed × configuration) replays, in parallel on local cores or on a Dask cluster.

One *task* compiles a workload for one seed (or loads a trace) and replays it under
every policy and budget of the sweep for one configuration *variant* (a set of
policy-parameter overrides, e.g. ``{"alpha": 0.05}``).  Tasks run on
``concurrent.futures.ProcessPoolExecutor`` (default) or, with ``backend="dask"``,
on a ``dask.distributed`` cluster (the optional ``cluster`` extra): pass a
scheduler address, or none for a ``LocalCluster`` on this machine.  Results are
combined over seeds into rows with 95 % confidence intervals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvcxl.common.jsonout import wrote
from kvcxl.common.sizes import BYTES, Budget, as_budget, parse_size
from kvcxl.firmware.config import PolicyConfig
from kvcxl.firmware.policies import POLICIES, ranked

from ..metrics import audit_sentence, audit_totals, combine_seeds
from ..shape import preset
from ..timing import TierTiming
from ..trace import Trace
from ..workloads import (
    ALL_WORKLOADS,
    WORKLOADS,
    compile_workload,
    from_trace,
    make_workload,
    parse_read_mode,
)
from ..workloads.attention import AttentionParams, preset_attention
from .simulator import SimOptions, pick_engine, simulate, victims_table


@dataclass
class SweepSpec:
    """What to run.  Budgets are :class:`~kvcxl.common.sizes.Budget` in bytes (text as on the
    command line, ``512MiB`` or ``25%``, is parsed on construction); :meth:`to_dict` writes
    them as that text."""

    workload: str | None = "zipf-sessions"
    trace: str | None = None
    preset: str = "ci"
    shape_overrides: dict[str, int] = field(default_factory=dict)
    steps: int = 200
    seeds: list[int] = field(default_factory=lambda: [0])
    policies: list[str] = field(default_factory=lambda: ["lru", "ema"])
    budgets: list[Budget] = field(default_factory=lambda: [Budget.parse("25%", BYTES)])
    config: dict[str, Any] = field(default_factory=dict)
    variants: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    workload_params: dict[str, Any] = field(default_factory=dict)
    attention: dict[str, Any] = field(default_factory=dict)
    read: str = "dense"
    granularity: str = "layer"
    prefetch: bool = False
    prefetch_limit: int = 64
    placement: str = "policy"
    audit: bool = False
    warmup_steps: int = 0
    cxl: str | None = None
    nvme: str | None = None
    timing: dict[str, Any] = field(default_factory=dict)
    mode: str = "float"
    record_victims: bool = False
    engine: str | None = None  # SimOptions.engine: "fast", "numpy", None (fast where covered)
    timeline: bool = False  # SimOptions.timeline: the transfer timeline (docs/timeline.md)

    def __post_init__(self) -> None:
        self.budgets = [as_budget(b, BYTES) for b in self.budgets]

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON values (each budget as its text)."""
        return {**asdict(replace(self, budgets=[])), "budgets": [str(b) for b in self.budgets]}

    def _task(self) -> dict[str, Any]:
        """The spec for a worker process: :meth:`to_dict` with the parsed budgets (they pickle)."""
        return {**self.to_dict(), "budgets": list(self.budgets)}


def build_stream(spec: SweepSpec, seed: int):
    """The read stream of one seed (a trace ignores the seed)."""

    if spec.trace:
        return from_trace(Trace.load(spec.trace))
    shape = preset(spec.preset).with_(**spec.shape_overrides)
    base_cfg = _config(spec, {})
    wl = make_workload(spec.workload or "zipf-sessions", shape, seed=seed, **spec.workload_params)
    return compile_workload(
        wl,
        spec.steps,
        attention=preset_attention(shape).with_(**spec.attention),
        aggregation=base_cfg.aggregation,
        read=spec.read,
    )


def _config(spec: SweepSpec, variant: dict[str, Any]):

    return PolicyConfig.from_mapping({**spec.config, **variant})


def validate(spec: SweepSpec) -> None:
    """Refuse a bad spec before any work starts (names the bad value)."""

    if not spec.trace and spec.workload not in ALL_WORKLOADS:
        raise ValueError(
            f"unknown workload {spec.workload!r}; choose from: {', '.join(ALL_WORKLOADS)}"
        )
    for p in spec.policies:
        if p not in POLICIES:
            raise ValueError(f"unknown policy {p!r}; choose from: {', '.join(sorted(POLICIES))}")
    for v in spec.variants:
        _config(spec, v)
    if not spec.seeds:
        raise ValueError("at least one seed is needed")
    parse_read_mode(spec.read)
    TierTiming(**spec.timing)
    if spec.prefetch and "belady" in spec.policies:
        raise ValueError("belady is the demand-paging optimum: drop it or turn prefetch off")
    for p in spec.policies:  # an explicit --engine fast is refused up front where it cannot run
        pick_engine(
            SimOptions(
                policy=p, mode=spec.mode, prefetch=spec.prefetch, audit=spec.audit,
                engine=spec.engine if spec.engine == "fast" else "numpy", timeline=spec.timeline,
            )
        )  # fmt: skip


def run_task(
    spec_d: dict[str, Any],
    seed: int,
    variant: dict[str, Any],
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Compile one seed and replay every (policy, budget) of the spec under one variant.

    ``progress`` (in-process runs only) is called once per replay.
    """

    spec = SweepSpec(**spec_d)
    return _replay_spec(spec, build_stream(spec, seed), seed, variant, progress)


def _replay_spec(
    spec: SweepSpec,
    stream: Any,
    seed: int,
    variant: dict[str, Any],
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Every (policy, budget) of ``spec`` under one variant, on one seed's stream."""
    cfg = _config(spec, variant)
    timing = TierTiming(**spec.timing)
    total = stream.kv_bytes
    out = []
    for budget in spec.budgets:
        for policy in spec.policies:
            r = simulate(
                stream,
                SimOptions(
                    policy=policy,
                    budget_bytes=budget.resolve(total),
                    cxl_bytes=None if spec.cxl is None else parse_size(spec.cxl, total),
                    nvme_bytes=None if spec.nvme is None else parse_size(spec.nvme, total),
                    config=cfg,
                    timing=timing,
                    prefetch=spec.prefetch,
                    prefetch_limit=spec.prefetch_limit,
                    placement=spec.placement,
                    audit=spec.audit,
                    warmup_steps=spec.warmup_steps,
                    granularity=spec.granularity,
                    mode=spec.mode,
                    record_victims=spec.record_victims,
                    engine=spec.engine,
                    timeline=spec.timeline,
                ),
            )
            r.update(
                seed=seed, budget=str(budget), variant=variant, workload=stream.info.get("workload")
            )
            if spec.record_victims:
                r["_victims"] = victims_table(stream, r.pop("_victims"))
            out.append(r)
            if progress:
                progress(1)
    return out


def run_sweep(
    spec: SweepSpec,
    *,
    jobs: int | None = None,
    backend: str = "process",
    address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Every task of ``spec``; returns the raw per-seed results (see :func:`combine`)."""
    validate(spec)
    tasks = [(s, v) for v in spec.variants for s in spec.seeds]
    d = spec._task()
    results: list[list[dict[str, Any]]] = [[] for _ in tasks]
    jobs = jobs or os.cpu_count() or 1
    if backend == "dask":
        results = _run_dask(d, tasks, address, progress)
    elif backend == "serial" or jobs == 1 or len(tasks) == 1:
        # In-process: progress per replay (see :func:`progress_units`).
        for i, (s, v) in enumerate(tasks):
            results[i] = run_task(d, s, v, progress)
    elif backend == "process":
        # forkserver: workers never inherit the caller's threads (a Dask client, a test
        # runner's helpers), which plain fork can deadlock on.
        ctx = multiprocessing.get_context("forkserver")
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as ex:
            futs = {ex.submit(run_task, d, s, v): i for i, (s, v) in enumerate(tasks)}
            for f in as_completed(futs):
                results[futs[f]] = f.result()
                if progress:
                    progress(1)
    else:
        raise ValueError(f"backend {backend!r}: must be 'process', 'serial' or 'dask'")
    return [r for group in results for r in group]


def _stream_key(spec: SweepSpec) -> str:
    """What decides a seed's stream (build_stream): specs with one key share it."""
    d = spec.to_dict()
    keep = ("workload", "trace", "preset", "shape_overrides", "steps", "workload_params",
            "attention", "read")  # fmt: skip
    agg = _config(spec, {}).aggregation
    return json.dumps([d[k] for k in keep] + [agg], sort_keys=True, default=str)


def run_group(spec_ds: list[dict[str, Any]], seed: int) -> list[list[dict[str, Any]]]:
    """One seed's stream, compiled once, replayed for every variant of every spec (which
    share it: one :func:`_stream_key`); per spec, its rows as :func:`run_task` gives them."""
    specs = [SweepSpec(**d) for d in spec_ds]
    stream = build_stream(specs[0], seed)
    return [
        [r for v in spec.variants for r in _replay_spec(spec, stream, seed, v)] for spec in specs
    ]


def run_sweeps(
    specs: list[SweepSpec],
    *,
    jobs: int | None = None,
    backend: str = "process",
    address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[list[dict[str, Any]]]:
    """Several sweeps at once, batched: one task per (stream, seed) compiles the stream once
    and replays every spec and variant that shares it; local processes or Dask as
    :func:`run_sweep`.  Returns each spec's raw results, in the order of
    :func:`run_sweep` (variants, then seeds).  ``progress(1)`` after each task (local runs)."""
    for spec in specs:
        validate(spec)
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        groups.setdefault(_stream_key(spec), []).append(i)
    tasks = []  # (spec indices, seed)
    for members in groups.values():
        seeds = dict.fromkeys(s for i in members for s in specs[i].seeds)
        for seed in seeds:
            tasks.append(([i for i in members if seed in specs[i].seeds], seed))
    args = [([specs[i]._task() for i in idx], seed) for idx, seed in tasks]
    jobs = jobs or os.cpu_count() or 1
    if backend == "dask":
        done = _run_dask_calls(run_group, args, address)
    elif backend == "serial" or jobs == 1 or len(args) == 1:
        done = []
        for a in args:
            done.append(run_group(*a))
            if progress:
                progress(1)
    elif backend == "process":
        ctx = multiprocessing.get_context("forkserver")  # (as run_sweep)
        done = [None] * len(args)
        with ProcessPoolExecutor(max_workers=min(jobs, len(args)), mp_context=ctx) as ex:
            futs = {ex.submit(run_group, *a): k for k, a in enumerate(args)}
            for f in as_completed(futs):
                done[futs[f]] = f.result()
                if progress:
                    progress(1)
    else:
        raise ValueError(f"backend {backend!r}: must be 'process', 'serial' or 'dask'")
    # Back into run_sweep's order: per spec, variant-major then seed.
    per: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for (idx, seed), res in zip(tasks, done, strict=True):
        for i, rows in zip(idx, res, strict=True):
            per[(i, seed)] = rows
    out = []
    for i, spec in enumerate(specs):
        rows_by_seed = {s: per[(i, s)] for s in spec.seeds}
        n_var = len(spec.variants)
        raw = []
        for v in range(n_var):
            for s in spec.seeds:
                rs = rows_by_seed[s]
                k = len(rs) // n_var
                raw += rs[v * k : (v + 1) * k]
        out.append(raw)
    return out


@contextlib.contextmanager
def _dask_client(address: str | None) -> Iterator[Any]:
    """A client of the cluster at ``address`` (the caller's default client when it is one of
    that cluster), or of a local one (one worker per core)."""
    # lazy: dask is the optional 'cluster' extra (`kvcxl` names it when it is missing)
    from dask.distributed import Client, LocalCluster, default_client

    cluster = None
    if address:
        try:  # the caller's own client of that cluster, if it has one: one client, one loop
            mine = default_client()
        except ValueError:
            mine = None
        if mine is not None and mine.scheduler.address == address:
            yield mine
            return
        client = Client(address)
    else:
        cluster = LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1, processes=True)
        client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _run_dask_calls(fn: Callable[..., Any], args: list[tuple], address: str | None) -> list[Any]:
    try:
        import dask.distributed  # noqa: F401  (the optional 'cluster' extra)
    except ImportError:
        raise ValueError(
            "the dask backend needs the 'cluster' extra: pip install 'kvcxl[cluster]'"
        ) from None
    with _dask_client(address) as client:
        return client.gather([client.submit(fn, *a, pure=False) for a in args])


def progress_units(spec: SweepSpec, backend: str = "process", jobs: int | None = None) -> int:
    """How many progress calls :func:`run_sweep` makes: tasks, or replays when in-process."""
    tasks = len(spec.seeds) * len(spec.variants)
    jobs = jobs or os.cpu_count() or 1
    if backend == "serial" or (backend == "process" and (jobs == 1 or tasks == 1)):
        return tasks * len(spec.policies) * len(spec.budgets)
    return tasks


def _run_dask(d, tasks, address, progress):
    with _dask_client(address) as client:
        from dask.distributed import as_completed as dask_completed  # lazy: as above

        futs = [client.submit(run_task, d, s, v, pure=False) for s, v in tasks]
        index = {f.key: i for i, f in enumerate(futs)}
        results: list[Any] = [None] * len(tasks)
        for f in dask_completed(futs):
            results[index[f.key]] = f.result()
            if progress:
                progress(1)
        return results


def combine(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows combined over seeds, one per (workload, variant, budget, policy), in run order."""

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in raw:
        key = (r.get("workload"), tuple(sorted(r["variant"].items())), r["budget"], r["policy"])
        groups.setdefault(key, []).append(r)
    rows = []
    for (workload, variant, budget, _policy), runs in groups.items():
        row = combine_seeds(runs)
        row.update(workload=workload, variant=dict(variant), budget=budget)
        rows.append(row)
    return rows


# --- the Appendix N questions (docs/design.md), asked again (docs/results.md) -------------------
RESULTS_BUDGETS = ["10%", "20%"]
RESULTS_ALPHAS = [0.05, 0.1, 0.2, 0.4]
RESULTS_PERSISTENCE_POLICIES = ["ema", "lfu", "lrfu", "h2o"]


def results_specs(
    workload: str,
    seeds: int,
    steps: int,
    read: str = "dense",
    attention: str = "preset",
    engine: str = "numpy",
) -> dict[str, SweepSpec]:
    """The three sweeps behind docs/results.md for one workload.

    ``attention`` is ``"preset"`` (the ci preset's parameters: the SmolLM2 fit) or
    ``"seed"`` (the seed-derived defaults of AttentionParams, for comparison).  ``engine``
    ``"numpy"`` audits every run (the page's figures); ``"fast"`` replays them compiled
    where the fast engine covers the policy (numpy elsewhere), without the audit (which
    the numpy engine alone runs), to the same hits.
    """

    if attention not in ("preset", "seed"):
        raise ValueError(f"attention = {attention!r}: must be 'preset' or 'seed'")
    common = dict(
        attention=AttentionParams().to_dict() if attention == "seed" else {},
        workload=workload,
        steps=steps,
        seeds=list(range(seeds)),
        budgets=RESULTS_BUDGETS,
        warmup_steps=steps // 10,
        audit=engine == "numpy",
        read=read,
        # "fast": compiled where the fast engine covers a policy, numpy (with its one-line
        # notice) for the policies it does not cover yet, so every registered policy ranks
        engine=None if engine == "fast" else engine,
    )
    return {
        # The online policies and the offline optimum (bypassing Belady: the upper bound).
        "ranking": SweepSpec(
            policies=sorted(ranked()),
            **common,
        ),
        "alpha": SweepSpec(
            policies=["ema"], variants=[{"alpha": a} for a in RESULTS_ALPHAS if a != 0.2], **common
        ),
        "persistence": SweepSpec(
            policies=RESULTS_PERSISTENCE_POLICIES,
            variants=[{"persistent_metadata": False}],
            **common,
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m kvcxl.emu.sim.sweep``: regenerate the figures of docs/results.md as JSON."""

    p = argparse.ArgumentParser(
        prog="python -m kvcxl.emu.sim.sweep",
        description="Runs the sweeps behind docs/results.md (every workload, the policy ranking, "
        "the α sweep and persistent metadata on/off, at 10 % and 20 % budgets) and writes one "
        "JSON file of rows with 95 % CIs. Simulated.",
    )
    p.add_argument("--out", default="out/results.json")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--workload", action="append", help="only these workloads")
    p.add_argument("--question", action="append", choices=("ranking", "alpha", "persistence"),
                   help="only these questions")  # fmt: skip
    p.add_argument("--read", default="dense", help="dense, topk:K or threshold:T")
    p.add_argument(
        "--attention",
        choices=("preset", "seed"),
        default="preset",
        help="synthetic attention: the ci preset's (fitted to SmolLM2, default) or the "
        "seed-derived defaults (for comparison)",
    )
    p.add_argument(
        "--engine",
        choices=("fast", "numpy"),
        default="fast",
        help="fast: the compiled engine (default; unaudited); numpy: the reference engine, "
        "every run audited, the same rows",
    )
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--backend", choices=("process", "serial", "dask"), default="process")
    p.add_argument("--scheduler", help="Dask scheduler address")
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    named = [
        (name, spec)
        for wl in args.workload or list(WORKLOADS)
        for name, spec in results_specs(
            wl, args.seeds, args.steps, args.read, args.attention, args.engine
        ).items()
        if not args.question or name in args.question
    ]
    # All at once: each (workload, seed) stream is compiled once for its three questions.
    raws = run_sweeps(
        [spec for _, spec in named], jobs=args.jobs, backend=args.backend, address=args.scheduler
    )
    for (name, _), raw in zip(named, raws, strict=True):
        for r in combine(raw):
            r.pop("per_step", None)
            rows.append({"question": name, **r})
    print(f"done at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "evidence": "Simulated",
        "audit": audit_totals(rows),
        "seeds": args.seeds,
        "steps": args.steps,
        "budgets": RESULTS_BUDGETS,
        "read": args.read,
        "attention": args.attention,
        "engine": args.engine,
        "wall_s": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1))
    wrote(args.out)
    md = Path(args.out).with_suffix(".md")
    md.write_text(render_markdown(doc))
    wrote(md)
    return 0


def _pct(r: dict[str, Any] | None) -> str:
    if r is None or r.get("hit_rate") is None:
        return "—"
    ci = r.get("hit_rate_ci95")
    return (
        f"{100 * r['hit_rate']:.1f} ± {100 * ci:.1f}"
        if ci is not None
        else f"{100 * r['hit_rate']:.1f}"
    )


def render_markdown(doc: dict[str, Any]) -> str:
    """Per-workload tables of the results sweep: hit rate % ± 95 % CI (Simulated)."""
    rows = doc["rows"]
    budgets = doc["budgets"]
    out: list[str] = []
    workloads = list(dict.fromkeys(r["workload"] for r in rows))

    def find(q: str, wl: str, pol: str, b: str, var: dict[str, Any] | None = None):
        for r in rows:
            if (r["question"], r["workload"], r["policy"], r["budget"]) == (q, wl, pol, b) and (
                var is None or r["variant"] == var
            ):
                return r
        return None

    if doc.get("engine") == "fast":  # the audit runs on the numpy engine only
        out += ["Audit: not run (fast engine; `--engine numpy` replays the same hits audited).", ""]
    else:
        out += [audit_sentence(doc.get("audit") or audit_totals(rows)), ""]
    for wl in workloads:
        out += [f"### {wl}", ""]
        hits = " | ".join(f"hit % at {b}" for b in budgets)
        gaps_head = " | ".join(f"gap to Belady at {b} (pts)" for b in budgets)
        out.append(f"| policy | {hits} | {gaps_head} |")
        out.append("|---" * (1 + 2 * len(budgets)) + "|")
        ranked = {r["policy"] for r in rows if r["question"] == "ranking" and r["workload"] == wl}
        pols = sorted(  # ties by name: a set's order changes from process to process
            ranked,
            key=lambda p: (-(find("ranking", wl, p, budgets[-1]) or {}).get("hit_rate", 0), p),
        )
        for pol in pols:
            cells = [_pct(find("ranking", wl, pol, b)) for b in budgets]
            gaps = []
            for b in budgets:
                opt, r = find("ranking", wl, "belady", b), find("ranking", wl, pol, b)
                gaps.append("—" if opt is None or r is None or pol == "belady"
                            else f"{100 * (opt['hit_rate'] - r['hit_rate']):.1f}")  # fmt: skip
            out.append(f"| {pol} | " + " | ".join(cells) + " | " + " | ".join(gaps) + " |")
        out += ["", "α sweep (ema; α = 0.2 from the ranking run):", ""]
        out.append("| α | " + " | ".join(f"hit % at {b}" for b in budgets) + " |")
        out.append("|---" * (1 + len(budgets)) + "|")
        for a in RESULTS_ALPHAS:
            cells = [
                _pct(
                    find("ranking", wl, "ema", b)
                    if a == 0.2
                    else find("alpha", wl, "ema", b, {"alpha": a})
                )
                for b in budgets
            ]
            out.append(f"| {a} | " + " | ".join(cells) + " |")
        if not any(r["question"] == "persistence" and r["workload"] == wl for r in rows):
            out.append("")
            continue
        out += ["", "Persistent metadata on → off:", ""]
        out.append("| policy | " + " | ".join(f"on / off at {b}" for b in budgets) + " |")
        out.append("|---" * (1 + len(budgets)) + "|")
        for pol in RESULTS_PERSISTENCE_POLICIES:
            cells = []
            for b in budgets:
                on = find("ranking", wl, pol, b)
                off = find("persistence", wl, pol, b, {"persistent_metadata": False})
                cells.append(f"{_pct(on)} / {_pct(off)}")
            out.append(f"| {pol} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
