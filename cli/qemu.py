"""``kvcxl qemu setup|boot|inject``: the virtual host with the emulated CXL Type-3 device.

Standard library only at import time (``kvcxl --help`` stays fast).
"""

from __future__ import annotations

import argparse
import json
import sys

from kvcxl.common.argtypes import (
    nonnegative,
    nonnegative_float,
    positive,
    positive_float,
    unit_interval,
)
from kvcxl.common.jsonout import wrote
from kvcxl.common.options import add_parser, opt
from kvcxl.common.sizes import FRACTION, budget_arg, dpa_range
from kvcxl.qemu.accel import ACCELS

JOBS = (
    "datapath", "replay", "malformed", "fuzz", "widths", "widths_in_line", "bench", "poison",
    "wait",
)  # fmt: skip


QEMU_PARSER = dict(
    help="boot a QEMU virtual host that sees the device through the Linux CXL stack",
    description=(
        "A QEMU 10 guest (Linux 6.12) with a CXL Type-3 device whose memory is a file the "
        "firmware service maps. The guest creates a RAM region, hands it to device DAX and "
        "runs the guest agent, which talks to the firmware through a command ring in "
        "device memory. See docs/qemu.md."
    ),
)
SETUP_PARSER = dict(
    help="install QEMU >= 10, fetch the 6.12 guest kernel, build the initramfs (root)",
    description=(
        "Idempotent. Installs qemu-system-x86 (bookworm-backports on Debian 12), busybox, "
        "ndctl/daxctl; unpacks linux-image-6.12 into ~/.cache/kvcxl/qemu (never installed "
        "on the host); builds the static guest agent, the TCG plugin and the initramfs."
    ),
)
SETUP_OPTIONS = (opt("--force", action="store_true", help="rebuild everything from scratch"),)
BOOT_PARSER = dict(
    help="boot the guest, replay a trace through the firmware, print a JSON report",
    description=(
        "Starts the firmware service and QEMU; the guest loads the CXL modules, creates, "
        "commits and onlines the region as devdax, prints `cxl list`, runs the jobs and "
        "powers off. The report joins boot and region times, what `cxl list` showed, the "
        "guest agent's counters and the firmware's statistics. Takes ~1-2 minutes under TCG."
    ),
    epilog=(
        "examples:\n"
        "  kvcxl qemu boot --json boot.json\n"
        "  kvcxl qemu boot --trace capture.npz --budget 0.3\n"
        "  kvcxl qemu boot --jobs replay --poison 0x1004000 --jobs poison\n"
        "  kvcxl qemu boot --jobs wait --wait 120 &   # then: kvcxl qemu inject ...\n"
        "  kvcxl qemu boot --trap 0x800000:64KiB --jobs datapath  # slow path for a buffer\n"
        "  kvcxl qemu boot --churn 0x800000:64KiB --jobs datapath  # pages moving meanwhile\n"
        "  kvcxl qemu boot --qemu stock           # Debian's QEMU, ring only"
    ),
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
BOOT_OPTIONS = (
    opt("--trace", help="kvcxl trace file (.npz) to replay (default: built-in)"),
    opt(
        "--steps",
        type=positive,
        default=None,
        help="decode steps of the built-in trace (default 24; not with --trace)",
    ),
    opt(
        "--budget",
        type=budget_arg(FRACTION),
        default=None,
        help="HBM stand-in capacity as a fraction of the trace's entries (default 0.25)",
    ),
    opt(
        "--jobs",
        action="append",
        choices=JOBS,
        help="guest jobs in order (repeatable; default: datapath replay)",
    ),
    opt("--policy", default="ema", help="firmware policy (default ema)"),
    opt(
        "--mode",
        choices=("float", "int"),
        default="float",
        help="the firmware's EMA arithmetic: float, or int (the Q0.16 contract the RTL computes)",
    ),
    opt("--config", help="policy configuration TOML"),
    opt(
        "--plugin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream the guest's CXL-window accesses to the firmware through the TCG plugin "
        "(default: on when it was built; it arms itself on the first ring command)",
    ),
    opt(
        "--device-emulator",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the firmware the guest's ring reaches is the device emulator (kvcxl.emu.device, "
        "in the service's process); --no-device-emulator: the service's own firmware "
        "session (default: on)",
    ),
    opt(
        "--poison",
        action="append",
        default=[],
        metavar="DPA[:LEN]",
        help="inject poison over QMP before the guest probes (64-byte aligned)",
    ),
    opt(
        "--media-event",
        action="append",
        default=[],
        metavar="DPA",
        help="inject a General Media event over QMP once the region is ready",
    ),
    opt("--device-mib", type=positive, default=256, help="device size (multiple of 256)"),
    opt("--smp", type=positive, default=2, help="guest CPUs (default 2)"),
    opt("--wait", type=nonnegative_float, default=30.0, help="seconds the 'wait' job idles"),
    opt("--timeout", type=positive_float, default=600.0, help="hard limit for the whole boot"),
    opt(
        "--stall-s",
        type=positive_float,
        default=120.0,
        help="a guest silent this long on the console has stalled: stop QEMU (default 120)",
    ),
    opt(
        "--retries",
        type=nonnegative,
        default=1,
        help="boots retried when the guest stalls, or QEMU ends on a signal, before the kvcxl "
        "agent starts (Linux boot, driver probing, region set-up under TCG); reported as "
        "boot_retries (default 1)",
    ),
    opt(
        "--qemu",
        choices=("kvcxl", "stock"),
        default="kvcxl",
        help="kvcxl: the patched QEMU built by setup, the kvcxl device on the memory path "
        "(DRAM-tier pages direct, the rest as CXL.mem requests to the device; docs/qemu.md); "
        "stock: Debian's QEMU, whose cxl-type3 serves memory itself (the ring only)",
    ),
    opt(
        "--trap",
        action="append",
        default=[],
        type=dpa_range,
        metavar="DPA:LENGTH",
        help="(--qemu kvcxl) pages whose every guest access goes to the device, e.g. "
        "0x800000:64KiB (repeatable)",
    ),
    opt(
        "--churn",
        action="append",
        default=[],
        type=dpa_range,
        metavar="DPA:LENGTH",
        help="(--qemu kvcxl) pages the device moves to NVMe and back without pause while the "
        "guest runs, one page drawn at random per move, e.g. 0x800000:64KiB (repeatable)",
    ),
    opt(
        "--alias",
        action="store_true",
        help="(--qemu kvcxl) map the pages the device keeps in DRAM into the guest as RAM "
        "(RAM speed; their accesses are then not counted per page)",
    ),
    opt(
        "--sample-rate",
        type=unit_interval,
        default=0.0,
        help="(--alias) share of the KV cache's DIRECT pages trapped each step to learn the "
        "replay's reads from their first touches (default 0: off)",
    ),
    opt(
        "--mem-link",
        choices=("ring", "socket"),
        default="ring",
        help="(--qemu kvcxl) how QEMU sends CXL.mem requests to the device: the shared-"
        "memory request ring (default) or the device's socket",
    ),
    opt(
        "--accel",
        choices=ACCELS,
        default="tcg",
        help="the guest's accelerator: tcg (default), or kvm where /dev/kvm is usable and the "
        "QEMU has it; with kvm, device memory the guest copies with wide (AVX) instructions "
        'needs --alias (docs/qemu.md, "KVM")',
    ),
    opt("--console", action="store_true", help="echo the guest console"),
    opt("--keep", action="store_true", help="keep the work directory (media, logs)"),
    opt("--json", dest="json_out", help="write the full report to this file"),
)
INJECT_PARSER = dict(
    help="inject a device fault into a running guest over QMP",
    description=(
        "Talks to the QMP socket of a running `kvcxl qemu boot` (its path is printed at "
        "start). poison: adds DPA..DPA+LEN to the device's poison list. media-event: a "
        "General Media event record (the guest traces cxl_general_media)."
    ),
)
INJECT_OPTIONS = (
    opt("kind", choices=("poison", "media-event")),
    opt("--qmp", required=True, help="QMP socket path of the running boot"),
    opt("--dpa", required=True, help="device physical address (64-byte aligned)"),
    opt("--length", type=positive, default=64, help="poison length in bytes (default 64)"),
)
FUZZ_PARSER = dict(
    help="fuzz the command ring: mutated commands, modelled return codes",
    description=(
        "Sends mutated ring commands through the ring's shared memory to the firmware "
        "a boot runs behind the ring, in this process (--via process, no QEMU needed), "
        "or boots the guest and has its agent send them from inside the guest (--via "
        "guest: through QEMU's CXL memory path and a real doorbell); a model of the "
        "ring's rules for that firmware predicts each return code. The firmware, as "
        "for `kvcxl qemu boot`: --qemu kvcxl (default) the memory-path device, rung by "
        "its doorbell's CXL.mem write; --qemu stock the device emulator in the firmware "
        "service, or with --firmware ring-only the service's own session. Exit status "
        "1 on a crash, a wrong return code or a byte changed outside the command's own "
        "slots (docs/reliability.md)."
    ),
)
FUZZ_OPTIONS = (
    opt(
        "--via",
        choices=("process", "guest"),
        default="process",
        help="who writes the ring: this process, or the guest agent in a booted guest "
        "(default process)",
    ),
    opt(
        "--cases",
        type=positive,
        default=None,
        help="cases (default 20000; --via guest: 500, at most what the fuzz area holds)",
    ),
    opt("--seed", type=nonnegative, default=0),
    opt(
        "--qemu",
        choices=("kvcxl", "stock"),
        default="kvcxl",
        help="kvcxl (default): the patched QEMU, whose memory-path device answers the ring; "
        "stock: Debian's QEMU, whose ring the polling firmware service answers",
    ),
    opt(
        "--firmware",
        choices=("device", "ring-only"),
        default="device",
        help="device (default): the device emulator (with --qemu kvcxl, the memory-path "
        "device); ring-only: the service's own firmware session (needs --qemu stock; "
        "boot's --no-device-emulator)",
    ),
    opt("--json", dest="json_out", help="write the report to this JSON file"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("qemu", **QEMU_PARSER)
    qs = p.add_subparsers(dest="qemu_command", metavar="ACTION")
    add_parser(qs, "setup", SETUP_OPTIONS, func=_setup, **SETUP_PARSER)
    add_parser(qs, "boot", BOOT_OPTIONS, func=_boot, **BOOT_PARSER)
    add_parser(qs, "inject", INJECT_OPTIONS, func=_inject, **INJECT_PARSER)
    add_parser(qs, "fuzz", FUZZ_OPTIONS, func=_fuzz, **FUZZ_PARSER)
    p.set_defaults(func=lambda args: p.print_help() or 0)


def _int(text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not an integer (use 0x… for hex)") from None


def _setup(args: argparse.Namespace) -> int:
    from kvcxl.qemu.setup import setup

    host = setup(force=args.force)  # SetupError: one line, exit status 1
    print(f"QEMU {host.qemu_version}, guest kernel {host.kernel_version}")
    print(f"initramfs {host.initramfs}")
    print(f"TCG plugin: {host.plugin if host.plugin else host.plugin_error}")
    print(f"patched QEMU (--qemu kvcxl): {host.qemu_kvcxl}")
    return 0


def _boot(args: argparse.Namespace) -> int:
    from kvcxl.cli.main import CliError

    # Everything the service would refuse only after a full boot is checked first.
    from kvcxl.firmware.config import PolicyConfig
    from kvcxl.firmware.policies import POLICIES
    from kvcxl.qemu.boot import BootOptions, boot
    from kvcxl.qemu.trace_image import DEFAULT_BUDGET, default_trace, load_trace

    online = sorted(n for n, c in POLICIES.items() if c.online)
    if args.policy not in online:
        raise CliError(f"--policy {args.policy!r}: not an online policy; choose from {online}")
    if args.config:
        PolicyConfig.load(args.config)  # a missing or invalid file: one line, exit 2
    if args.device_mib % 256:
        raise CliError(f"--device-mib {args.device_mib}: a multiple of 256 is accepted")
    budget = DEFAULT_BUDGET if args.budget is None else args.budget.resolve()
    if args.trace:
        if args.steps is not None:
            raise ValueError("--steps sets the built-in trace's length: not with --trace")
        gt = load_trace(args.trace, budget)
    else:
        if args.steps is not None and not 1 <= args.steps <= 1000:
            raise ValueError(f"--steps {args.steps}: must be in 1 … 1000")
        gt = default_trace() if args.steps is None else default_trace(steps=args.steps)
        if args.budget is not None:
            gt.capacity = max(1, int(budget * gt.n_entries))
    poison = []
    for text in args.poison:
        dpa, _, length = text.partition(":")
        poison.append((_int(dpa, "poison DPA"), _int(length, "poison length") if length else 64))
    from kvcxl.qemu.qmp import check_range

    for dpa, length in poison:
        check_range(dpa, length)
    jobs = tuple(args.jobs or ("datapath", "replay"))
    if poison and "poison" not in jobs:
        jobs = ("poison", *jobs)
    if args.retries < 0 or args.stall_s <= 0:
        raise CliError(f"--retries {args.retries} / --stall-s {args.stall_s}: must be >= 0 / > 0")
    echo = (lambda line: print(line, flush=True)) if args.console else None
    opts = BootOptions(
        jobs=jobs,
        trace=gt,
        device_mib=args.device_mib,
        plugin=args.plugin,
        smp=args.smp,
        timeout=args.timeout,
        policy=args.policy,
        mode=args.mode,
        config=args.config,
        poison=tuple(poison),
        media_events=tuple(_int(d, "media-event DPA") for d in args.media_event),
        keep=args.keep,
        wait_s=args.wait,
        device_emulator=args.device_emulator,
        console=echo,
        on_event=_progress if not args.console else None,
        stall_s=args.stall_s,
        retries=args.retries,
        qemu=args.qemu,
        trap=tuple(args.trap),
        churn=tuple(args.churn),
        alias=args.alias,
        sample_rate=args.sample_rate,
        mem_link=args.mem_link,
        accel=args.accel,
    )
    report, b = boot(opts)  # SetupError (not set up): one line, exit status 1
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
        wrote(args.json_out)
    _summary(report)
    if args.keep:
        print(f"work directory kept: {b.workdir}")
    return 0 if boot_ok(report) else 1


def boot_ok(report: dict) -> bool:
    """The guest powered off by itself, with no failure, timeout or stall."""
    names = {e["event"] for e in report["events"]}
    return (
        report["qemu"]["exit_code"] == 0
        and not report["guest_failures"]
        and "poweroff" in names
        and not names & {"host_timeout", "host_stall", "kvm_internal_error"}
    )


def _progress(ev: dict, b: object) -> None:
    name = ev.get("event")
    if name == "init":
        print(f"[{ev['t']:7.1f} s] guest /init running; QMP socket {b.qmp_socket}", flush=True)
    elif name in ("region_ready", "agent_start", "device_error", "fail", "poweroff"):
        extra = ev.get("job") or ev.get("reason") or ""
        print(f"[{ev['t']:7.1f} s] {name} {extra}", flush=True)


def _summary(r: dict) -> None:
    for x in r.get("boot_retries", []):
        what = (
            f"the guest stalled (silent {x['silent_s']} s at {x['t']} s)"
            if x["why"] == "stall"
            else f"QEMU ended on {x['signal']} (at {x['t']} s)"
        )
        print(
            f"retried: {what} before the kvcxl agent started; its last console line: "
            f"{(x['console_tail'] or ['(none)'])[-1]!r}"
        )
    for e in r["events"]:
        if e["event"] in ("host_timeout", "host_stall"):
            print(f"FAILED: {e['event']} {e}")
    if r.get("kvm_internal_error"):
        k = r["kvm_internal_error"]
        where = (
            f"after the guest's {k['last_guest_event']!r}"
            if k["last_guest_event"]
            else "before the guest's /init (in its kernel's boot)"
        )
        print(
            f"FAILED: KVM internal error at {k['t']} s, {where}: KVM could not emulate a "
            "guest instruction (an access to the device's MMIO window: use --alias; or "
            f"KVM's emulator itself: use --accel tcg): {' | '.join(k['qemu_said'])}"
        )
    t = r.get("timings", {})
    print(
        f"boot to /init {t.get('boot_to_init_s', '?')} s, region ready "
        f"{t.get('boot_to_region_ready_s', '?')} s (Measured, {r['qemu']['accel'].upper()}, "
        f"plugin {r['qemu']['plugin']})"
    )
    if r["qemu"]["plugin"] == "off":
        print(f"ring-only mode: {r['qemu']['plugin_note']}")
    g = r.get("guest", {})
    if "replay" in g:
        x = g["replay"]
        print(
            f"replay: {x['reads']} reads, {x['hbm_hits']} HBM hits, {x['cxl_reads']} CXL reads, "
            f"{x['victims']} victims, bad bytes {x['bad_bytes']}, residency mismatches "
            f"{x['residency_mismatches']}, {x['attn_records_per_s']:.0f} attention records/s"
        )
    if "bench" in g:
        x = g["bench"]
        print(
            f"ring RTT p50 {x['ring_rtt_us_p50']} us; memcpy to CXL {x['memcpy_to_cxl_MBps']} "
            f"MB/s, guest RAM {x['memcpy_ram_MBps']} MB/s"
        )
    fw = r.get("firmware") or {}
    for sess in fw.get("sessions", [])[:1]:
        d = sess.get("device")
        if d:
            c = d.get("counters", {})
            print(
                f"firmware: the device emulator: {sess.get('victims_total')} victims "
                f"{sess.get('victims_to_tier')}, {c.get('migrations_to_nvme')} pages demoted, "
                f"{c.get('migrations_to_dram')} promoted, device errors "
                f"{fw.get('device_errors')}"
            )
    if r.get("cxl_trace"):
        kinds: dict[str, int] = {}
        for line in r["cxl_trace"]:
            name = next((w.rstrip(":") for w in line.split() if w.startswith("cxl_")), "?")
            kinds[name] = kinds.get(name, 0) + 1
        print("guest traced CXL events: " + ", ".join(f"{k} x{v}" for k, v in kinds.items()))
    if "poison_list" in g:
        print(f"guest poison list: {g['poison_list']['entries'] or 'empty'}")
    if "device_error" in g:
        print(f"device error: {g['device_error'].get('reason')}")
    for f in r.get("guest_failures", []):
        print(f"guest failure: {f}", file=sys.stderr)
    crash = r.get("qemu_crash")
    if crash:
        print(f"QEMU crashed: {crash['signal']}", file=sys.stderr)
        bt, shown = crash["backtrace"], 14  # about the crashing thread's frames
        for line in bt[:shown] if bt else [crash.get("note", "")]:
            print(f"  {line}", file=sys.stderr)
        if bt and len(bt) > shown:
            print("  ... (every thread's backtrace: qemu_crash in --json)", file=sys.stderr)


def _fuzz(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from kvcxl.cli.main import CliError
    from kvcxl.qemu.ring_fuzz import firmware_for, run

    try:
        firmware = firmware_for(args.qemu, args.firmware == "device")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.via == "guest":
        report = _fuzz_guest(args)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            media = Path(tmp) / "media.bin"
            with open(media, "wb") as f:
                f.truncate(256 << 20)  # the boot's default device size
            report = run(media, args.cases or 20000, seed=args.seed, firmware=firmware)
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))
    for line in report["examples"]:
        print(line, file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
        wrote(args.json_out)
    bad = report["crashes"] + report["wrong_return_codes"] + report["changed_bytes"]
    return 1 if bad else 0


def _fuzz_guest(args: argparse.Namespace) -> dict:
    """One boot whose only job is the agent's fuzz job; its report, with the boot's
    verdict (a guest that did not power off by itself is a crash)."""
    from kvcxl.qemu import guest_fuzz
    from kvcxl.qemu.boot import BootOptions, boot

    cases = args.cases or 500
    if cases > guest_fuzz.CASES_MAX:
        raise ValueError(f"--cases {cases}: --via guest takes at most {guest_fuzz.CASES_MAX}")
    opts = BootOptions(
        jobs=("fuzz",), fuzz_cases=cases, fuzz_seed=args.seed,
        device_emulator=args.firmware == "device", qemu=args.qemu, on_event=_progress,
    )  # fmt: skip
    boot_report, _ = boot(opts)
    report = boot_report["guest_fuzz"]
    report["boot_ok"] = boot_ok(boot_report)
    report["boot_wall_s"] = boot_report["wall_s"]
    report["guest_failures"] = boot_report["guest_failures"]
    if not report["boot_ok"]:
        report["crashes"] += 1
        report["examples"].append(f"the boot failed: {boot_report.get('console_tail', [])[-3:]}")
    return report


def _inject(args: argparse.Namespace) -> int:
    from kvcxl.cli.main import CliError
    from kvcxl.qemu.qmp import Qmp, check_range

    dpa = _int(args.dpa, "DPA")
    check_range(dpa, args.length)
    try:
        with Qmp(args.qmp) as q:
            if args.kind == "poison":
                q.inject_poison(dpa, args.length)
                print(f"poisoned DPA {dpa:#x}+{args.length}")
            else:
                q.inject_media_event(dpa)
                print(f"General Media event at DPA {dpa:#x}")
    except (ValueError, FileNotFoundError, ModuleNotFoundError):
        raise
    except Exception as exc:  # QMP's own errors: QEMU refused or the socket went away
        raise CliError(f"QEMU refused {args.kind} at {dpa:#x}: {exc}") from None
    return 0
