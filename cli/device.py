"""``kvcxl device serve | soak | fuzz``: the CXL Type-3 device emulator from the command line.

Only the standard library (and the size grammar, :mod:`kvcxl.common.sizes`) is imported
here; the device is imported by the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvcxl.common.argtypes import nonnegative, positive, unit_interval
from kvcxl.common.jsonout import write_json
from kvcxl.common.options import add_parser, opt
from kvcxl.common.progress import progress
from kvcxl.common.sizes import SIZE_HELP, dpa_range, size_arg

_SERVE_EPILOG = """\
protocol (docs/device.md): each frame is u32 length, u8 kind, body; kinds
  0x01 CXL.mem message, 0x02 CCI mailbox message, 0x03 READ (u64 HPA, u32 len),
  0x04 WRITE (u64 HPA, u8 flags, 7 pad, data), 0x05 HDM (JSON), 0x7F error.

examples:
  kvcxl device serve --socket /tmp/kvcxl.sock --decoder 0x100000000
  kvcxl device serve --socket /tmp/kvcxl.sock --dram-file /dev/shm/cxl.img --capacity 256MiB
"""

_SOAK_EPILOG = """\
examples:
  kvcxl device soak --ops 1000000 --json soak.json   # the acceptance run (0 mismatched bytes)
  kvcxl device soak --ops 20000 --setups 1x4096,4x256
"""

_FUZZ_EPILOG = """\
examples:
  kvcxl device fuzz --cases 100000 --json fuzz.json  # the acceptance run (0 crashes)
"""


def _setups(text: str) -> tuple[tuple[int, int], ...]:
    from kvcxl.cxl.hdm import GRANULARITIES, WAYS

    out = []
    for part in text.split(","):
        try:
            ways, gran = part.lower().split("x")
            out.append((int(ways), int(gran)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"set-up {part!r} must be WAYSxGRANULARITY, e.g. 4x1024"
            ) from None
        # The HDM decoder accepts only these; checked here, before any set-up runs.
        if out[-1][0] not in WAYS:
            raise argparse.ArgumentTypeError(
                f"set-up {part!r}: {out[-1][0]} ways is not one of {', '.join(map(str, WAYS))}"
            )
        if out[-1][1] not in GRANULARITIES:
            raise argparse.ArgumentTypeError(
                f"set-up {part!r}: granularity {out[-1][1]} B is not one of "
                f"{', '.join(map(str, GRANULARITIES))}"
            )
    return tuple(out)


def _positive_size(text: str) -> int:
    n = size_arg(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be > 0")
    return n


DEVICE_PARSER = dict(
    help="the CXL Type-3 device emulator: serve it on a socket, soak it, fuzz it",
    description=(
        "The emulated memory expander: HDM decoders, DRAM and NVMe tiers holding real "
        "bytes, poison, the CCI mailbox and the firmware policy that migrates data."
    ),
)
POLICY = opt("--policy", default="ema", help="firmware policy (default ema)")
SEED = opt("--seed", type=nonnegative, default=0)
JSON_REPORT = opt("--json", dest="json_out", help="write the report to this JSON file")
SERVE_PARSER = dict(
    help="run the device as a service on a Unix socket (for QEMU's bridge and tests)",
    description=(
        "Runs one device and its firmware behind a Unix stream socket until interrupted. "
        "Program decoders over the socket (HDM frames) or with --decoder."
    ),
    epilog=_SERVE_EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
SERVE_OPTIONS = (
    opt("--socket", required=True, help="path of the Unix socket to create"),
    opt(
        "--capacity",
        type=size_arg,
        default="1GiB",
        metavar="SIZE",
        help=f"DPA bytes (default 1GiB; {SIZE_HELP})",
    ),
    opt(
        "--page-bytes",
        type=size_arg,
        default="4KiB",
        metavar="SIZE",
        help=f"migration page (default 4KiB; {SIZE_HELP})",
    ),
    opt(
        "--dram-pages",
        type=positive,
        default=None,
        help="DRAM budget in pages; default: all pages in DRAM, no NVMe migration",
    ),
    opt("--dram-file", help="back the DRAM tier by this file (DPA = file offset)"),
    opt(
        "--nvme-file",
        help="back the NVMe tier by this file, with the map of which tier holds each page "
        "in FILE.tiers: with --dram-file, every acknowledged write survives the service "
        "being killed and started again on the same files (docs/reliability.md)",
    ),
    POLICY,
    opt("--config", help="policy configuration TOML (see `kvcxl policy`)"),
    opt(
        "--decoder",
        metavar="BASE[:WAYS:GRAN:POS]",
        help="program and commit decoder 0 over the whole capacity at HPA BASE (256 MiB "
        "aligned), optionally interleaved WAYS ways at GRAN bytes as position POS",
    ),
    opt(
        "--entries",
        choices=("pages", "host"),
        default="pages",
        help="policy entries: every DPA page from the start (pages), or only those the host "
        "describes/creates/reports, in id order, as the simulator does (host)",
    ),
    opt("--record-victims", action="store_true", help="keep the victim log"),
    opt(
        "--page-state",
        metavar="FILE",
        help="create the page-state table a patched QEMU shares (its kvcxl-state=FILE): "
        "QEMU completes accesses to DRAM-tier pages of --dram-file itself and sends the "
        "rest here (docs/qemu.md)",
    ),
    opt(
        "--health",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="what Get Health Info reports (repeatable): health_status, media_status, "
        "life_used (%%), temperature (°C), dirty_shutdowns",
    ),
    opt(
        "--fill-on-access",
        action="store_true",
        help="a host access to a page on NVMe brings the page into DRAM first (the device's "
        "DRAM caching its NVMe); default: host accesses are served where the page is",
    ),
    opt(
        "--churn",
        action="append",
        default=[],
        type=dpa_range,
        metavar="DPA:LENGTH",
        help="move these pages to NVMe and back without pause while serving, one page drawn "
        "at random per move (a migration stress for a patched QEMU's direct path; repeatable)",
    ),
    opt(
        "--trap",
        action="append",
        default=[],
        type=dpa_range,
        metavar="DPA:LENGTH",
        help="pages a patched QEMU must always send here (repeatable), e.g. 0x800000:64KiB",
    ),
)
SOAK_PARSER = dict(
    help="integrity soak: random reads/writes while the policy migrates data",
    description=(
        "Random mixed reads and writes (1 B … 4 KiB, and single-line CXL.mem "
        "transactions) over several interleave set-ups while attention reports make "
        "the policy move pages between DRAM and NVMe; every read is checked against "
        "a shadow copy. Exit status 1 if any byte mismatched."
    ),
    epilog=_SOAK_EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
SOAK_OPTIONS = (
    opt("--ops", type=positive, default=1_000_000, help="operations (default 1000000)"),
    opt(
        "--setups",
        type=_setups,
        default=None,
        help="interleave set-ups WAYSxGRAN,... (default 1x4096,2x256,4x1024,8x16384,16x256)",
    ),
    opt(
        "--span",
        type=_positive_size,
        default="4MiB",
        metavar="SIZE",
        help=f"HPA bytes exercised (default 4MiB; {SIZE_HELP})",
    ),
    POLICY,
    SEED,
    JSON_REPORT,
)
FUZZ_PARSER = dict(
    help="fuzz CXL.mem, mailbox and service frames: 0 crashes expected",
    description=(
        "Random and malformed CXL.mem transactions, mailbox commands and service frames "
        "(a seeded random generator plus Hypothesis strategies). Every case must be "
        "answered with a response or a protocol error code. Exit status 1 on any crash."
    ),
    epilog=_FUZZ_EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
FUZZ_OPTIONS = (
    opt("--cases", type=positive, default=100_000, help="cases (default 100000)"),
    SEED,
    opt(
        "--hypothesis-fraction",
        type=unit_interval,
        default=0.05,
        help="share of cases drawn by Hypothesis (slower per case; default 0.05)",
    ),
    opt(
        "--via",
        choices=("engine", "socket"),
        default="engine",
        help="engine: every frame kind, in process (default); socket: READ, WRITE and CXL.mem "
        "frames, each mutated, over the Unix socket of a `kvcxl device serve` it starts, "
        "every answer predicted by a model of the protocol (wrong answers and bytes changed "
        "outside the addressed range count as failures)",
    ),
    JSON_REPORT,
)
DESCRIBE_PARSER = dict(
    help="print the CXL.mem message layouts and the mailbox command table",
    description="The field table of every CXL.mem message class (bit ranges, widths, "
    "opcodes) and every mailbox command this device implements.",
)
STATS_PARSER = dict(
    help="ask a running `device serve` for its statistics (JSON)",
    description="Sends Get Statistics (C003h) to the service on --socket and prints it.",
)
STATS_OPTIONS = (
    opt("--socket", required=True, help="the service's Unix socket"),
    opt("--json", dest="json_out", help="also write the statistics to this file"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("device", **DEVICE_PARSER)
    dsub = p.add_subparsers(dest="device_command", metavar="SUBCOMMAND", required=True)
    add_parser(dsub, "serve", SERVE_OPTIONS, func=_serve, **SERVE_PARSER)
    add_parser(dsub, "soak", SOAK_OPTIONS, func=_soak, **SOAK_PARSER)
    add_parser(dsub, "fuzz", FUZZ_OPTIONS, func=_fuzz, **FUZZ_PARSER)
    add_parser(dsub, "describe", func=_describe, **DESCRIBE_PARSER)
    add_parser(dsub, "stats", STATS_OPTIONS, func=_stats, **STATS_PARSER)


def _check_policy(name: str) -> None:
    from kvcxl.firmware.policies import POLICIES

    online = sorted(n for n, c in POLICIES.items() if c.online)
    if name not in online:
        raise ValueError(f"--policy {name!r}: not an online policy; choose from {online}")


def _soak(args: argparse.Namespace) -> int:
    from kvcxl.emu.device.soak import SETUPS, SoakConfig, run

    _check_policy(args.policy)

    cfg = SoakConfig(
        ops=args.ops,
        setups=args.setups or SETUPS,
        span=args.span,
        policy=args.policy,
        seed=args.seed,
    )
    bar, update = progress(cfg.ops, "soak", "op")
    try:
        report = run(cfg, progress=update)
    finally:
        bar.close()
    summary = {k: v for k, v in report.items() if k != "setups"}
    print(json.dumps(summary, indent=2))
    write_json(args.json_out, report)
    return (
        1 if report["mismatched_bytes"] or report["wrong_victims"] or report["poison_errors"] else 0
    )


def _fuzz(args: argparse.Namespace) -> int:
    if args.via == "socket":
        return _fuzz_socket(args)
    from kvcxl.emu.device.fuzz import run

    bar, update = progress(args.cases, "fuzz", "op")
    try:
        report = run(
            args.cases,
            seed=args.seed,
            hypothesis_fraction=args.hypothesis_fraction,
            progress=update,
        )
    finally:
        bar.close()
    print(json.dumps({k: v for k, v in report.items() if k != "return_codes"}, indent=2))
    write_json(args.json_out, report)
    return 1 if report["crashes"] or report["device_internal_errors"] else 0


def _fuzz_socket(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from kvcxl.cxl import mailbox as mb
    from kvcxl.emu.device.fuzz_socket import run
    from kvcxl.emu.device.service import Client, serve_process

    base, capacity = 1 << 32, 256 << 20
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.sock"
        with serve_process(path, capacity, base):
            report = run(path, base, base + capacity, args.cases, seed=args.seed)
            with Client(path, timeout=10) as c:  # the service's own count of caught errors
                stats = json.loads(c.cci(mb.Opcode.VENDOR_GET_STATS).payload)
            report["service_internal_errors"] = stats["counters"]["internal_errors"]
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))
    for line in report["examples"]:
        print(line, file=sys.stderr)
    write_json(args.json_out, report)
    bad = report["crashes"] + report["wrong_answers"] + report["changed_bytes"]
    return 1 if bad or report["service_internal_errors"] else 0


def _parse_decoder(text: str, capacity: int) -> dict:
    parts = text.split(":")
    try:
        base = int(parts[0], 0)
        ways, gran, pos = (int(x, 0) for x in parts[1:]) if len(parts) == 4 else (1, 256, 0)
    except ValueError:
        raise ValueError(f"--decoder {text!r} must be BASE or BASE:WAYS:GRAN:POS") from None
    if len(parts) not in (1, 4):
        raise ValueError(f"--decoder {text!r} must be BASE or BASE:WAYS:GRAN:POS")
    return {
        "base": base,
        "size": capacity * ways,
        "ways": ways,
        "granularity": gran,
        "position": pos,
    }


def _serve(args: argparse.Namespace) -> int:

    from kvcxl.cxl.hdm import HdmError
    from kvcxl.emu.device.device import Type3Device
    from kvcxl.emu.device.service import (
        Churn,
        Engine,
        Server,
        serve_until_stopped,
        stop_on_sigterm,
    )
    from kvcxl.firmware.config import PolicyConfig

    _check_policy(args.policy)
    config = PolicyConfig.load(args.config) if args.config else PolicyConfig()
    try:
        dev = Type3Device(
            args.capacity,
            page_bytes=args.page_bytes,
            dram_pages=args.dram_pages,
            policy=args.policy,
            config=config,
            dram_file=args.dram_file,
            nvme_file=args.nvme_file,
            record_victims=args.record_victims,
            entries=args.entries,
            page_state=args.page_state,
            fill_on_access=args.fill_on_access,
        )
    except OSError as exc:  # only the media files are opened here
        flag = (
            "--nvme-file"
            if args.nvme_file and exc.filename and (str(exc.filename).startswith(args.nvme_file))
            else "--dram-file"
        )
        raise ValueError(
            f"{flag} {exc.filename}: cannot be opened for reading and writing "
            f"({exc.strerror}); a writable file path is accepted"
        ) from None
    for spec in args.health:
        dev.set_health(spec)
    for dpa, n in args.trap:
        dev.trap(*_inside(dev, "--trap", dpa, n))
    if args.decoder:
        fields = _parse_decoder(args.decoder, args.capacity)
        try:
            dev.hdm.program(0, **fields)
            dev.hdm.commit(0)
        except HdmError as exc:
            raise ValueError(f"--decoder {args.decoder!r}: {exc}") from None

    stop_on_sigterm()
    engine = Engine(dev)
    churn = [p for dpa, n in args.churn for p in dev.pages_of(*_inside(dev, "--churn", dpa, n))]
    try:
        server = Server(args.socket, engine)
    except OSError as exc:
        dev.close()
        raise ValueError(
            f"--socket {args.socket}: cannot be created ({exc.strerror}); a new path in a "
            "writable folder is accepted"
        ) from None
    if churn:
        Churn(engine, churn).start()
    serve_until_stopped(
        server,
        dev,
        f"kvcxl device: serving {args.capacity} B ({dev.n_pages} pages, "
        f"{'tiered' if dev.tiering else 'all DRAM'}) on {args.socket}",
    )
    return 0


def _describe(args: argparse.Namespace) -> int:
    from kvcxl.cxl import mailbox as mb
    from kvcxl.cxl import mem

    print(mem.describe())
    print("\nmailbox commands (opcode, name, handler, input bytes, effects, under QEMU):")
    for c in sorted(mb.COMMANDS.values(), key=lambda c: c.opcode):
        n = "var" if c.in_len is None else str(c.in_len)
        fwd = "forwarded" if c.forwarded else "QEMU's"
        print(
            f"  {c.opcode:04X}h  {c.name:24s} {c.handler:22s} in={n:>4s}  effects={c.effects:#x}"
            f"  {fwd}"
        )
        print(f"         in:  {c.request.describe()}")
        print(f"         out: {c.response.describe()}" + (f"; {c.doc}" if c.doc else ""))
    return 0


def _stats(args: argparse.Namespace) -> int:
    from kvcxl.cxl import mailbox as mb
    from kvcxl.emu.device.service import Client

    try:
        client = Client(args.socket, timeout=10)
    except OSError as exc:
        raise ValueError(f"cannot connect to {args.socket}: {exc.strerror or exc}") from None
    with client:
        rsp = client.cci(mb.Opcode.VENDOR_GET_STATS)
    if rsp.rc != mb.ReturnCode.SUCCESS:
        raise ValueError(f"Get Statistics answered {mb.ReturnCode(rsp.rc).name}")
    report = json.loads(rsp.payload)
    print(json.dumps(report, indent=2))
    write_json(args.json_out, report)
    return 0


def _inside(dev, flag: str, dpa: int, n: int) -> tuple[int, int]:
    """``(dpa, n)`` when the range lies inside the device, else a ValueError naming ``flag``."""
    try:
        dev.pages_of(dpa, n)
    except ValueError as exc:
        raise ValueError(f"{flag} {dpa:#x}:{n}: {exc}") from None
    return dpa, n
