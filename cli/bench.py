"""``kvcxl bench``: speed and memory figures of every part, measured side by side in one run.

Each part lists a module in BENCH_MODULES exposing ``benches() -> dict[str, Bench]``
where a Bench is a callable ``(quick: bool) -> dict`` returning its figures
(plain JSON values; include "evidence": "Measured" and the units in the key names).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time

from kvcxl.common.jsonout import wrote

BENCH_MODULES: tuple[str, ...] = (
    "kvcxl.firmware.bench",  # score update + victim selection over one S1 context
    "kvcxl.emu.sim.bench",  # replay throughput, libCacheSim side by side
    "kvcxl.emu.device.bench",  # CXL.mem transactions/s, mailbox commands/s
    "kvcxl.tb.bench",  # RTL simulation cycles/s through the testbench (Verilator vs Icarus)
    "kvcxl.rtl.bench",  # RTL synthesis per lane count (ECP5-85F); bitstreams per board
    "kvcxl.qemu.bench",  # boot, ring round trip, guest memcpy
    "kvcxl.model.bench",  # trace capture tokens/s and peak memory
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure speed and memory of every part; JSON out",
        description=(
            "Runs the benchmarks of every part in one process and prints their "
            "figures (all Measured on this machine). --list shows what exists."
        ),
    )
    p.add_argument("--json", dest="json_out", help="write all figures to this JSON file")
    p.add_argument("--only", action="append", help="run only benchmarks whose name contains this")
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    p.add_argument("--list", action="store_true", help="list benchmarks and exit")
    p.set_defaults(func=_run)


def collect() -> dict:
    found: dict = {}
    for name in BENCH_MODULES:
        found.update(importlib.import_module(name).benches())
    return found


def _run(args: argparse.Namespace) -> int:
    benches = collect()
    if args.list:
        for name in benches:
            print(name)
        return 0
    selected = {k: v for k, v in benches.items() if not args.only or any(o in k for o in args.only)}
    if not selected:
        raise ValueError(f"no benchmark matches {args.only}; see `kvcxl bench --list`")
    out = {
        "evidence": "Measured",
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "quick": args.quick,
        "results": {},
    }
    for name, fn in selected.items():
        t0 = time.perf_counter()
        print(f"bench {name} ...", flush=True)
        res = fn(args.quick)
        res["bench_wall_s"] = round(time.perf_counter() - t0, 3)
        out["results"][name] = res
        print(json.dumps({name: res}, indent=2), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=2)
        wrote(args.json_out)
    return 0
