"""``kvcxl trace import``: a published request trace read, validated and checked by its own
facts, and written as a kvcxl trace (docs/trace-format.md, "Mooncake arrivals")."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from ..shape import ModelShape

FORMATS = ("mooncake",)
DESCRIPTION = """\
Read a Mooncake request trace (FAST'25 release: arrival time, input and output length,
512-token prefix-block hashes), validate every line (a bad one is named by file, line and
field) and print its facts: requests, tokens, 512-token block reads, distinct blocks and the
infinite-cache block hit ratio (a hit: a read of a block seen before), for the whole file
and for the window that --steps replays.  SOURCE is a bundled trace (conversation,
synthetic: the project's copy, Apache-2.0, in emu/workloads/data/mooncake/) or a
.jsonl / .jsonl.xz file.  With -o the window is compiled as the workload `mooncake` is
(per-head attention from the fitted synthetic generator; --seed chooses it) and written as
a version-2 kvcxl trace that `kvcxl simulate --trace` replays.

examples:
  kvcxl trace import --format mooncake conversation --json
  kvcxl trace import --format mooncake synthetic --steps 300 -o mooncake-syn.npz
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="conversation, synthetic, or a file")
    p.add_argument("--format", choices=FORMATS, required=True, help="the trace's format")
    p.add_argument("-o", "--output", metavar="FILE.npz", help="write the window as a trace")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")


def main(args: argparse.Namespace, shape: ModelShape, params: dict[str, Any]) -> int:
    from ..workloads import compile_workload
    from ..workloads.mooncake import Mooncake, read_requests, trace_facts

    requests = read_requests(args.source)
    wl = Mooncake(shape, seed=args.seed, requests=requests, **params)
    window = wl.window(args.steps)
    out: dict[str, Any] = {
        "evidence": "Measured (the published trace's own fields, counted)",
        "source": args.source,
        "trace": trace_facts(requests),
        "window": {
            "steps": args.steps,
            "step_ms": wl.step_ms,
            "token_scale": wl.token_scale,
            "truncated_requests": wl.truncated(args.steps),
            **(trace_facts(window) if window else {"requests": 0}),
        },
    }
    if args.output:
        stream = compile_workload(wl, args.steps, read=args.read)
        trace = replace(
            stream.to_trace(), source=f"Mooncake {args.source}, first {args.steps} steps"
        )
        trace.save(args.output)
        info = trace.info()
        out["output"] = {
            "file": args.output,
            "evidence": trace.evidence,
            "records": info["records"],
            "write_records": info["write_records"],
        }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(format_facts(out))
    return 0


def format_facts(out: dict[str, Any]) -> str:
    """The facts as aligned lines: the whole trace, then the replayed window."""
    lines = [f"{out['source']}: {out['evidence']}"]
    for part in ("trace", "window"):
        lines.append(f"{part}:")
        for k, v in out[part].items():
            text = f"{v:,.4f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else v
            lines.append(f"  {k:<26} {text}")
    if "output" in out:
        o = out["output"]
        lines.append(
            f"wrote {o['file']}: {o['records']:,} reads, {o['write_records']:,} writes "
            f"(evidence {o['evidence']}: the attention is synthetic)"
        )
    return "\n".join(lines)
