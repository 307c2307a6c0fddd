"""``kvcxl rtl test``: the cocotb + pyuvm testbench, added to the ``kvcxl rtl`` group.

The testbench depends on the RTL and not the other way round, so this module (not
:mod:`kvcxl.cli.rtl`) registers the action; it is listed after the RTL's in
``kvcxl.cli.main.COMMAND_MODULES``.  Only the standard library loads here; cocotb
loads inside the handler so that ``kvcxl --help`` stays fast.
"""

from __future__ import annotations

import argparse

from kvcxl.cli.rtl import actions, shape_options
from kvcxl.common.argtypes import nonnegative, positive, positive_float
from kvcxl.common.jsonout import emit, wrote
from kvcxl.common.options import add_parser, opt
from kvcxl.common.progress import progress
from kvcxl.common.sizes import BYTES, budget_arg
from kvcxl.rtl.designs import DESIGNS

TEST_PARSER = dict(
    help="run the cocotb + pyuvm testbench",
    description=(
        "Random steps with back-pressure, corner-case table rewrites and parameter "
        "changes; every output checked against kvcxl.firmware's integer mode. The seed is "
        "printed; pass it back with --seed to replay."
    ),
)
TEST_OPTIONS = (
    opt("--sim", choices=("verilator", "icarus"), default="verilator"),
    opt(
        "--design",
        choices=tuple(n for n, d in DESIGNS.items() if d.bench),
        default="core",
        help="the design whose bench runs (rtl/designs.py; default core, the pyuvm test; "
        "the shape options and --waves/--defect are core's)",
    ),
    opt(
        "--steps",
        type=positive,
        help="how long the bench runs: "
        + ", ".join(
            f"{n}: {d.bench_count[0]} (default {d.bench_count[1]})"
            for n, d in DESIGNS.items()
            if d.bench
        ),
    ),
    opt("--seed", type=nonnegative, help="random seed (default: fresh, printed)"),
    opt("--waves", action="store_true", help="write a waveform file (VCD / FST)"),
    opt("--defect", action="store_true", help="plant the tie-break defect"),
    *shape_options(16, 4, 4),
    opt("--json", dest="json_out", help="write the figures to this JSON file"),
)
# The defects `rtl sim --defect NAME` plants, by engine (policy, or ema's --records), the
# first the default: each design's replay defects (rtl/designs.py), and before the
# RecordStreamEngine's the DRAM model's stale_read (rtl/verilated_records.py).
SIM_DEFECTS: dict[str, tuple[str, ...]] = {
    d.sim_policy: (("stale_read",) if d.sim_policy == "ema --records dram" else ()) + d.replay
    for d in DESIGNS.values()
    if d.sim_policy
}


def sim_defect(policy: str, records: str, name: str | None, data_first: bool) -> str | None:
    """The defect ``--defect [NAME]`` plants in this engine (None: no --defect); a name the
    engine does not have, or early_done where no DRAM would show it, is refused."""
    if name is None:
        return None
    key = "ema --records dram" if policy == "ema" and records == "dram" else policy
    valid = SIM_DEFECTS[key]
    if name and name not in valid:
        raise ValueError(f"--defect {name}: {key} plants one of {', '.join(valid)}")
    if name == "early_done" and not data_first:
        # a DRAM taking each write command before its data has taken them all by the
        # sweep's last word: the early end loses nothing there
        raise ValueError("--defect early_done shows only behind --dram-data-first")
    return name or valid[0]


SIM_PARSER = dict(
    help="replay a whole trace with the Verilated RTL choosing every victim",
    description=(
        "Replays a trace (.npz: `kvcxl trace export`, `kvcxl trace capture`) as the "
        "simulator does (demand paging, writes, pinning, the overflow evicted in passes of "
        "at most --batch), with the PolicyEngine (CXL.mem front end, scoring, eviction, "
        "prefetch) compiled by Verilator doing the scoring and the victim choice, driven "
        "through its valid/ready ports by a C++ driver. A trace with more entries than "
        "--entries is split into tables of that size, swapped in by the host (docs/rtl.md). "
        "--check runs the firmware's integer mode beside it and stops at the first pass "
        "whose victims differ (exit 1), printing the step, the entry and both priorities. "
        "The model is built once per design and cached in ~/.cache/kvcxl/rtl-harness."
    ),
    epilog=(
        "Example: kvcxl trace export --workload cyclic --steps 16 -o c.npz && "
        "kvcxl rtl sim --trace c.npz --budget 25% --check --dump-victims v.csv"
    ),
)
SIM_OPTIONS = (
    opt("--trace", required=True, metavar="FILE", help="a kvcxl trace (.npz)"),
    opt(
        "--budget",
        type=budget_arg(BYTES),
        default="25%",
        help="HBM budget: a size (512MiB) or %% of the trace's KV bytes (default 25%%)",
    ),
    *shape_options(1024, 4, 64),
    opt(
        "--policy",
        choices=("ema", "clock", "sieve", "s3fifo"),
        default="ema",
        help="ema: the PolicyEngine (scoring + top-k); clock, sieve, s3fifo: the slot-queue "
        "engine with --entries slots (one per resident entry; --lanes and --batch do not "
        "apply; s3fifo's ghost holds the trace's entry ids)",
    ),
    opt(
        "--records",
        choices=("chip", "dram"),
        default="chip",
        help="ema: where the engine keeps its entry records: chip (the PolicyEngine, "
        "--entries a table) or dram (the RecordStreamEngine streaming them in bursts from a "
        "DRAM model in the C++ harness, sized to the trace's record count; --entries does "
        "not apply)",
    ),
    opt(
        "--dram-latency",
        type=nonnegative,
        default=20,
        help="--records dram: cycles from a read burst's command to its first word (default 20)",
    ),
    opt(
        "--dram-bytes",
        type=positive_float,
        default=None,
        help="--records dram: DRAM bytes a cycle, reads and writes together (default two "
        "record words a cycle, never the bound)",
    ),
    opt(
        "--dram-depth",
        type=positive,
        default=4,
        help="--records dram: bursts in flight per direction (default 4)",
    ),
    opt(
        "--dram-data-first",
        action="store_true",
        help="--records dram: the DRAM takes a burst's write data before its command (AXI "
        "allows it): it holds every word the engine offers and takes a write command only "
        "once it holds all that burst's words, so a sweep's last write command comes after "
        "its last word (default: it takes each write command before the burst's data)",
    ),
    opt(
        "--burst",
        type=positive,
        default=16,
        help="--records dram: words a burst (default 16)",
    ),
    opt(
        "--clock-bits",
        type=positive,
        help="CLOCK's counter width in bits, 1 to 8 (the firmware's clock_bits; default its "
        "default)",
    ),
    opt(
        "--check",
        action="store_true",
        help="compare every eviction pass with the firmware's integer mode; stop at the first "
        "difference",
    ),
    opt(
        "--boundary",
        action="store_true",
        help="ema: also plan every step boundary of the replay's managed tiers (CXL DRAM <-> "
        "NVMe moves) with the Verilated TierBoundary engine (cocotb) and compare each with the "
        "firmware's moves (exit 1 on a difference)",
    ),
    opt(
        "--defect",
        nargs="?",
        const="",
        metavar="NAME",
        help="plant a defect (--check must stop); without a name, each engine's first: "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in SIM_DEFECTS.items())
        + ". stale_read: the DRAM model answers each read burst's first word with the word "
        "before; early_done (with --dram-data-first): a sweep ends before its last write "
        "command is sent",
    ),
    opt(
        "--eviction-passes",
        choices=("exact", "batched"),
        default="exact",
        help="the firmware's eviction passes (docs/policy.md): 'batched' evicts a whole "
        "--batch per pass (eviction_batch = --batch), possibly past the overflow",
    ),
    opt(
        "--dump-victims",
        metavar="FILE",
        help="write every eviction as CSV, in `kvcxl simulate --dump-victims` format",
    ),
    opt("--json", dest="json_out", help="write the figures to this JSON file"),
    opt("--no-progress", action="store_true", help="no progress bar"),
)


def register(sub: argparse._SubParsersAction) -> None:
    add_parser(actions(sub), "test", TEST_OPTIONS, func=_test, **TEST_PARSER)
    add_parser(actions(sub), "sim", SIM_OPTIONS, func=_sim, **SIM_PARSER)


def _test(args: argparse.Namespace) -> int:
    from kvcxl.tb.runner import run_core, run_unit

    if args.design != "core":
        if args.defect or args.waves:
            raise ValueError(f"--defect and --waves run the core bench, not --design {args.design}")
        emit(run_unit(args.design, args.sim, seed=args.seed, count=args.steps), args.json_out)
        return 0
    n = args.steps or DESIGNS["core"].bench_count[1]
    res = run_core(
        args.sim,
        entries=args.entries,
        lanes=args.lanes,
        batch=args.batch,
        steps=n,
        seed=args.seed,
        defect="tie_off_by_one" if args.defect else None,
        waves=args.waves,
    )
    emit(res, args.json_out)
    return 0


def _sim(args: argparse.Namespace) -> int:
    import sys

    from kvcxl.cli.sim import _dump_victims
    from kvcxl.emu.trace import Trace
    from kvcxl.emu.workloads.stream import from_trace
    from kvcxl.rtl import toolchain
    from kvcxl.rtl.verilated import EngineShape
    from kvcxl.tb.trace_sim import run_stream

    slots = args.policy != "ema"
    if args.entries % args.lanes and not slots:
        raise ValueError(f"--entries {args.entries} must be a multiple of --lanes {args.lanes}")
    planted = defect = sim_defect(args.policy, args.records, args.defect, args.dram_data_first)
    toolchain.require("verilator")
    stream = from_trace(Trace.load(args.trace))
    if args.clock_bits is not None and args.policy != "clock":
        raise ValueError(f"--clock-bits {args.clock_bits} applies to --policy clock only")
    if args.boundary and slots:
        raise ValueError("--boundary applies to --policy ema (managed tiers need a scored policy)")
    if slots and args.eviction_passes != "exact":
        raise ValueError(f"--eviction-passes {args.eviction_passes} applies to --policy ema only")
    if args.dram_data_first and args.records != "dram":
        raise ValueError(f"--dram-data-first applies to --records dram (not {args.records})")
    dram = None
    if args.records == "dram":
        if slots or args.boundary:
            raise ValueError("--records dram applies to --policy ema, without --boundary")
        from kvcxl.rtl.verilated_records import DramShape

        # stale_read is the DRAM model's; the others the engine's (rtl/record_stream.py)
        dram = DramShape(args.dram_latency, args.dram_bytes, args.dram_depth, args.burst,
                         defect if defect == "stale_read" else None,
                         args.dram_data_first)  # fmt: skip
        defect = None if defect == "stale_read" else defect
    shape = EngineShape(args.entries, 1 if slots else args.lanes, args.batch, defect)
    what = (
        f"{args.policy} engine, {shape.entries} slots"
        if slots
        else f"PolicyEngine {shape.entries} entries, {shape.lanes} lanes, batch {shape.batch}"
    )
    if dram is not None:
        what = (
            f"RecordStreamEngine {stream.n_entries} entries in DRAM, {shape.lanes} lanes, "
            f"batch {shape.batch}; DRAM latency {dram.latency}, bursts of {dram.burst}, "
            f"{dram.depth} in flight, {dram.bytes_per_cycle or 'two words'} B/cycle"
            + (", write data first" if dram.data_first else "")
        )
    print(
        f"rtl sim: {args.trace}, {stream.n_entries} entries, budget {args.budget}; Verilator "
        f"{what}" + (f", defect {planted} planted" if planted else ""),
        file=sys.stderr,
        flush=True,
    )
    bar, update = progress(len(stream.ev_kind), "rtl sim", "event", off=args.no_progress)
    try:
        from kvcxl.firmware.config import PolicyConfig

        config = None  # exact: the firmware's defaults, as before
        if args.eviction_passes == "batched":
            config = PolicyConfig(eviction_passes="batched", eviction_batch=args.batch)
        if args.clock_bits is not None:
            config = PolicyConfig().with_(clock_bits=args.clock_bits)
        from contextlib import nullcontext

        from kvcxl.tb.tier_boundary_model import recording

        found: list = []  # the replay's step boundaries (--boundary)
        with recording(found) if args.boundary else nullcontext():
            res = run_stream(
                stream, args.budget, shape, check=args.check, config=config,
                progress=update, policy=args.policy, dram=dram,
            )  # fmt: skip
    finally:
        bar.close()
    victims = res.pop("victims")
    if args.dump_victims:
        row = {"seed": 0, "policy": args.policy, "budget": str(args.budget), "_victims": victims}
        _dump_victims([row], args.dump_victims)
        wrote(args.dump_victims)
    keys = ("budget_entries", "reads", "hits", "misses", "hit_rate")
    out = {"evidence": "Simulated", "trace": args.trace, **{k: res[k] for k in keys}}
    out["evictions"] = int(victims["entry"].size)
    out["rtl"] = res["rtl"]
    if args.check:
        out["check"] = (
            f"every pass equal to the firmware's {args.policy}"
            if slots
            else "every pass equal to the firmware's integer mode"
        )
    if args.boundary:
        from kvcxl.tb.tier_boundary_model import run_boundaries

        b = run_boundaries(found, "verilator")
        keys = ("trace_boundaries", "moving_boundaries", "sweeps", "downs", "ups",
                "moves_checked", "mismatches", "cycles", "build_s", "run_s")  # fmt: skip
        out["boundary"] = {"evidence": "Simulated (Verilator)", **{k: b[k] for k in keys}}
    emit(out, args.json_out)
    return 0
