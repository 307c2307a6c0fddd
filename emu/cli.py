"""The ``kvcxl`` command line: one entry point, subcommands contributed by each part.

Each part of the project owns a small module exposing ``register(subparsers)``.
Those modules keep their heavy imports (amaranth, torch, matplotlib) inside the
command handlers so that ``kvcxl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .errors import UserError

# Order here is the order in `kvcxl --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "kvcxl.emu.sim.commands",  # simulate, sizing, demo, trace export
    "kvcxl.firmware.commands",  # policy config show/check
    "kvcxl.emu.device.commands",  # device serve / soak / fuzz
    "kvcxl.rtl.commands",  # rtl verilog / formal / synth
    "kvcxl.tb.commands",  # rtl test (the testbench joins the rtl group: after it)
    "kvcxl.qemu.commands",  # qemu setup / boot / inject
    "kvcxl.emu.model.commands",  # trace capture, quality, calibrate
    "kvcxl.emu.bench_commands",  # bench
    "kvcxl.emu.setup_commands",  # setup
)


class CliError(UserError):
    """A user-facing error raised by a command module: printed as one line, exit status 2.

    Library modules raise :class:`kvcxl.emu.errors.UserError` instead (the CLI catches both).
    """


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcxl",
        description=(
            "Emulator of a CXL Type-3 memory expander whose firmware decides, per KV head, "
            "which KV-cache blocks stay in GPU HBM, go to device DRAM or sink to NVMe."
        ),
        epilog="Start with `kvcxl demo`; every subcommand has its own --help.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        rc = args.func(args)
    except UserError as exc:
        print(f"kvcxl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvcxl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
