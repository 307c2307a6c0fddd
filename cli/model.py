"""``kvcxl quality`` and ``kvcxl calibrate``: the real model under bounded KV caches.

(``kvcxl trace capture`` lives under the ``trace`` command; its options and handler
are in :mod:`kvcxl.model.capture`.)  Only the standard library is imported here;
torch and numpy load inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from kvcxl.common.argtypes import nonnegative, positive, positive_float, unit_interval
from kvcxl.common.figures import figure
from kvcxl.common.jsonout import wrote
from kvcxl.common.options import add_options, add_parser, opt
from kvcxl.common.progress import progress
from kvcxl.common.sizes import FRACTION, TOKENS, Budget, budget_arg

QUALITY_EPILOG = """\
policies: any firmware policy (ema, h2o, lru, sink-window, lfu, fifo, lrfu, random) or
'window' (sink-window without sinks); add parameters as NAME:key=value,... e.g.
'ema:alpha=0.05,beta=0.01' or 'sink-window:sink_tokens=16'.  h2o keeps half its budget
as the recent window unless recent_tokens is given.

example:
  kvcxl trace capture --prompt long-doc --steps 32 -o long-doc.npz
  kvcxl quality --trace long-doc.npz --policy sink-window --policy window \\
      --policy ema --policy h2o --policy lru --budget 64 --budget 128 --json q.json

Every figure is Measured: the real model is run with the bounded cache.
"""

CALIBRATE_EPILOG = """\
example (the documented run, a few minutes per prompt):
  for p in chat long-doc code; do
    kvcxl trace capture --prompt $p --steps 32 -o $p.npz; done
  kvcxl calibrate --trace chat.npz --trace long-doc.npz --trace code.npz \\
      --alpha 0.02,0.05,0.1,0.2,0.4 --beta 0.0001,0.001,0.01,0.1 \\
      --budget 128 --out calib/

Hit rate is Simulated (the traces replayed through the policy with demand paging);
output quality is Measured (the real model re-run with the bounded cache); the §K.7 fits
are Analytical models on the Measured attention (docs/calibration.md, section 5).
"""


def _wrap(text: str) -> str:
    return textwrap.fill(text, 88)


QUALITY_PARSER = dict(
    help="output quality (KL, top-1) of the real model under a cache bounded by each policy",
    description=_wrap(
        "Re-run SmolLM2-135M over a captured trace's tokens with a KV cache bounded by "
        "each policy at each budget (tokens per KV head; kept blocks keep their original "
        "positions) and report, per step and in summary, KL(full ‖ bounded) of the "
        "next-token distribution and top-1 agreement with full-cache decoding."
    ),
    epilog=QUALITY_EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
CONFIG = opt("--config", metavar="FILE.toml", help="base policy configuration")
THREADS = opt("--threads", type=positive, default=1, help="torch CPU threads (default 1)")
QUALITY_OPTIONS = (
    opt("--trace", required=True, help="a trace from `kvcxl trace capture`"),
    opt(
        "--policy",
        action="append",
        metavar="P",
        help="policy (repeatable; default: ema h2o lru sink-window window)",
    ),
    opt(
        "--budget",
        action="append",
        type=budget_arg(TOKENS),
        metavar="B",
        help="tokens per KV head, a percentage of the sequence, or 'all' (repeatable; "
        "default 64 and 128)",
    ),
    CONFIG,
    opt(
        "--max-tokens", type=positive, metavar="N", help="use only the first N tokens of the trace"
    ),
    THREADS,
    opt(
        "--json",
        dest="json_out",
        metavar="FILE",
        help="write the summary and every step's KL, top-1 agreement and bounded flag as JSON",
    ),
    opt("--plot", metavar="FILE.png", help="KL and top-1 vs budget, one line per policy"),
)
CALIBRATE_PARSER = dict(
    help="joint α × β (then keep/evict) sweep of the seed's policy on real traces, and every "
    "other §K.7 parameter by its own method (writes calibrated.toml)",
    description=_wrap(
        "The design's calibration (docs/calibration.md): sweep α × β of the ema policy "
        "on captured traces, "
        "scored by hit rate at a fixed HBM budget (trace replay with demand paging) and "
        "by output quality (the real model re-run with the bounded cache); then sweep the "
        "keep/evict thresholds (on the score trajectories, then each pair replayed under "
        "managed tiers with every read counted by the tier that served it) and the "
        "touch threshold at the best (α, β). Then fits every other parameter of the "
        "design's §K.7 table a trace can fit, each by its own method (keep by the hit-rate "
        "SLO, the placement weights and cuts by a fit of reuse, the prefetch window, "
        "depth, distance scale and blend by precision and recall, the anchor zone by where "
        "the sink stops) and writes them to OUT/calibrated.toml, which --config replays. "
        "Writes heat maps (PNG), a JSON report and the best point with its 95 % confidence "
        "interval over prompts."
    ),
    epilog=CALIBRATE_EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
CALIBRATE_OPTIONS = (
    opt("--trace", action="append", required=True, help="captured trace (repeatable)"),
    opt("--alpha", default="0.02,0.05,0.1,0.2,0.4", help="comma-separated α values"),
    opt("--beta", default="0.0001,0.001,0.01,0.1", help="comma-separated β values"),
    opt(
        "--budget",
        type=budget_arg(TOKENS),
        default="128",
        help="HBM budget in tokens per KV head (default 128)",
    ),
    opt(
        "--read-threshold",
        type=unit_interval,
        default=0.01,
        help="hit-rate replay: an entry is read in a step when its weight is at least this "
        "(sparse, Quest-like selection; default 0.01)",
    ),
    opt("--keep", default="0.02,0.05,0.1,0.2", help="keep thresholds to sweep"),
    opt("--evict", default="0.005,0.01,0.02,0.05", help="evict thresholds to sweep"),
    opt(
        "--touch",
        default="0.001,0.005,0.01,0.02,0.05",
        help="touch thresholds to sweep at the best (α, β) by hit rate (a read lighter than "
        "this does not reset the idle count)",
    ),
    opt("--no-quality", action="store_true", help="score by hit rate only (no model runs)"),
    opt("--max-tokens", type=positive, metavar="N", help="use only the first N tokens"),
    opt(
        "--slo",
        type=unit_interval,
        default=0.97,
        help="§K.7: hit-rate SLO for keep and the low P cut: the smallest hot set serving "
        "this share of reads (default 0.97, the design's)",
    ),
    opt(
        "--prefetch-limit",
        type=positive,
        default=None,
        metavar="N",
        help="§K.7 prefetch: entries fetched per batch and touches used as sources (default: "
        "the simulator's, 64)",
    ),
    opt(
        "--breakeven",
        type=unit_interval,
        default=0.5,
        help="§K.7 prefetch: a ring of the window (a layer of the depth) pays when at least "
        "this share of its blocks is read (default 0.5: an unread fetch costs what a read one "
        "saves)",
    ),
    opt(
        "--sink-ratio",
        type=positive_float,
        default=2.0,
        help="§K.7 anchor zone: a leading block is part of the sink while its mean weight is "
        "at least this many times the far background (default 2)",
    ),
    CONFIG,
    THREADS,
    opt(
        "--out",
        default="calibration",
        help="output folder (JSON, PNG heat maps, calibrated.toml for --config)",
    ),
    opt("--json", dest="json_out", metavar="FILE", help="also write the JSON here"),
)


def register(sub: argparse._SubParsersAction) -> None:
    add_parser(sub, "quality", QUALITY_OPTIONS, func=_quality, **QUALITY_PARSER)
    add_parser(sub, "calibrate", CALIBRATE_OPTIONS, func=_calibrate, **CALIBRATE_PARSER)


def _load_measured(path: str, max_tokens: int | None) -> tuple[Any, list[int]]:
    from kvcxl.emu.trace import Trace
    from kvcxl.model.weights import GGUF_SHA256, MODEL_NAME

    trace = Trace.load(path)
    extra = trace.extra
    if "tokens" not in extra or extra.get("model") != MODEL_NAME:
        raise ValueError(
            f"{path}: not a capture of {MODEL_NAME} (no token ids in its metadata); "
            "make one with `kvcxl trace capture`"
        )
    if extra.get("model_sha256") != GGUF_SHA256:
        raise ValueError(f"{path}: captured with a different model file than the installed one")
    tokens = [int(t) for t in extra["tokens"]]
    if max_tokens is not None:
        if max_tokens < 1:
            raise ValueError(f"--max-tokens {max_tokens}: must be >= 1")
        tokens = tokens[:max_tokens]
    return trace, tokens


def _base_config(path: str | None, aggregation: str) -> Any:
    from kvcxl.firmware.config import PolicyConfig

    base = PolicyConfig.load(path) if path else PolicyConfig()
    return base.with_(aggregation=aggregation)


def _quality(args: argparse.Namespace) -> int:
    from kvcxl.model.capture import load_model
    from kvcxl.model.quality import PolicySpec, evaluate

    trace, tokens = _load_measured(args.trace, args.max_tokens)
    specs = [PolicySpec.parse(p) for p in (args.policy or _DEFAULT_POLICIES)]
    budgets = [int(b.resolve(len(tokens))) for b in (args.budget or _DEFAULT_BUDGETS)]
    bt = trace.shape.block_tokens
    for b in budgets:
        if b < bt:
            raise ValueError(f"budget {b} tokens is less than one {bt}-token block")
    config = _base_config(args.config, trace.aggregation)
    model, _ = load_model(args.threads)
    _, results = evaluate(
        model, tokens, specs, budgets, block_tokens=bt, config=config, progress=True
    )
    first_decode = int(trace.extra.get("first_decode_step", 0))
    rows = [r.summary(first_decode) for r in results]
    print(
        f"{len(tokens)} tokens ({first_decode + 1} prompt), {bt}-token blocks, "
        f"aggregation {trace.aggregation}  (Measured)"
    )
    print(f"{'policy':<28}{'budget':>7}{'KL bounded':>12}{'top-1':>8}{'KL decode':>11}{'top-1':>8}")
    for s in rows:
        print(
            f"{s['policy']:<28}{s['budget_tokens']:>7}{s['kl_bounded']:>12.4f}"
            f"{100 * s['top1_bounded']:>7.1f}%{s['kl_decode']:>11.4f}"
            f"{100 * s['top1_decode']:>7.1f}%"
        )
    for s, r in zip(rows, results, strict=True):
        s["per_step"] = {
            "kl": r.kl.round(6).tolist(),
            "top1_agree": r.agree.astype(int).tolist(),
            "bounded": r.bounded.astype(int).tolist(),
        }
    out = {
        "evidence": "Measured",
        "model": trace.extra.get("model"),
        "trace": str(args.trace),
        "tokens": len(tokens),
        "first_decode_step": first_decode,
        "block_tokens": bt,
        "results": rows,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2))
        wrote(args.json_out)
    if args.plot:
        _plot_quality(rows, args.plot, Path(args.trace).name)
        wrote(args.plot)
    return 0


_DEFAULT_POLICIES = ("ema", "h2o", "lru", "sink-window", "window")
_DEFAULT_BUDGETS = (Budget.parse("64", TOKENS), Budget.parse("128", TOKENS))


def _plot_quality(rows: list[dict], path: str, title: str) -> None:
    with figure(path, dpi=120, tight=True, ncols=2, figsize=(10, 4)) as (fig, (a1, a2)):
        _draw_quality(rows, title, fig, a1, a2)


def _draw_quality(rows: list[dict], title: str, fig: Any, a1: Any, a2: Any) -> None:
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", (0, (5, 2, 1, 2)))]
    for n, label in enumerate(dict.fromkeys(r["policy"] for r in rows)):
        marker, ls = styles[n % len(styles)]
        pts = sorted(
            (r["budget_tokens"], r["kl_bounded"], r["top1_bounded"])
            for r in rows
            if r["policy"] == label
        )
        xs = [p[0] for p in pts]
        a1.plot(xs, [p[1] for p in pts], marker=marker, ls=ls, label=label)
        a2.plot(xs, [100 * p[2] for p in pts], marker=marker, ls=ls, label=label)
    a1.set(xlabel="budget (tokens per KV head)", ylabel="KL(full ‖ bounded), nats", yscale="log")
    a2.set(xlabel="budget (tokens per KV head)", ylabel="top-1 agreement (%)")
    a1.legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M, {title}: bounded-cache quality (Measured)")


def _calibrate(args: argparse.Namespace) -> int:
    from kvcxl.model import calibrate as cal

    if args.prefetch_limit is None:
        from kvcxl.emu.sim.simulator import SimOptions

        args.prefetch_limit = SimOptions.prefetch_limit
    return cal.main(args, _load_measured, _base_config)


# --- kvcxl trace passkey -------------------------------------------------------------------------
PASSKEY_EPILOG = """\
budgets are fractions of the prompt's KV kept per KV head (one pool of whole 16-token blocks
over every layer and head): 25%, 0.25, or 'all' (nothing evicted: equals the full cache).

example (the documented run):
  kvcxl trace passkey --prompts 20 --depths 0.25,0.5,0.9 --budgets 25%,50%,75% \\
      --policies ema,h2o,lru,sink-window --json passkey.json --plot docs/img/passkey.png

Accuracy is Measured (the real model decodes under each bounded cache); the hit rate is
Simulated (the captured trace of the same prompt replayed through the policy).  With --json,
each finished prompt is saved at once and a rerun with the same settings resumes there.
"""


def _listed(conv: Any, what: str) -> Any:
    """An argparse type: a comma-separated list, each item through ``conv``."""

    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {what}")
        try:
            return [conv(t) for t in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _depth(text: str) -> float:
    try:
        d = float(text)
    except ValueError:
        d = float("nan")
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"depth {text!r} is not a fraction of the filler within [0, 1]")
    return d


def _digits(text: str) -> int:
    n = positive(text)
    if n > 18:
        raise argparse.ArgumentTypeError(
            f"{text} is out of range: an integer within 1 … 18 is accepted"
        )
    return n


def _budget(text: str) -> float:
    """A fraction of the prompt's KV: ``25%``, ``0.25`` or ``all`` (= 1.0)."""
    return float(Budget.parse(text, FRACTION).resolve())


def _policy(text: str) -> Any:
    from kvcxl.model.quality import PolicySpec

    return PolicySpec.parse(text)


PASSKEY_OPTIONS = (
    opt("--prompts", type=positive, default=20, help="prompts per depth (default 20)"),
    opt(
        "--depths",
        type=_listed(_depth, "depths in [0, 1]"),
        default=[0.25, 0.5, 0.9],
        help="needle depths, fractions of the filler (default 0.25,0.5,0.9)",
    ),
    opt(
        "--budgets",
        type=_listed(_budget, "budgets"),
        default=[0.25, 0.5, 0.75],
        help="fractions of the prompt's KV kept (default 25%%,50%%,75%%)",
    ),
    opt(
        "--policies",
        type=_listed(_policy, "policies"),
        default=None,
        help="policies, as for `kvcxl quality` (default ema,h2o,lru,sink-window)",
    ),
    opt("--min-tokens", type=positive, default=2000, help="prompt length, at least (default 2000)"),
    opt("--digits", type=_digits, default=5, help="pass key digits, 1 … 18 (default 5)"),
    opt("--seed", type=nonnegative, default=0, help="prompt generator seed (default 0)"),
    opt(
        "--read-threshold",
        type=unit_interval,
        default=0.01,
        help="hit-rate replay: an entry is read when its weight is at least this (default 0.01)",
    ),
    CONFIG,
    THREADS,
    opt(
        "--json",
        dest="json_out",
        metavar="FILE",
        help="write settings, every prompt's answers and the summary (resumes from it)",
    ),
    opt(
        "--resume",
        action="append",
        metavar="FILE",
        help="take finished prompts from an earlier run's --json (same settings; repeatable: "
        "runs split by depth merge this way)",
    ),
    opt("--plot", metavar="FILE.png", help="accuracy and hit rate vs. budget, a panel per depth"),
)


def add_passkey_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``kvcxl trace passkey`` (the parser is created by the trace command)."""
    p.description = _wrap(
        "End-task quality on retrieval: seeded passkey prompts (filler text hiding a numeric "
        "pass key at each depth, then the question) for SmolLM2-135M.  Each prompt is "
        "prefilled once with the full cache; the answer is decoded greedily with the full "
        "cache and under each policy's bounded cache at each budget, after the policy "
        "observed the prefill's attention.  Reports accuracy (exact match of the pass key, "
        "95 % Wilson interval over prompts) per policy × budget × depth next to the hit rate "
        "the policy gets on the captured trace of the same prompts."
    )
    p.epilog = PASSKEY_EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_options(p, PASSKEY_OPTIONS)


def passkey_main(args: argparse.Namespace) -> int:
    """Handler of ``kvcxl trace passkey``."""
    from kvcxl.model import passkey as pk
    from kvcxl.model.capture import load_model
    from kvcxl.model.quality import PolicySpec

    specs = args.policies or [PolicySpec.parse(p) for p in _PASSKEY_POLICIES]
    config = _base_config(args.config, "max")
    settings = {
        "prompts": args.prompts,
        "depths": args.depths,
        "budgets": args.budgets,
        "policies": [s.label for s in specs],
        "min_tokens": args.min_tokens,
        "digits": args.digits,
        "seed": args.seed,
        "read_threshold": args.read_threshold,
        "answer_tokens": args.digits + 2,  # a space, the digits, one more: a longer number fails
        "config": args.config,
    }
    done: dict[tuple[float, int], dict] = {}
    for path in args.resume or []:
        if not Path(path).is_file():
            raise ValueError(f"--resume {path}: no such file (an earlier run's --json)")
    for path in [*(args.resume or []), args.json_out]:
        done.update(_resume(path, settings))
    wanted = {(d, i) for d in args.depths for i in range(args.prompts)}
    done = {k: v for k, v in done.items() if k in wanted}
    model, tok = load_model(args.threads)
    prompts = pk.generate(
        tok,
        prompts=args.prompts,
        depths=args.depths,
        min_tokens=args.min_tokens,
        seed=args.seed,
        digits=args.digits,
    )
    # Prompt-major over depths, so that a stopped run has as many prompts at every depth.
    prompts.sort(key=lambda q: (q.index, args.depths.index(q.depth)))
    todo = [q for q in prompts if (q.depth, q.index) not in done]
    runs = len(specs) * len(args.budgets)
    bar, _ = progress(len(todo) * runs, "passkey", "run")
    rows = list(done.values())
    for q in todo:
        rows.append(
            pk.run_prompt(
                model,
                tok,
                q,
                specs,
                args.budgets,
                config=config,
                answer_tokens=settings["answer_tokens"],
                read_threshold=args.read_threshold,
                tick=lambda: bar.update(1),
            )
        )
        if args.json_out:
            _write_passkey(args.json_out, settings, rows)
    bar.close()
    summary = pk.summarize(rows)
    print(
        f"{len(rows)} prompts of >= {args.min_tokens} tokens, SmolLM2-135M; accuracy Measured "
        "(95 % Wilson CI), hit rate Simulated (mean ± 95 % t CI)"
    )
    print(f"{'policy':<22}{'budget':>7}{'depth':>7}{'accuracy':>10}{'95 % CI':>16}{'hit rate':>18}")
    for s in sorted(
        summary, key=lambda s: (s["policy"] != "full", s["policy"], s["budget"], s["depth"])
    ):
        hit = "" if "hit_rate" not in s else f"{s['hit_rate']:.3f} ± {s['hit_rate_ci95'] or 0:.3f}"
        print(
            f"{s['policy']:<22}{100 * s['budget']:>6.0f}%{s['depth']:>7.2f}"
            f"{100 * s['accuracy']:>9.0f}%  [{100 * s['accuracy_lo']:>3.0f}, "
            f"{100 * s['accuracy_hi']:>3.0f}] %{hit:>18}"
        )
    if args.json_out:
        _write_passkey(args.json_out, settings, rows, summary)
        wrote(args.json_out)
    if args.plot:
        from kvcxl.model.passkey import plot

        plot(summary, args.plot)
        wrote(args.plot)
    return 0


_PASSKEY_POLICIES = ("ema", "h2o", "lru", "sink-window")
_CHOICE = ("prompts", "depths")


def _resume(path: str | None, settings: dict[str, Any]) -> dict[tuple[float, int], dict]:
    """Finished prompts of an earlier run with the same settings, by (depth, index)."""
    if not path or not Path(path).exists():
        return {}
    try:
        old = json.loads(Path(path).read_text())
    except json.JSONDecodeError:
        raise ValueError(
            f"{path}: exists and is not JSON; remove it or pick another file"
        ) from None
    # Depths and prompt counts only choose prompts; every other setting must be the same.
    same = {k: v for k, v in json.loads(json.dumps(settings)).items() if k not in _CHOICE}
    if {k: v for k, v in old.get("settings", {}).items() if k not in _CHOICE} != same:
        raise ValueError(f"{path}: holds a run with other settings; remove it or pick another file")
    return {(r["depth"], r["index"]): r for r in old.get("prompts", [])}


def _write_passkey(
    path: str, settings: dict[str, Any], rows: list[dict], summary: list[dict] | None = None
) -> None:
    out = {
        "evidence": {"accuracy": "Measured", "hit_rate": "Simulated"},
        "model": "SmolLM2-135M-Instruct",
        "settings": settings,
        "summary": summary,
        "prompts": rows,
    }
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(path)  # a stopped run never leaves half a file
