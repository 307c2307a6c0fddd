"""``kvcxl rtl``: Verilog export, formal checks and FPGA synthesis (``test``, the testbench, is
added to the group by :mod:`kvcxl.cli.tb`).

Only the standard library is imported here; Amaranth, cocotb and the YoWASP tools
load inside the handlers so that ``kvcxl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvcxl.common.argtypes import nonnegative, positive, positive_float
from kvcxl.common.jsonout import emit, wrote
from kvcxl.common.options import Group, Option, add_parser, opt
from kvcxl.rtl.designs import CHECKS, DEFECTS, DESIGNS, ENGINE_KEYS, SHAPE_OPTIONS

# The markers of the cost table's place in a markdown page.
COST_BEGIN = "<!-- kvcxl rtl cost: begin -->"
COST_END = "<!-- kvcxl rtl cost: end -->"


def shape_options(entries: int, lanes: int, batch: int, when: str = "") -> tuple[Option, ...]:
    """The engine-shape options with these defaults (``when``: a prefix of each help)."""
    return (
        opt(
            "--entries",
            type=positive,
            default=entries,
            help=f"{when}entry records held on chip (a multiple of --lanes; default {entries})",
        ),
        opt(
            "--lanes",
            type=positive,
            default=lanes,
            help=f"{when}entries scored per clock cycle (default {lanes})",
        ),
        opt(
            "--batch",
            type=positive,
            default=batch,
            help=f"{when}most victims per eviction pass, the hardware top-k (default {batch})",
        ),
    )


RTL_PARSER = dict(
    help="the policy engine in Amaranth HDL: Verilog, formal checks, synthesis, testbenches",
    description=(
        "The scoring and eviction engines as RTL, matching kvcxl.firmware's Q0.16 integer "
        "mode bit for bit. `verilog` writes the design, `formal` runs bounded proofs "
        "(yowasp-sby), `synth` places and routes it for an FPGA (YoWASP yosys + nextpnr) "
        "and `test` runs the cocotb + pyuvm testbench on Verilator or Icarus."
    ),
    epilog="Example: kvcxl rtl synth --target ecp5 --lanes 4 --json synth.json",
)
JSON_FIGURES = opt("--json", dest="json_out", help="write the figures to this JSON file")
JSON_RESULTS = opt("--json", dest="json_out", help="write the results to this JSON file")


def _design_shape(name: str) -> Option:
    """--NAME: one shape option of `verilog`, its default per design."""
    takes = {d.name: d.defaults[name] for d in DESIGNS.values() if name in d.defaults}
    return opt(
        f"--{name}",
        type=positive,
        help="default per design (rtl/designs.py): "
        + ", ".join(f"{n} {x}" for n, x in takes.items()),
    )


VERILOG_PARSER = dict(
    help="write the design as Verilog",
    description="Write Verilog for the design (and its FuseSoC .core file).",
)
VERILOG_OPTIONS = (
    opt("-o", "--out", default="build/rtl", help="output folder (default build/rtl)"),
    opt(
        "--design",
        choices=tuple(DESIGNS),
        default="core",
        help="; ".join(f"{d.name} = {d.summary}" for d in DESIGNS.values()) + " (default core)",
    ),
    *(_design_shape(name) for name in SHAPE_OPTIONS),
)
FORMAL_PARSER = dict(
    help="bounded model checks with yowasp-sby",
    description=(
        "Bounded proofs at reduced widths. eviction: every victim eligible and of "
        "maximal priority, no victim twice, victims in order, k free between passes. "
        "scoring: no beat lost or duplicated under back-pressure, eligible = resident "
        "and not pinned. frontend: every accepted CXL.mem message answered exactly "
        "once with its tag, none invented, responses held under back-pressure. hdm: "
        "the RTL's HPA to DPA decode equals a reference built from the emulator's "
        "decoder parameters for every address and legal programming. --defect plants "
        "a bug to show that its check catches it (that run is expected to FAIL)."
    ),
    epilog="Example: kvcxl rtl formal --defect drop_on_stall",
)
FORMAL_OPTIONS = (
    opt("--check", choices=("all", *CHECKS), default="all"),
    opt("--depth", type=positive, help="BMC depth in cycles (default per check)"),
    opt(
        "--defect",
        nargs="?",
        const="tie_off_by_one",
        choices=tuple(DEFECTS),
        help=(
            "plant a defect and run only the check that must catch it: "
            + ", ".join(f"{d} ({c})" for d, c in DEFECTS.items())
            + "; without a name, tie_off_by_one"
        ),
    ),
    JSON_RESULTS,
)
SYNTH_PARSER = dict(
    help="synthesise, place and route for ECP5 or iCE40",
    description=(
        "YoWASP yosys + nextpnr; prints LUTs, FFs, block RAMs, DSPs and Fmax (parsed from "
        "nextpnr's report: it exits 0 even when timing fails) and the entry updates/s "
        "that lanes × Fmax gives."
    ),
)
SYNTH_OPTIONS = (
    opt(
        "--target",
        default="ecp5",
        choices=("ecp5", "ecp5-85k", "ice40", "ice40-up5k"),
        help="ecp5 = LFE5U-25F out of context; ice40 = HX8K behind a serial wrapper",
    ),
    *shape_options(1024, 1, 64),
    opt(
        "--design",
        choices=tuple(DESIGNS),
        default="core",
        help="the design to place and route (default core; shape options it does not take "
        "are ignored)",
    ),
    opt("--freq", type=positive_float, default=50.0, help="target clock in MHz (default 50)"),
    opt("--seed", type=nonnegative, default=1, help="nextpnr placement seed"),
    JSON_FIGURES,
)
COST_PARSER = dict(
    help="the engines' cost table: every engine placed and routed, beside its hit rate",
    description=(
        "Every engine (EMA 1 and 4 lanes, EMA with its records in DRAM, CLOCK, SIEVE, "
        "S3-FIFO, the CXL.mem front end) synthesised "
        "and placed and routed for the ECP5-85F and the smallest iCE40 that holds it, "
        "seed 1, target 100 MHz: LUTs, FFs, block RAMs, DSPs and Fmax (Measured), the "
        "updates/s that Fmax × lanes gives (Analytical model) and the policy's hit rate "
        "at mid (Simulated, read from docs/validation.md). Results are cached under "
        "~/.cache/kvcxl/synth by a fingerprint of the Verilog and the tools, so a rerun "
        "places only what changed."
    ),
    epilog="Example: kvcxl rtl cost --out docs/rtl.md --json out/rtl-cost.json",
)
COST_OPTIONS = (
    opt(
        "--out",
        dest="md_out",
        help="write the markdown table here; a file holding the markers "
        f"{COST_BEGIN!r} … {COST_END!r} has only the text between them replaced",
    ),
    opt("--only", help="comma-separated engines (default all): " + ", ".join(ENGINE_KEYS)),
    opt("--target", choices=("all", "ecp5", "ice40"), default="all", help="families to run"),
    opt("--cache", help="the results cache (default ~/.cache/kvcxl/synth)"),
    opt(
        "--cached",
        action="store_true",
        help="place nothing: the table from the cache alone, 'not run' where it has no result",
    ),
    JSON_FIGURES,
)
BITSTREAM_PARSER = dict(
    help="build the board top (engine + UART host link) for a real FPGA board",
    description=(
        "Builds the policy core behind a UART command link for a board of amaranth-boards "
        "(yosys, nextpnr, ecppack/icepack from YoWASP), checks that yowasp-ecpunpack or "
        "yowasp-iceunpack reads the bitstream back, and prints LUTs, FFs, block RAMs, DSPs "
        "and Fmax (parsed from nextpnr's report). Load it with openFPGALoader, then talk to "
        "it with `kvcxl rtl host --port DEV`."
    ),
    epilog="Example: kvcxl rtl bitstream --board icebreaker -o build/icebreaker",
)
BOARDS = ("ulx3s-85f", "icebreaker")  # the keys of kvcxl.rtl.board.BOARDS (no amaranth here)
BITSTREAM_OPTIONS = (
    opt("--board", required=True, choices=BOARDS, help="the FPGA board"),
    opt("-o", "--out", help="output folder (default build/bitstream/BOARD)", default=None),
    opt("--seed", type=nonnegative, default=1, help="nextpnr placement seed"),
    JSON_FIGURES,
)
HOST_PARSER = dict(
    help="drive a board over its serial link: load records, run passes, read victims",
    description=(
        "The host side of the board's UART protocol (docs/rtl.md). Asks the board its "
        "shape, loads the decay table, the policy parameters (defaults of "
        "kvcxl.firmware.config) and seeded random records, runs --steps passes of random "
        "attention and reads each pass's victims; --check compares them with the "
        "firmware's integer mode. --sim runs the same driver against the Verilated board "
        "top through a pseudo-terminal instead of a device."
    ),
    epilog="Example: kvcxl rtl host --port /dev/ttyUSB0 --steps 20 --check",
)
HOST_OPTIONS = (
    Group(
        None,
        (
            opt("--port", help="serial device (/dev/ttyUSB0) or a pyserial URL"),
            opt(
                "--sim",
                action="store_true",
                help="the Verilated board top (built once; shape from --entries/--lanes/--batch)",
            ),
        ),
        exclusive=True,
        required=True,
    ),
    opt("--baud", type=positive, default=115200, help="baud rate (default 115200)"),
    opt("--timeout", type=positive_float, default=2.0, help="seconds to wait for a reply"),
    opt("--steps", type=positive, default=8, help="passes to run (default 8)"),
    opt("--seed", type=nonnegative, default=1, help="seed of records and attention"),
    opt("--check", action="store_true", help="compare the victims with the firmware (exit 1)"),
    *shape_options(64, 1, 8, when="with --sim: "),  # a board reports its own shape
    JSON_RESULTS,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rtl", **RTL_PARSER)
    rs = p.add_subparsers(dest="rtl_command", metavar="ACTION")
    add_parser(rs, "verilog", VERILOG_OPTIONS, func=_verilog, **VERILOG_PARSER)
    add_parser(rs, "formal", FORMAL_OPTIONS, func=_formal, **FORMAL_PARSER)
    add_parser(rs, "synth", SYNTH_OPTIONS, func=_synth, **SYNTH_PARSER)
    add_parser(rs, "cost", COST_OPTIONS, func=_cost, **COST_PARSER)
    # `bitstream` and `host`: the board top behind its UART link (rtl/board.py)
    add_parser(rs, "bitstream", BITSTREAM_OPTIONS, func=_bitstream, **BITSTREAM_PARSER)
    add_parser(rs, "host", HOST_OPTIONS, func=_host, **HOST_PARSER)
    # kvcxl.cli.tb adds `test` (the testbench) to this group: the RTL does not import it.
    p.set_defaults(func=lambda a: (p.print_help(), 0)[1], rtl_actions=rs)


def actions(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The ACTION subparsers of ``kvcxl rtl`` (after :func:`register`), for a part that adds
    an action to the group without the RTL importing it (the testbench adds ``test``)."""
    return sub.choices["rtl"].get_default("rtl_actions")


def _verilog(args) -> int:
    from kvcxl.rtl.designs import get
    from kvcxl.rtl.export import CORE_FILE, to_verilog, verilog_params, write_if_changed

    design = get(args.design)
    params = verilog_params(args.design, **{k: getattr(args, k) for k in SHAPE_OPTIONS})
    out = Path(args.out)
    path = out / f"{design.module}.v"
    write_if_changed(path, to_verilog(design.factory(**params), design.module))
    if CORE_FILE.exists() and args.design == "core":
        write_if_changed(out / CORE_FILE.name, CORE_FILE.read_text())
    wrote(path)
    return 0


def _formal(args) -> int:
    from kvcxl.rtl.formal import run

    checks = CHECKS if args.check == "all" else (args.check,)
    if args.defect:
        owner = DEFECTS[args.defect]
        if args.check not in ("all", owner):
            raise ValueError(
                f"--defect {args.defect} is caught by the {owner} check, not --check {args.check}"
            )
        checks = (owner,)
    results = []
    for c in checks:
        print(
            f"formal {c}{f' (defect {args.defect} planted)' if args.defect else ''} ...", flush=True
        )
        r = run(c, depth=args.depth, defect=args.defect)
        print(f"  {r.status} at depth {r.depth} in {r.seconds:.1f} s", flush=True)
        if r.status not in ("PASS", "FAIL"):
            print(r.log_tail, file=sys.stderr)
        results.append(r.as_dict())
    emit({"evidence": "Measured", "checks": results}, args.json_out)
    ok = all(r["status"] == ("FAIL" if r["params"].get("defect") else "PASS") for r in results)
    return 0 if ok else 1


def _synth(args) -> int:
    from kvcxl.rtl.synth import SynthConfig, run

    cfg = SynthConfig(
        args.target, args.entries, args.lanes, args.batch, args.freq, args.seed, args.design
    )
    print(
        f"synth {args.design} on {args.target}: entries {args.entries}, lanes {args.lanes}, "
        f"batch {args.batch} ...",
        flush=True,
    )
    emit(run(cfg), args.json_out)
    return 0


def _cost(args) -> int:
    from kvcxl.rtl.cost import collect, markdown

    keys = tuple(k.strip() for k in args.only.split(",")) if args.only else None
    if keys and set(keys) - set(ENGINE_KEYS):
        raise ValueError(f"--only {args.only}: engines are {', '.join(ENGINE_KEYS)}")
    targets = ("ecp5", "ice40") if args.target == "all" else (args.target,)
    cache = Path(args.cache) if args.cache else None
    doc = collect(
        keys, cache, targets=targets, log=lambda s: print(s, flush=True), cached_only=args.cached
    )
    table = markdown(doc)
    if args.md_out:
        out = Path(args.md_out)
        text = out.read_text() if out.exists() else ""
        if COST_BEGIN in text and COST_END in text:
            a, b = text.index(COST_BEGIN) + len(COST_BEGIN), text.index(COST_END)
            text = text[:a] + "\n" + table + text[b:]
        else:
            text = table
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        wrote(out)
    else:
        print(table)
    emit(doc, args.json_out) if args.json_out else None
    return 0


def _bitstream(args) -> int:
    from kvcxl.rtl.bitstream import build

    out = Path(args.out or f"build/bitstream/{args.board}")
    print(f"bitstream {args.board} in {out} ...", flush=True)
    emit(build(args.board, out, seed=args.seed), args.json_out)
    return 0


def _host(args) -> int:
    from contextlib import nullcontext

    from kvcxl.rtl.host import Link, open_port, run_script

    if args.sim:
        from kvcxl.rtl.board import EngineShape
        from kvcxl.rtl.board_sim import serve

        shape = EngineShape(args.entries, args.lanes, args.batch)
        shape.check()
        where = serve(shape)
    else:
        where = nullcontext(args.port)
    with where as dev:
        port = open_port(dev, args.baud, args.timeout)
        res = run_script(Link(port), steps=args.steps, seed=args.seed, check=args.check)
    res["evidence"] = "Simulated" if args.sim else "Measured"
    res["port"] = "sim" if args.sim else args.port
    emit(res, args.json_out)
    if args.check and res["mismatches"]:
        from kvcxl.rtl.host import LinkError

        first = res["first_mismatches"][0]
        raise LinkError(
            f"--check: {res['mismatches']} of {args.steps} passes differ from the firmware's "
            f"integer mode (pass {first['pass']}: victims {first['got']}, want {first['want']})"
        )
    return 0
