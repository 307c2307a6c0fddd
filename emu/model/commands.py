"""``kvcxl quality`` and ``kvcxl calibrate``: the real model under bounded KV caches.

(``kvcxl trace capture`` lives under the ``trace`` command; its options and handler
are in :mod:`kvcxl.emu.model.capture`.)  Only the standard library is imported here;
torch and numpy load inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from ..argtypes import positive, unit_interval

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
output quality is Measured (the real model re-run with the bounded cache).
"""


def _wrap(text: str) -> str:
    return textwrap.fill(text, 88)


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser(
        "quality",
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
    q.add_argument("--trace", required=True, help="a trace from `kvcxl trace capture`")
    q.add_argument(
        "--policy",
        action="append",
        metavar="P",
        help="policy (repeatable; default: ema h2o lru sink-window window)",
    )
    q.add_argument(
        "--budget",
        action="append",
        metavar="B",
        help="tokens per KV head, a percentage of the sequence, or 'all' (repeatable; "
        "default 64 and 128)",
    )
    q.add_argument("--config", metavar="FILE.toml", help="base policy configuration")
    q.add_argument(
        "--max-tokens", type=positive, metavar="N", help="use only the first N tokens of the trace"
    )
    q.add_argument("--threads", type=positive, default=1, help="torch CPU threads (default 1)")
    q.add_argument(
        "--json",
        dest="json_out",
        metavar="FILE",
        help="write the summary and every step's KL, top-1 agreement and bounded flag as JSON",
    )
    q.add_argument("--plot", metavar="FILE.png", help="KL and top-1 vs budget, one line per policy")
    q.set_defaults(func=_quality)

    c = sub.add_parser(
        "calibrate",
        help="joint α × β (then keep/evict) sweep of the seed's policy on real traces",
        description=_wrap(
            "The design's calibration (docs/calibration.md): sweep α × β of the ema policy "
            "on captured traces, "
            "scored by hit rate at a fixed HBM budget (trace replay with demand paging) and "
            "by output quality (the real model re-run with the bounded cache); then sweep the "
            "keep/evict thresholds and the touch threshold at the best (α, β). Writes heat "
            "maps (PNG), a JSON report and the best point with its 95 % confidence interval "
            "over prompts."
        ),
        epilog=CALIBRATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--trace", action="append", required=True, help="captured trace (repeatable)")
    c.add_argument("--alpha", default="0.02,0.05,0.1,0.2,0.4", help="comma-separated α values")
    c.add_argument("--beta", default="0.0001,0.001,0.01,0.1", help="comma-separated β values")
    c.add_argument("--budget", default="128", help="HBM budget in tokens per KV head (default 128)")
    c.add_argument(
        "--read-threshold",
        type=unit_interval,
        default=0.01,
        help="hit-rate replay: an entry is read in a step when its weight is at least this "
        "(sparse, Quest-like selection; default 0.01)",
    )
    c.add_argument("--keep", default="0.02,0.05,0.1,0.2", help="keep thresholds to sweep")
    c.add_argument("--evict", default="0.005,0.01,0.02,0.05", help="evict thresholds to sweep")
    c.add_argument(
        "--touch",
        default="0.001,0.005,0.01,0.02,0.05",
        help="touch thresholds to sweep at the best (α, β) by hit rate (a read lighter than "
        "this does not reset the idle count)",
    )
    c.add_argument(
        "--no-quality", action="store_true", help="score by hit rate only (no model runs)"
    )
    c.add_argument("--max-tokens", type=positive, metavar="N", help="use only the first N tokens")
    c.add_argument("--config", metavar="FILE.toml", help="base policy configuration")
    c.add_argument("--threads", type=positive, default=1, help="torch CPU threads (default 1)")
    c.add_argument("--out", default="calibration", help="output folder (JSON + PNG heat maps)")
    c.add_argument("--json", dest="json_out", metavar="FILE", help="also write the JSON here")
    c.set_defaults(func=_calibrate)


def _load_measured(path: str, max_tokens: int | None) -> tuple[Any, list[int]]:
    from ..trace import Trace
    from .weights import GGUF_SHA256, MODEL_NAME

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
    from .capture import load_model
    from .quality import PolicySpec, evaluate, parse_budget

    trace, tokens = _load_measured(args.trace, args.max_tokens)
    specs = [PolicySpec.parse(p) for p in (args.policy or _DEFAULT_POLICIES)]
    budgets = [parse_budget(b, len(tokens)) for b in (args.budget or ["64", "128"])]
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
        print(f"wrote {args.json_out}")
    if args.plot:
        _plot_quality(rows, args.plot, Path(args.trace).name)
        print(f"wrote {args.plot}")
    return 0


_DEFAULT_POLICIES = ("ema", "h2o", "lru", "sink-window", "window")


def _plot_quality(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _calibrate(args: argparse.Namespace) -> int:
    from . import calibrate as cal

    return cal.main(args, _load_measured, _base_config)
