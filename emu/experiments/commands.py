"""``kvcxl experiment``: the design's validation programme on the simulator (docs/validation.md)."""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from pathlib import Path
from typing import Any

from kvcxl.common.argtypes import positive
from kvcxl.common.progress import progress

DESCRIPTION = """\
Runs experiments of the design's validation programme (its §K.6; docs/validation.md) on
the simulator and reports each one's question, the seed's claim it tests, per-workload
tables (never averaged over workloads) and a verdict: confirms, contradicts or cannot say.
Every figure is Simulated; every table is printed under a caption naming its class, its
runs and where its attention came from (the synthetic generator fitted to SmolLM2-135M
for the ci preset, the seed's defaults for S1's shapes, or a SmolLM2 capture;
docs/evidence.md).

Statistics: every (case, seed) is one replay; means carry 95 % confidence intervals
(Student t over seeds), latencies also the median and p50/p95/p99 of the per-step
stall (the median over seeds of each seed's percentile); gains between arms are paired
(per-seed differences); the first steps of every run are warm-up and excluded.

Seed policy: seed s (0 … N−1) of every case is workload seed s (numpy PCG64: the same
streams on every machine); every arm and case replays the same N streams.

Scales: tiny (CI: the ci shape at 512 tokens, 24 steps, two workloads), ci (the ci
preset, 200 steps, top-8 reads, every workload) and mid (S1's heads — 8 KV heads, GQA
groups of 8 — at 8 layers × 16 K tokens, 300 steps, top-32 reads, every workload; the
programme's scale, an hour or more on two cores; docs/validation.md, "Scales").

Output: each finished run is appended to OUT/NAME-SCALE.jsonl as it completes; running
the same command again skips what is there (a killed run continues where it stopped;
a change to the code that makes the numbers runs everything again).  The report is
written to OUT/NAME-SCALE.md (docs-ready markdown), --json and --plot.

examples:
  kvcxl experiment --list
  kvcxl experiment ladder --scale ci --seeds 10
  kvcxl experiment all --scale mid --plot docs/img --json out/validation.json
  kvcxl experiment all --scheduler tcp://10.0.0.5:8786
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="run the design's validation programme (ablation ladder, sweeps) on the simulator",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="experiments to run, or all")
    p.add_argument("--list", action="store_true", help="name every experiment and its question")
    p.add_argument(
        "--scale", choices=("tiny", "ci", "mid"), default="mid", help="model shape, steps and "
        "workloads (default: mid)"
    )  # fmt: skip
    p.add_argument(
        "--seeds", type=positive, default=10, help="seeds 0 … N−1 per case (default 10; the "
        "programme asks for at least 10)"
    )  # fmt: skip
    p.add_argument(
        "--out", default="out/experiments", metavar="DIR",
        help="where runs (JSONL, resumable) and reports (markdown) go (default out/experiments)",
    )  # fmt: skip
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write the reports as JSON")
    p.add_argument("--plot", dest="plot_dir", metavar="DIR", help="write the plots (PNG) here")
    p.add_argument(
        "--jobs", type=positive, default=None, help="parallel processes (default: cores)"
    )
    p.add_argument(
        "--backend", choices=("process", "serial", "dask"), default="process",
        help="where runs go: local processes, in-process, or a Dask cluster",
    )  # fmt: skip
    p.add_argument(
        "--scheduler", metavar="ADDRESS",
        help="Dask scheduler address (implies --backend dask; with --backend dask and no "
        "address: a LocalCluster on this machine)",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_experiment)


def _names(args: argparse.Namespace) -> list[str]:
    from . import EXPERIMENTS, get

    if not args.names:
        raise ValueError(f"name an experiment: all, {', '.join(EXPERIMENTS)} (or --list)")
    if "all" in args.names:
        return list(EXPERIMENTS)
    for n in args.names:
        get(n)
    return list(dict.fromkeys(args.names))


def _progress(off: bool):
    if off:
        return None

    def start(done: int, total: int):
        return progress(total, "experiment", "run", initial=done)[1]

    return start


def _experiment(args: argparse.Namespace) -> int:
    from . import EXPERIMENTS, get, runner

    if args.list:
        for name, exp in EXPERIMENTS.items():
            print(f"{name:12} {exp.question}")
            print(textwrap.indent(f"claim: {exp.claim}", " " * 13))
        return 0
    names = _names(args)
    backend = "dask" if args.scheduler else args.backend
    args.out = Path(args.out)
    t0 = time.monotonic()
    rows = runner.run(
        names, args.scale, args.seeds, args.out, jobs=args.jobs, backend=backend,
        address=args.scheduler, progress=_progress(args.no_progress),
    )  # fmt: skip
    wall = time.monotonic() - t0
    reports: dict[str, Any] = {}
    for name in names:
        exp = get(name)
        rep = exp.report(rows[name])
        md = render(exp, rep, args.scale, args.seeds)
        (args.out / f"{name}-{args.scale}.md").write_text(md)
        print(md)
        if args.plot_dir:
            Path(args.plot_dir).mkdir(parents=True, exist_ok=True)
            for fname, draw in rep["plots"].items():
                stem, _, ext = fname.rpartition(".")
                draw(str(Path(args.plot_dir) / f"{stem}-{args.scale}.{ext}"))
        reports[name] = {
            "question": exp.question, "claim": exp.claim, "verdict": rep["verdict"],
            "why": rep["why"], "caption": rep.get("caption"), "tables": rep["tables"],
            "rows": rows[name],
        }  # fmt: skip
    print(f"{len(names)} experiment(s), scale {args.scale}, {args.seeds} seeds: {wall:.1f} s "
          f"wall ({backend}); runs in {args.out}")  # fmt: skip
    if args.json_out:
        doc = {"evidence": "Simulated", "scale": args.scale, "seeds": args.seeds,
               "fingerprints": {n: runner.fingerprint(n) for n in names}, "wall_s": wall,
               "backend": backend,
               "experiments": reports}  # fmt: skip
        Path(args.json_out).write_text(json.dumps(doc, indent=1))
    return 0


def render(exp: Any, rep: dict[str, Any], scale: str, seeds: int) -> str:
    """One experiment's report as docs-ready markdown.

    Every table is printed under a caption that names its evidence class and where its
    attention came from: a table that opens with its own caption line keeps it, a bare
    one gets the report's ``caption``; a bare table with no caption is refused."""
    parts = [
        f"### {exp.name} (scale {scale}, {seeds} seeds; Simulated)",
        f"**Question.** {exp.question}",
        f"**Claim tested.** {exp.claim}",
        f"**Verdict: {rep['verdict']}.** {rep['why']}",
    ]
    for table in rep["tables"]:
        if table.startswith("|"):
            if not rep.get("caption"):
                raise ValueError(f"experiment {exp.name!r}: a table without a caption")
            parts.append(rep["caption"])
        parts.append(table)
    return "\n\n".join(parts) + "\n"
