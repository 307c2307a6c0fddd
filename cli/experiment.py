"""``kvcxl experiment``: the design's validation programme on the simulator (docs/validation.md)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from kvcxl.common.argtypes import positive
from kvcxl.common.progress import progress
from kvcxl.emu.workloads.attention import ATTENTION_CHOICES
from kvcxl.experiments.base import SCALES

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
preset, 200 steps, top-8 reads, every workload), mid (S1's heads — 8 KV heads, GQA
groups of 8 — at 8 layers × 16 K tokens, 300 steps, top-32 reads, every workload; an
hour or more on two cores) and s1 (S1 exactly: 80 layers × 64 Q / 8 KV heads × 128 K
tokens; 1,000 steps, so that β·idle reaches 1 at β = 0.001, of which the first 100 are
warm-up; top-256 reads, 4,096 tokens per head, Mooncake's 16 K-token contexts top-32;
the users experiments sweep 1–24 users around the claimed 16).  S1 is huge — one
users-timeline run at 16 users replays 5.2 G entry reads (Analytical model) — so size it
first with one seed and the progress bar's ETA, and narrow it with --where.  S1's
attention is the seed's defaults, not the SmolLM2-135M fit stretched over 80 layers by
relative depth: that fit is a 135 M model's at 2 K tokens, nothing measured says a 70 B
model at 128 K attends so, and the seed's defaults are what the design assumed for S1
(docs/validation.md, "Scales").  --attention fit runs that stretched fit instead
(--attention seed: the seed's defaults at ci and tiny), so a verdict that turns on the
choice can be run both ways; those runs are kept apart from the default ones.

Output: each finished run is appended to OUT/NAME-SCALE.jsonl as it completes, and the
same command run again resumes: what is there is skipped (after Ctrl-C, a killed
process or a lost worker, nothing but the runs in flight is lost; a change to the code
that makes the numbers runs everything again).  The report is written to
OUT/NAME-SCALE.md (docs-ready markdown), --json and --plot.  The progress bar shows the
runs done, the ETA (this session's rate, each run weighted by the entry reads it
replays) and each worker's memory (RSS); off a terminal, a status line a minute.

examples:
  kvcxl experiment --list
  kvcxl experiment ladder --scale ci --seeds 10
  kvcxl experiment all --scale mid --plot docs/img --json out/validation.json
  kvcxl experiment all --scheduler tcp://10.0.0.5:8786
  kvcxl experiment users-timeline --scale s1 --seeds 1 --where users=14-18
  kvcxl experiment policies --scale s1 --attention fit --where workload=multi-turn
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
        "--scale", choices=SCALES, default="mid", help="model shape, steps and workloads "
        "(default: mid; s1: S1 at full size)"
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
    p.add_argument(
        "--where", action="append", default=[], metavar="KEY=V[,V…]",
        help="run only the cases whose field KEY takes one of the values (A-B: a range of "
        "numbers), e.g. users=14-18 or series=seed,seed-fill; repeatable",
    )  # fmt: skip
    p.add_argument(
        "--steps", type=positive, default=None, metavar="N",
        help="run every case for N steps instead of its scale's, the warm-up the same share "
        "(for a scale too large for the machine: at s1 fewer than 1,000 steps leave β·idle "
        "below 1; the runs are kept apart from the scale's own)",
    )  # fmt: skip
    p.add_argument(
        "--warmup", type=positive, default=None, metavar="W",
        help="the first W steps of every run are warm-up, excluded from every metric "
        "(default: the scale's share of the steps); with --steps, to exclude a cold start "
        "that lasts longer than that share, e.g. --steps 30 --warmup 10",
    )  # fmt: skip
    p.add_argument(
        "--arms", metavar="A[,A…]", default=None,
        help="run only these arms of an experiment that has arms (policies: its policies and "
        "configured arms; the baseline and the bound always run), e.g. lru,clock: for a "
        "scale too large for the machine; the runs are kept apart from the whole case's",
    )  # fmt: skip
    p.add_argument(
        "--attention", choices=ATTENTION_CHOICES, default=None,
        help="the synthetic attention: seed = the generator's seed-derived defaults "
        "(AttentionParams()), fit = the fit to SmolLM2-135M, its 30 layers' sink and recent "
        "profiles stretched over the shape's layers by relative depth (averaged onto fewer). "
        "Default: each scale's own, the fit at tiny and ci (SmolLM2's size) and seed at mid, "
        "s1 and in the users experiments (the fit is a 135 M model's at 2 K tokens, nothing "
        "measured says a 70 B model at 128 K attends so, and seed is what the design assumed "
        "for S1); a choice other than a case's own is kept in the case, so its runs are "
        "keyed apart from the default ones",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_experiment)


def _names(args: argparse.Namespace) -> list[str]:
    from kvcxl.experiments import EXPERIMENTS, get

    if not args.names:
        raise ValueError(f"name an experiment: all, {', '.join(EXPERIMENTS)} (or --list)")
    if "all" in args.names:
        return list(EXPERIMENTS)
    for n in args.names:
        get(n)
    return list(dict.fromkeys(args.names))


def _duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    d, h, m = s // 86400, s // 3600 % 24, s // 60 % 60
    return f"{d}d{h:02d}h" if d else f"{h}h{m:02d}m" if h else f"{m}m{s % 60:02d}s"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


class Bar:
    """The experiment's progress bar (a :class:`runner.Progress`): runs done of the total,
    the ETA and each worker's resident memory.  The ETA is this session's elapsed time ×
    the work left over the work done, each run weighted by its experiment's ``work``
    estimate (entry reads), so small runs early do not promise a short sweep.  Off a
    terminal the bar is silent and a status line goes to stderr at most once a minute."""

    LINE_S = 60.0

    def __init__(self, off: bool = False) -> None:
        self.off = off
        self.peak: dict[str, int] = {}
        self.kernel_peak = False  # whether a peak came from the kernel, not from the looks
        self.done = self.total = 0
        self.left = self.work_done = 0.0
        self.t0 = self.last_line = time.monotonic()
        self.bar: Any = None
        self.mem = ""

    def start(self, done: int, total: int, runs: list) -> None:
        from kvcxl.experiments import runner

        self.done, self.total = done, total
        self.left = sum(runner.work(r) for r in runs)
        self.t0 = self.last_line = time.monotonic()
        self.bar, _ = progress(total, "experiment", "run", initial=done, off=self.off)
        self.bar.bar_format = (
            "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} runs [{elapsed}{postfix}]"
        )
        self._show()

    def ran(self, run: tuple) -> None:
        from kvcxl.experiments import runner

        w = runner.work(run)
        self.done += 1
        self.work_done += w
        self.left -= w
        self.bar.update(1)
        self._show()

    def memory(self, mem: dict[str, int]) -> None:
        for k, v in mem.items():
            self.peak[k] = max(v, self.peak.get(k, 0))
        if mem:
            vals = sorted(mem.values(), reverse=True)
            self.mem = (
                "RSS " + " ".join(f"{k.split()[-1]}:{_gb(v)}" for k, v in sorted(mem.items()))
                if len(mem) <= 4
                else f"RSS max {_gb(vals[0])}, mean {_gb(sum(vals) / len(vals))} "
                f"over {len(vals)} workers"
            )
        self._show()

    def high_water(self, peak: dict[str, int]) -> None:
        # (a look between runs misses what a run held and freed; the kernel's mark does not)
        for k, v in peak.items():
            self.peak[k] = max(v, self.peak.get(k, 0))
        self.kernel_peak = True

    def eta(self) -> float | None:
        if self.work_done <= 0:
            return None
        return (time.monotonic() - self.t0) * max(self.left, 0.0) / self.work_done

    def status(self) -> str:
        return f"ETA {_duration(self.eta())}" + (f", {self.mem}" if self.mem else "")

    def _show(self) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix_str(self.status(), refresh=True)
        now = time.monotonic()
        if (self.bar.disable and not self.off and now - self.last_line >= self.LINE_S
                and self.done < self.total):  # fmt: skip
            self.last_line = now
            print(f"experiment: {self.done}/{self.total} runs, {_duration(now - self.t0)} "
                  f"elapsed, {self.status()}", file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def peaks(self) -> str:
        """Each worker's peak RSS (the kernel's high-water mark where it could tell, else
        the largest look), for the closing line."""
        if not self.peak:
            return "no memory sampled"
        vals = sorted(self.peak.values(), reverse=True)
        how = "high-water mark" if self.kernel_peak else "sampled"
        return f"peak RSS per worker ({how}) {_gb(vals[0])} max over {len(vals)}"


def _experiment(args: argparse.Namespace) -> int:
    from kvcxl.experiments import EXPERIMENTS, get, runner

    if args.list:
        for name, exp in EXPERIMENTS.items():
            print(f"{name:12} {exp.question}")
            print(textwrap.indent(f"claim: {exp.claim}", " " * 13))
        return 0
    names = _names(args)
    backend = "dask" if args.scheduler else args.backend
    args.out = Path(args.out)
    where = runner.parse_where(args.where)
    arms = [a.strip() for a in (args.arms or "").split(",") if a.strip()] or None
    t0 = time.monotonic()
    bar = Bar(off=args.no_progress)
    try:
        rows = runner.run(
            names, args.scale, args.seeds, args.out, jobs=args.jobs, backend=backend,
            address=args.scheduler, progress=bar, where=where, steps=args.steps, arms=arms,
            attention=args.attention, warmup=args.warmup,
        )  # fmt: skip
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted: {bar.done} of {bar.total} runs are in {args.out}; the same "
              "command resumes where it stopped", file=sys.stderr)  # fmt: skip
        raise
    bar.close()
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
          f"wall ({backend}; {bar.peaks()}); runs in {args.out}")  # fmt: skip
    if args.json_out:
        doc = {"evidence": "Simulated", "scale": args.scale, "seeds": args.seeds,
               "fingerprints": {n: runner.fingerprint(n) for n in names}, "wall_s": wall,
               "backend": backend, "where": where, "steps": args.steps, "warmup": args.warmup,
               "arms": arms,
               "attention": args.attention or "each scale's own",
               "peak_rss_bytes": bar.peak,
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
