"""``kvcxl rtl test``: the cocotb + pyuvm testbench, added to the ``kvcxl rtl`` group.

The testbench depends on the RTL and not the other way round, so this module (not
:mod:`kvcxl.rtl.commands`) registers the action; it is listed after the RTL's in
``kvcxl.emu.cli.COMMAND_MODULES``.  Only the standard library loads here; cocotb
loads inside the handler so that ``kvcxl --help`` stays fast.
"""

from __future__ import annotations

import argparse

from kvcxl.rtl.commands import actions, add_shape, emit, nonnegative, positive


def register(sub: argparse._SubParsersAction) -> None:
    t = actions(sub).add_parser(
        "test",
        help="run the cocotb + pyuvm testbench",
        description=(
            "Random steps with back-pressure, corner-case table rewrites and parameter "
            "changes; every output checked against kvcxl.firmware's integer mode. The seed is "
            "printed; pass it back with --seed to replay."
        ),
    )
    t.add_argument("--sim", choices=("verilator", "icarus"), default="verilator")
    t.add_argument("--steps", type=positive, default=2000, help="decode steps (eviction passes)")
    t.add_argument("--seed", type=nonnegative, help="random seed (default: fresh, printed)")
    t.add_argument("--waves", action="store_true", help="write a waveform file (VCD / FST)")
    t.add_argument("--defect", action="store_true", help="plant the tie-break defect")
    add_shape(t, 16, 4, 4)
    t.add_argument("--json", dest="json_out", help="write the figures to this JSON file")
    t.set_defaults(func=_test)


def _test(args: argparse.Namespace) -> int:
    from .runner import run_core

    res = run_core(
        args.sim,
        entries=args.entries,
        lanes=args.lanes,
        batch=args.batch,
        steps=args.steps,
        seed=args.seed,
        defect="tie_off_by_one" if args.defect else None,
        waves=args.waves,
    )
    emit(res, args.json_out)
    return 0
