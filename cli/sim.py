"""``kvcxl simulate``, ``sizing``, ``demo`` and ``trace``: the simulator's command line.

The option tables come from the modules that own them (granularities from the
simulator, tier defaults from :mod:`kvcxl.emu.timing`, the size grammar from
:mod:`kvcxl.common.sizes`); workloads, sweeps and plotting load inside the handlers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvcxl.common.argtypes import nonnegative, nonnegative_float, positive, positive_float
from kvcxl.common.figures import figure
from kvcxl.common.jsonout import wrote
from kvcxl.common.options import Group, Option, add_options, add_parser, opt
from kvcxl.common.progress import progress
from kvcxl.common.sizes import BYTES, SIZE_HELP, Budget, budget_arg, parse_size
from kvcxl.emu.metrics import audit_cell, audit_sentence, audit_totals
from kvcxl.emu.sim import trace_import
from kvcxl.emu.sim.simulator import GRANULARITIES
from kvcxl.emu.timing import CXL_DRAM, HBM, NVME
from kvcxl.firmware.config import PARAMS, PolicyConfig
from kvcxl.firmware.policies import POLICIES
from kvcxl.firmware.policy_params import POLICY_PARAMS


def _option_kind(annotation: object) -> str:
    """A PolicyConfig field's annotation as an option kind: float, int, str, bool or floats."""
    text = getattr(annotation, "__name__", str(annotation))
    return "floats" if text.startswith("tuple") else text


# Every parameter is an option: the engine's, their kind read off PolicyConfig's own field
# types, then each policy's own, read off its Param (validation, ranges and choices stay
# theirs).  A policy's own parameter applies to every policy that declares it.
POLICY_OPTIONS: dict[str, str] = {
    **{f.name: _option_kind(f.type) for f in fields(PolicyConfig) if f.name in PARAMS},
    **{n: {int: "int", str: "str"}.get(p.kind, "float") for n, p in POLICY_PARAMS.items()},
}
SHAPE_OPTIONS = (
    "layers",
    "q_heads",
    "kv_heads",
    "d_head",
    "dtype_bytes",
    "block_tokens",
    "context_tokens",
)
TIMING_OPTIONS = (
    "cxl_latency_ns",
    "cxl_gbps",
    "nvme_latency_ns",
    "nvme_gbps",
    "hbm_gbps",
    "hbm_latency_ns",
)
DEMO_BUDGETS = ("5%", "10%", "20%", "40%")
# The demo's audited sample: every policy at this budget on seed 0, on the numpy engine
# (the table itself replays on the fast engine, which does not audit).
DEMO_AUDIT_BUDGET = "10%"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _bool(text: str) -> bool:
    t = text.lower()
    if t in ("on", "true", "1", "yes"):
        return True
    if t in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not on/off")


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None


def _kv(text: str) -> tuple[str, Any]:
    k, sep, v = text.partition("=")
    if not sep or not k:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    try:
        value: Any = json.loads(v)
    except json.JSONDecodeError:
        value = v
    return k.replace("-", "_"), value


MODEL_OPTIONS = Group(
    "model shape (a preset, any dimension overridable)",
    (
        opt(
            "--preset",
            default="ci",
            help="model-shape preset: ci, s1 (Llama-2-70B at 128 K) or smollm2",
        ),
        *(
            opt(
                f"--{name.replace('_', '-')}",
                type=positive,  # a 0 would silently mean "the preset's value"
                default=None,
                metavar="N",
                help=argparse.SUPPRESS
                if name != "context_tokens"
                else "override a dimension; likewise --layers, --q-heads, --kv-heads, "
                "--d-head, --dtype-bytes, --block-tokens",
            )
            for name in SHAPE_OPTIONS
        ),
    ),
)


def _policy_option(name: str, kind: str) -> Option:
    # The random baseline's seed is --policy-seed (--seed picks the workload seed).
    flag = "--policy-seed" if name == "seed" else f"--{name.replace('_', '-')}"
    return opt(
        flag,
        dest=f"p_{name}",
        type={"float": float, "int": int, "str": str, "bool": _bool, "floats": _floats}[kind],
        default=None,
        metavar={"bool": "on|off", "floats": "X,Y[,Z]"}.get(kind, kind.upper()),
        help=argparse.SUPPRESS
        if name not in ("alpha", "persistent_metadata")
        else "e.g. --alpha 0.05, --persistent-metadata off; every parameter of "
        "`kvcxl policy params` has its option (--beta, --keep-threshold, ...)",
    )


POLICY_PARAMETER_OPTIONS = Group(
    "policy parameters (defaults and ranges: `kvcxl policy params`; override a --config)",
    (
        opt("--config", metavar="FILE.toml", help="policy configuration file"),
        *(_policy_option(name, kind) for name, kind in POLICY_OPTIONS.items()),
    ),
)
TIERS_OPTIONS = Group(
    "tiers, reads and timing",
    (
        opt(
            "--cxl",
            metavar="SIZE",
            help="CXL DRAM capacity: a size (1TiB, 2GB) or %% of the KV bytes; default: room "
            f"for everything ({SIZE_HELP})",
        ),
        opt(
            "--nvme",
            metavar="SIZE",
            help=f"NVMe capacity, as --cxl; default: room for everything ({SIZE_HELP})",
        ),
        opt(
            "--read",
            default="dense",
            help="dense, topk:K (K blocks per head per "
            "step, Quest-style) or threshold:T (blocks with weight >= T)",
        ),
        opt(
            "--granularity",
            choices=GRANULARITIES,
            default="layer",
            help="what the cache serves as one batch: a layer of a step (default), a whole "
            "step, or every read on its own (request: a classic one-request cache, as "
            "libCacheSim)",
        ),
        opt(
            "--prefetch",
            action="store_true",
            help="RoPE-locality prefetch into HBM (firmware.prefetch); off = demand paging",
        ),
        opt(
            "--prefetch-limit",
            type=nonnegative,
            default=64,
            metavar="N",
            help="most entries prefetched per batch",
        ),
        opt(
            "--placement",
            choices=("policy", "fill"),
            default="policy",
            help="lower tier of an entry leaving HBM: the firmware's placement rule "
            "(scored policies) or CXL first",
        ),
        opt(
            "--mode",
            choices=("float", "int"),
            default="float",
            help="ema arithmetic: float reference or the Q0.16 integer contract",
        ),
        opt(
            "--engine",
            choices=("fast", "numpy"),
            default=None,
            help="replay engine: fast (compiled; the default where it covers the run, else "
            "numpy with a notice) or numpy (the readable reference); both replay identically",
        ),
        opt(
            "--warmup",
            type=nonnegative,
            default=0,
            metavar="STEPS",
            help="decode steps excluded from the metrics",
        ),
        opt(
            "--compute-model",
            action="store_true",
            help="add the GB10 decode model 73.9 ms + 17.58 ms/GiB to step time",
        ),
        opt(
            "--timeline",
            action="store_true",
            help="schedule every transfer (demand, prefetch, write-back, CXL->NVMe) on the link "
            "(full duplex), device DRAM and NVMe with queueing (docs/timeline.md; either "
            "engine): step times, tokens/s and the serving metrics come from it",
        ),
        opt(
            "--timing",
            choices=("seed", "asic", "fpga", "offload"),
            default=None,
            help="CXL DRAM timing preset (docs/timeline.md): seed = 200 ns, 64 GB/s (Analytical "
            "model); asic / fpga = CXL-DMSim's measured ratios to local DDR (arXiv 2411.02282); "
            "offload = host DRAM over PCIe instead of the device (--pcie-contention x 51 GB/s, "
            "13.0 us per DMA); --cxl-gbps / --cxl-latency-ns override it",
        ),
        opt(
            "--versus-offload",
            action="store_true",
            help="with --serving: also replay every run with host-DRAM offload over PCIe in "
            "place of the device (at --pcie-contention, default the design's 0.32, and at the "
            "measured 0.87), under the same policy and timeline, and print one table "
            "(docs/timeline.md)",
        ),
        *(
            opt(
                f"--{name.replace('_', '-')}",
                type=positive_float if name.endswith("gbps") else nonnegative_float,
                default=None,
                help=argparse.SUPPRESS
                if name != "cxl_gbps"
                else "tier timing overrides: --cxl-gbps, --cxl-latency-ns, --nvme-gbps, "
                "--nvme-latency-ns, --hbm-gbps (defaults, docs/simulator.md: CXL DRAM "
                f"{CXL_DRAM.latency_ns:g} ns + {CXL_DRAM.bandwidth_gbps:g} GB/s, NVMe "
                f"{NVME.latency_ns / 1000:g} µs + {NVME.bandwidth_gbps:g} GB/s, HBM "
                f"{HBM.bandwidth_gbps / 1000:g} TB/s)",
            )
            for name in TIMING_OPTIONS
        ),
    ),
)
WORKLOAD_PARAM = opt(
    "--workload-param",
    action="append",
    type=_kv,
    default=[],
    metavar="K=V",
    help="workload parameter, e.g. sessions=100 (see `kvcxl simulate --list`)",
)
WORKLOAD_OPTIONS = Group(
    "workload",
    (
        opt("--steps", type=positive, default=200, help="decode steps"),
        WORKLOAD_PARAM,
        opt(
            "--attention-param",
            action="append",
            type=_kv,
            default=[],
            metavar="K=V",
            help="synthetic attention parameter over the preset's defaults (ci and smollm2: "
            "the fit to SmolLM2, docs/model.md), e.g. sink_mass_last=0.3 or "
            "sink_profile=[0.05,0.1,0.6,0.5] (per-layer, depth 0 to 1)",
        ),
    ),
)
EXECUTION_OPTIONS = Group(
    "execution",
    (
        opt("--jobs", type=positive, default=None, help="parallel processes (default: cores)"),
        opt(
            "--backend",
            choices=("process", "serial", "dask"),
            default="process",
            help="where seeds run: local processes, in-process, or a Dask cluster",
        ),
        opt(
            "--scheduler",
            metavar="ADDRESS",
            help="Dask scheduler address (default: a LocalCluster on this machine)",
        ),
        opt("--no-progress", action="store_true", help="no progress bar"),
    ),
)

SIMULATE_PARSER = dict(
    help="replay a workload or trace through policies and HBM budgets (three tiers)",
    formatter_class=_Formatter,
    description=(
        "Replays a synthetic workload (--workload) or a kvcxl trace (--trace) through each "
        "--policy at each HBM --budget, with CXL DRAM and NVMe behind HBM, and reports hit "
        "rate, byte miss ratio, bytes moved per tier pair, effective latency, stall, "
        "tokens/s, prefetch precision/coverage and audited victims. Every figure is "
        "Simulated. With --seeds N the workload is regenerated with N seeds and means carry "
        "95% confidence intervals."
    ),
    epilog=(
        "examples:\n"
        "  kvcxl simulate --workload cyclic --policy lru --policy ema --budget 10% "
        "--budget 25%\n"
        "  kvcxl simulate --trace run.npz --policy ema --alpha 0.05 --budget 64MiB --audit\n"
        "  kvcxl simulate --seeds 10 --json out.json --plot hit.png\n"
        "  kvcxl simulate --list     (workloads, policies, presets)"
    ),
)
SIMULATE_OPTIONS = (
    Group(
        None,
        (
            opt("--workload", default=None, help="synthetic workload (default zipf-sessions)"),
            opt("--trace", metavar="FILE", help="replay a kvcxl trace (.npz) instead"),
        ),
        exclusive=True,
    ),
    opt(
        "--policy",
        action="append",
        metavar="P",
        help="policy to run (repeatable; default: lru and ema)",
    ),
    opt(
        "--budget",
        action="append",
        type=budget_arg(BYTES),
        metavar="B",
        help="HBM budget: a size (512MiB, 2GB) or %% of the workload's KV bytes "
        f"(repeatable; default 25%%; {SIZE_HELP})",
    ),
    opt("--seeds", type=positive, default=1, help="workload seeds (mean and 95%% CI)"),
    opt("--seed", type=nonnegative, default=0, help="first seed"),
    opt(
        "--audit",
        action="store_true",
        help="check every victim against a brute-force ranking of the policy's priorities and "
        "recompute priorities from each entry's own history (victims and a sample per pass); "
        "any fault fails the run",
    ),
    opt("--json", dest="json_out", metavar="FILE", help="write results as JSON"),
    opt("--plot", metavar="FILE.png", help="plot hit rate vs budget per policy"),
    opt(
        "--dump-victims",
        metavar="FILE",
        help="write every eviction (step, entry identity, priority) as CSV",
    ),
    opt(
        "--serving",
        action="store_true",
        help="also report the serving metrics (docs/serving.md): tokens/s aggregate and per "
        "user, inter-token latency and time to first token (p50/p99; TTFT here is the first "
        "decode step of each turn, no prefill model), CXL link utilisation, energy per token "
        "and the device's metadata footprint (Simulated counts, Analytical energy inputs)",
    ),
    opt("--list", action="store_true", help="list workloads, policies, presets"),
    MODEL_OPTIONS,
    POLICY_PARAMETER_OPTIONS,
    TIERS_OPTIONS,
    WORKLOAD_OPTIONS,
    EXECUTION_OPTIONS,
)
SIZING_PARSER = dict(
    help="analytic KV-cache sizing of a model shape (S1: docs/design.md; Analytical model)",
    formatter_class=_Formatter,
    description="KV bytes per token, per block, per context and for N users, and how many "
    f"full contexts HBM, CXL DRAM and NVMe hold, and the design's tier economics (a block "
    "fetched at 121 / 64 / 32 GB/s against regenerating it). Analytical model. Sizes: "
    f"{SIZE_HELP}.",
    epilog="example: kvcxl sizing --preset s1 --users 8",
)
SIZING_OPTIONS = (
    opt("--users", type=positive, default=8, help="concurrent full contexts"),
    *(
        opt(flag, default=default, metavar="SIZE", help=what)
        for flag, default, what in (
            ("--hbm", "192GB", "GPU HBM"),
            ("--weights", "140GB", "model weights in HBM"),
            ("--activations", "5GB", "activations / workspace in HBM"),
            ("--pinned", "10GB", "pinned (anchor) KV in HBM"),
            ("--cxl", "1000GB", "CXL DRAM behind HBM"),
            ("--nvme", "16000GB", "NVMe behind CXL DRAM"),
        )
    ),
    opt("--json", dest="json_out", metavar="FILE"),
    MODEL_OPTIONS,
)
DEMO_PARSER = dict(
    help="the main job: every policy at a few budgets on the default workload, with report",
    formatter_class=_Formatter,
    description=(
        "Runs every policy (the registry's ranked policies, Belady's optimum included) at "
        "budgets " + ", ".join(DEMO_BUDGETS) + " of the default workload's KV bytes over "
        "a few seeds on the fast engine, prints the table and writes report.md, "
        "results.json and hit_rate.png into --out. The eviction audit runs on a sample "
        f"it names: every policy at {DEMO_AUDIT_BUDGET} on seed 0, replayed again on the "
        "numpy engine with the audit on, whose hits must equal the fast engine's. "
        "Simulated."
    ),
)
DEMO_OPTIONS = (
    opt("--out", default="out/demo", help="output folder"),
    opt("--workload", default="zipf-sessions"),
    opt("--seeds", type=positive, default=3),
    opt("--steps", type=positive, default=160),
    opt("--jobs", type=positive, default=None),
    opt(
        "--mode",
        choices=("float", "int"),
        default="float",
        help="EMA arithmetic: float, or int, the Q0.16 contract the RTL computes (how far "
        "apart they are: docs/results.md, 'Float and integer arithmetic')",
    ),
    opt("--no-progress", action="store_true"),
)
EXPORT_PARSER = dict(
    help="write a trace or a synthetic workload as npz, libCacheSim CSV or oracleGeneral",
    formatter_class=_Formatter,
    description="Export the read stream of a trace file or of a synthetic workload "
    "(docs/trace-format.md).\n\n"
    "npz: the kvcxl trace format. A workload is saved as a version-2 trace: its reads and "
    "its writes (prefills and new blocks, with the contexts' lengths in tokens), in event "
    "order, so that `kvcxl simulate --trace FILE` replays it exactly as the workload "
    "(same hits, misses, victims and bytes moved for every policy and granularity). "
    "--reads-only saves the reads alone (version 1): a replay then writes each entry just "
    "before the batch that first reads it, which is what a request trace means.\n\n"
    "csv and oracle-general: libCacheSim request traces, one request per entry read "
    "(writes are not requests), object ids dense in order of first request, object size "
    "= entry bytes; oracle-general carries the next-access times libCacheSim's Belady "
    "needs.",
)
EXPORT_OPTIONS = (
    Group(
        None,
        (
            opt("--trace", metavar="FILE", help="a kvcxl trace"),
            opt("--workload", help="a synthetic workload"),
        ),
        exclusive=True,
        required=True,
    ),
    opt(
        "--format",
        choices=("npz", "csv", "oracle-general"),
        default="npz",
        help="npz: kvcxl trace (a workload: version 2, reads and writes; with --reads-only: "
        "version 1); csv, oracle-general: libCacheSim request traces",
    ),
    opt("-o", "--output", required=True),
    opt(
        "--reads-only",
        action="store_true",
        help="npz: save the reads alone as a version-1 trace (no writes)",
    ),
    opt("--seed", type=nonnegative, default=0),
    opt("--steps", type=positive, default=200),
    opt("--read", default="dense", help="dense, topk:K or threshold:T"),
    opt("--workload-param", action="append", type=_kv, default=[], metavar="K=V"),
    MODEL_OPTIONS,
)
IMPORT_OPTIONS = (
    opt("--seed", type=nonnegative, default=0, help="seed of the synthetic attention"),
    opt("--steps", type=positive, default=200, help="steps replayed (the window)"),
    opt("--read", default="topk:8", help="dense, topk:K or threshold:T (with -o)"),
    opt(
        "--workload-param", action="append", type=_kv, default=[], metavar="K=V",
        help="itl_ms (real ms per token, default 25), token_scale (default block_tokens/512), "
        "rate (arrival-rate factor, default 1)",
    ),
    MODEL_OPTIONS,
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    add_parser(sub, "simulate", SIMULATE_OPTIONS, func=_simulate, **SIMULATE_PARSER)
    add_parser(sub, "sizing", SIZING_OPTIONS, func=_sizing, **SIZING_PARSER).set_defaults(
        preset="s1"
    )
    add_parser(sub, "demo", DEMO_OPTIONS, func=_demo, **DEMO_PARSER)
    _register_trace(sub)


def _register_trace(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "trace",
        help="kvcxl traces: validate, info, export (npz/CSV/oracleGeneral), import, capture, fit",
        description="Work with kvcxl attention traces (docs/trace-format.md).",
    )
    ts = t.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    files = (opt("files", nargs="+"),)
    bad = "load and validate trace files (exit 2 on the first bad)"
    add_parser(ts, "validate", files, func=_trace_validate, help=bad)
    info = (opt("file"), opt("--json", action="store_true", help="print JSON"))
    add_parser(ts, "info", info, func=_trace_info, help="summary of a trace")
    add_parser(ts, "export", EXPORT_OPTIONS, func=_trace_export, **EXPORT_PARSER)
    tim = ts.add_parser(
        "import",
        help="read a published request trace (Mooncake), print its facts, write it as a trace",
        description=trace_import.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    trace_import.add_arguments(tim)
    add_options(tim, IMPORT_OPTIONS)
    tim.set_defaults(func=lambda a: trace_import.main(a, _shape(a), dict(a.workload_param)))
    capture = importlib.import_module("kvcxl.model.capture")  # no torch at import time
    tc = ts.add_parser("capture", help="record a Measured trace from SmolLM2-135M (offline)")
    capture.add_arguments(tc)
    tc.set_defaults(func=capture.main)
    model_cmds = importlib.import_module("kvcxl.cli.model")  # standard library only
    tp = ts.add_parser(
        "passkey", help="end-task quality: passkey retrieval under each policy's bounded cache"
    )
    model_cmds.add_passkey_arguments(tp)
    tp.set_defaults(func=model_cmds.passkey_main)
    fit = importlib.import_module("kvcxl.model.fit")  # numpy only: always present
    tf = ts.add_parser("fit", help="fit the synthetic attention generator to captured traces")
    fit.add_arguments(tf)
    tf.set_defaults(func=fit.cli)


# --- helpers -----------------------------------------------------------------------------------
def _shape(args: argparse.Namespace):
    from kvcxl.emu.shape import preset

    return preset(args.preset).with_(**{n: getattr(args, n) for n in SHAPE_OPTIONS})


def _policy_config(args: argparse.Namespace) -> dict[str, Any]:
    """Parameters from --config, overridden by options; validated by PolicyConfig."""
    base = PolicyConfig.load(args.config).to_dict() if args.config else {}
    opts = {n: getattr(args, f"p_{n}") for n in POLICY_OPTIONS}
    merged = {**base, **{k: v for k, v in opts.items() if v is not None}}
    PolicyConfig.from_mapping(merged)  # refuse a bad value now, naming it
    return merged


def _fmt_ci(v: float | None, ci: float | None, scale: float = 100.0, digits: int = 1) -> str:
    if v is None:
        return "—"
    s = f"{v * scale:.{digits}f}"
    if ci is not None:
        s += f" ±{ci * scale:.{digits}f}"
    return s


def format_table(rows: list[dict[str, Any]]) -> str:
    """The results as an aligned text table (hit rate in %, 95 % CI when seeds > 1)."""
    head = (
        f"{'policy':<16}{'budget':>9}{'hit rate %':>16}{'eff. lat. ns':>16}"
        f"{'stall µs/step':>15}{'tok/s':>10}{'moved MiB':>11}{'faults/audited':>16}"
    )
    lines = [head]
    for r in rows:
        aud = audit_cell(r)
        tps = r.get("tokens_per_s")
        moved = sum(r.get("bytes_moved_mean", {}).values()) / 2**20
        lines.append(
            f"{r['policy']:<16}{r['budget']:>9}{_fmt_ci(r['hit_rate'], r['hit_rate_ci95']):>16}"
            f"{_fmt_ci(r['effective_latency_ns'], r['effective_latency_ns_ci95'], 1, 0):>16}"
            f"{r['stall_ns_per_step_mean'] / 1e3:>15.1f}"
            f"{'—' if tps is None else f'{tps:,.0f}':>10}{moved:>11.1f}{aud:>16}"
        )
    return "\n".join(lines)


def plot_hit_rate(rows: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Hit rate vs budget (fraction of KV bytes), one line per policy, 95 % CI as error bars."""
    with figure(path, figure_dpi=120, tight=True, figsize=(8, 4.2)) as (_, ax):
        _draw_hit_rate(rows, title, ax)


def _draw_hit_rate(rows: list[dict[str, Any]], title: str, ax: Any) -> None:
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_policy.setdefault(r["policy"], []).append(r)
    for pol, rs in sorted(by_policy.items()):
        rs = sorted(rs, key=lambda r: r["budget_fraction"])
        x = [100 * r["budget_fraction"] for r in rs]
        y = [100 * r["hit_rate"] for r in rs]
        err = [100 * (r["hit_rate_ci95"] or 0) for r in rs]
        style = {"linestyle": "--", "color": "black"} if pol == "belady" else {}
        ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, label=pol, **style)
    ax.set_xlabel("HBM budget (% of the workload's KV bytes)")
    ax.set_ylabel("HBM hit rate (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.text(
        0.99,
        0.01,
        "Simulated",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=7,
        color="gray",
    )


def _spec_from_args(args: argparse.Namespace, policies, budgets):
    from kvcxl.emu.sim.sweep import SweepSpec

    timing = {n: getattr(args, n) for n in TIMING_OPTIONS if getattr(args, n) is not None}
    config = _policy_config(args)
    if getattr(args, "timing", None):  # a preset's CXL figures, under explicit overrides
        from kvcxl.emu.timeline.resources import PRESETS as TIMING_PRESETS
        from kvcxl.emu.timeline.resources import offload_preset

        p = (
            offload_preset(PolicyConfig.from_mapping(config).pcie_contention)
            if args.timing == "offload"
            else TIMING_PRESETS[args.timing]
        )
        timing = {"cxl_latency_ns": p.cxl_latency_ns, "cxl_gbps": p.cxl_gbps} | timing
    if args.compute_model:
        timing["compute_model"] = True
    if args.seeds < 1:
        raise ValueError(f"--seeds {args.seeds}: must be >= 1")
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: must be >= 1")
    if args.warmup >= args.steps:  # no step would be measured: every rate would be 0/0
        raise ValueError(
            f"--warmup {args.warmup}: must be less than --steps {args.steps} (the warm-up "
            "steps are excluded from the metrics)"
        )
    return SweepSpec(
        workload=None if args.trace else (args.workload or "zipf-sessions"),
        trace=args.trace,
        preset=args.preset,
        shape_overrides={
            n: getattr(args, n) for n in SHAPE_OPTIONS if getattr(args, n) is not None
        },
        steps=args.steps,
        seeds=list(range(args.seed, args.seed + (1 if args.trace else args.seeds))),
        policies=list(policies),
        budgets=list(budgets),
        config=config,
        workload_params=dict(args.workload_param),
        attention=dict(args.attention_param),
        read=args.read,
        granularity=args.granularity,
        prefetch=args.prefetch,
        prefetch_limit=args.prefetch_limit,
        placement=args.placement,
        audit=args.audit,
        warmup_steps=args.warmup,
        cxl=args.cxl,
        nvme=args.nvme,
        timing=timing,
        mode=args.mode,
        record_victims=bool(getattr(args, "dump_victims", None)),
        engine=getattr(args, "engine", None),
        timeline=bool(getattr(args, "timeline", False)),
    )


def _list() -> int:

    from kvcxl.emu.shape import PRESETS
    from kvcxl.emu.workloads import ALL_WORKLOADS

    print("workloads (the synthetic ones, then real arrivals):")
    for name, cls in ALL_WORKLOADS.items():
        params = ", ".join(f"{k}={v}" for k, v in cls.defaults.items())
        print(f"  {name:<14} {cls.summary}  [{params}]")
    print("policies:")
    for name, cls in sorted(POLICIES.items()):
        print(f"  {name:<14} {cls.summary}")
    from kvcxl.emu.workloads.attention import attention_source

    print("presets (and their synthetic attention):")
    for name, s in PRESETS.items():
        att = attention_source(name)
        print(
            f"  {name:<8} {s.layers} layers, {s.q_heads}/{s.kv_heads} Q/KV heads, d_head "
            f"{s.d_head}, {s.context_tokens:,} tokens, entry {s.entry_bytes:,} B; attention {att}"
        )
    return 0


# --- handlers ----------------------------------------------------------------------------------
def _simulate(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    from kvcxl.emu.sim.sweep import SweepSpec, combine, run_sweep

    if getattr(args, "versus_offload", False) and not args.serving:
        raise ValueError("--versus-offload compares serving metrics: add --serving")
    policies = args.policy or ["lru", "ema"]
    budgets = args.budget or [Budget.parse("25%", BYTES)]
    spec: SweepSpec = _spec_from_args(args, policies, budgets)
    from kvcxl.emu.sim.sweep import progress_units

    units = progress_units(spec, args.backend, args.jobs)
    bar, update = progress(units, "simulate", "run", off=args.no_progress)
    try:
        raw = run_sweep(
            spec, jobs=args.jobs, backend=args.backend, address=args.scheduler, progress=update
        )
    finally:
        if bar is not None:
            bar.close()
    rows = combine(raw)
    if args.trace:
        meta = _trace_meta(args.trace)
        shape = meta.get("shape", {})
        src = f"trace {args.trace}"
        head = (
            f"{src} ({meta.get('evidence')} trace, {shape.get('name')} shape, "
            f"{meta.get('source', '')}), prefetch {'on' if spec.prefetch else 'off'}; "
            "replay Simulated"
        )
    else:
        src = f"workload {spec.workload}"
        head = (
            f"{src}, preset {spec.preset}, {spec.steps} steps, {len(spec.seeds)} seed(s), "
            f"read {spec.read}, prefetch {'on' if spec.prefetch else 'off'}  (Simulated)"
        )
    print(head)
    print(format_table(rows))
    if args.dump_victims:
        _dump_victims(raw, args.dump_victims)
        wrote(args.dump_victims)
    doc = {"evidence": "Simulated", "config": spec.to_dict(), "results": rows}
    if args.serving:
        doc["serving"] = _serving(raw, spec, args)
        if getattr(args, "versus_offload", False):
            doc["versus_offload"] = _versus_offload(doc["serving"], spec, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2, default=_json_default))
        wrote(args.json_out)
    if args.plot:
        plot_hit_rate(rows, args.plot, f"{src} — hit rate vs HBM budget")
        wrote(args.plot)
    if args.audit:
        print(audit_sentence(audit_totals(rows)))
    faults = sum(r.get("audit_faults") or 0 for r in rows)
    if faults:
        print(
            f"eviction audit FAILED: {faults} faults (wrong victims, priorities that differ "
            "from the entries' history, victims outranked by history, pins broken)",
            file=sys.stderr,
        )
        return 1
    return 0


def _serving_rows(raw: list[dict[str, Any]], spec: Any, args: argparse.Namespace) -> list:
    from kvcxl.emu.serving import serving_rows, workload_turns
    from kvcxl.emu.workloads import make_workload

    def turns_of(seed: int):
        wl = make_workload(spec.workload, _shape(args), seed=seed, **spec.workload_params)
        return workload_turns(wl, spec.steps)

    return serving_rows(raw, None if spec.trace else turns_of)


def _versus_offload(device: list, spec: Any, args: argparse.Namespace) -> list:
    """The same runs with host-DRAM offload over PCIe in place of the device: one table."""
    from dataclasses import replace

    from kvcxl.emu.serving import format_versus
    from kvcxl.emu.sim.sweep import run_sweep
    from kvcxl.emu.timeline.resources import MEASURED_FRACTION, offload_preset

    setups = [("device", device)]
    for c in dict.fromkeys((PolicyConfig.from_mapping(spec.config).pcie_contention,
                            MEASURED_FRACTION)):  # fmt: skip
        p = offload_preset(c)
        timing = {**spec.timing, "cxl_latency_ns": p.cxl_latency_ns, "cxl_gbps": p.cxl_gbps}
        raw = run_sweep(replace(spec, timing=timing), jobs=args.jobs, backend=args.backend,
                        address=args.scheduler)  # fmt: skip
        setups.append((f"offload {c:g}x{p.cxl_gbps / c:g}GB/s", _serving_rows(raw, spec, args)))
    print(
        "CXL device versus host-DRAM offload over PCIe (same policy, workload and "
        + ("timeline" if spec.timeline else "analytic timing")
        + "; Simulated; docs/timeline.md)"
    )
    print(format_versus(setups))
    return [{"setup": name, **r} for name, rows in setups for r in rows]


def _serving(raw: list[dict[str, Any]], spec: Any, args: argparse.Namespace) -> list:
    """Print and return the serving metrics of the raw runs (docs/serving.md)."""
    from kvcxl.emu.serving import format_serving

    rows = _serving_rows(raw, spec, args)
    print("serving metrics (Simulated; energy: Analytical model inputs, docs/serving.md)")
    print(format_serving(rows))
    if spec.timeline:
        from kvcxl.emu.serving import format_timeline

        print(
            "timeline utilisation (busy time / run time, per resource; docs/timeline.md); "
            "link use above = the busier link direction"
        )
        print(format_timeline(rows))
    return rows


def _trace_meta(path: str) -> dict[str, Any]:
    """A trace file's metadata without loading its columns."""
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        return json.loads(str(npz["meta"][()]))


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def _dump_victims(raw: list[dict[str, Any]], path: str) -> None:
    import numpy as np

    with open(path, "w") as f:
        f.write("seed,policy,budget,step,context,layer,head,block,priority\n")
        for r in raw:
            v = r.get("_victims")
            r.pop("_victims", None)
            if v is None or v["step"].size == 0:
                continue
            n = v["step"].size
            cols = np.column_stack([v["step"], v["context"], v["layer"], v["head"], v["block"]])
            prefix = f"{r['seed']},{r['policy']},{r['budget']},"
            for i in range(n):
                f.write(
                    prefix + ",".join(map(str, cols[i].tolist())) + f",{v['priority'][i]:.9g}\n"
                )


def _sizing(args: argparse.Namespace) -> int:
    from kvcxl.emu.shape import Deployment, format_sizing, sizing

    dep = Deployment(
        users=args.users,
        hbm_bytes=parse_size(args.hbm),
        weights_bytes=parse_size(args.weights),
        activations_bytes=parse_size(args.activations),
        pinned_bytes=parse_size(args.pinned),
        cxl_bytes=parse_size(args.cxl),
        nvme_bytes=parse_size(args.nvme),
    )
    from kvcxl.emu.economics import format_economics, tier_economics

    shape = _shape(args)
    r = sizing(shape, dep)
    r["tier_economics"] = tier_economics(shape)
    print(format_sizing(r))
    print(format_economics(r["tier_economics"]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(r, indent=2))
        wrote(args.json_out)
    return 0


def _demo(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from kvcxl.emu.sim.sweep import SweepSpec, combine, run_sweeps
    from kvcxl.firmware.policies import ranked

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = SweepSpec(
        workload=args.workload,
        preset="ci",
        steps=args.steps,
        seeds=list(range(args.seeds)),
        policies=ranked(),
        budgets=list(DEMO_BUDGETS),
        audit=False,
        warmup_steps=args.steps // 10,
        mode=args.mode,
    )
    sample = dataclasses.replace(
        spec, seeds=[0], budgets=[DEMO_AUDIT_BUDGET], audit=True, engine="numpy"
    )
    t0 = time.perf_counter()
    # one task per seed replays both specs on the seed's stream (compiled once)
    bar, update = progress(args.seeds, "demo", "seed", off=args.no_progress)
    try:
        raw, raw_audit = run_sweeps([spec, sample], jobs=args.jobs, progress=update)
    finally:
        if bar is not None:
            bar.close()
    rows = combine(raw)
    audit_rows = combine(raw_audit)
    mismatch = _engines_disagree(raw, raw_audit)
    wall = time.perf_counter() - t0
    table = format_table(rows)
    from kvcxl.emu.workloads.attention import FITTED_PRESETS, attention_source

    attention = attention_source(spec.preset)
    if spec.preset in FITTED_PRESETS:
        attention += " (docs/model.md)"
    head = (
        f"workload {spec.workload} on the {spec.preset} preset, {spec.steps} decode steps "
        f"({spec.warmup_steps} warm-up excluded), {len(spec.seeds)} seeds, dense reads, "
        f"synthetic attention {attention}, prefetch off, {spec.mode} arithmetic, fast "
        "engine. Simulated."
    )
    audit_head = (
        f"Audited sample: every policy at {DEMO_AUDIT_BUDGET} on seed 0, replayed on the "
        "numpy engine with the eviction audit on (faults/victims; 'not audited': the "
        "policy's priority is not an entry's own history, top-k only). Its hits equal the "
        "fast engine's: " + ("yes, every policy." if not mismatch else f"NO: {mismatch}.")
    )
    audit_table = format_audit_table(audit_rows)
    print(head)
    print(table)
    print()
    print(audit_head)
    print(audit_table)
    plot_hit_rate(rows, out / "hit_rate.png", f"{spec.workload} (ci preset) — hit rate vs budget")
    doc = {
        "evidence": "Simulated",
        "config": spec.to_dict(),
        "wall_s": wall,
        "results": rows,
        "audit_sample": {"config": sample.to_dict(), "results": audit_rows,
                         "engines_disagree": mismatch},
    }  # fmt: skip
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=_json_default))
    audit_part = (audit_head, audit_table, audit_sentence(audit_totals(audit_rows)))
    (out / "report.md").write_text(_demo_report(head, table, rows, wall, audit_part))
    print(
        f"wrote {out / 'report.md'}, {out / 'results.json'}, {out / 'hit_rate.png'} in {wall:.0f} s"
    )
    return 1 if mismatch or sum(r.get("audit_faults") or 0 for r in audit_rows) else 0


def _engines_disagree(raw: list[dict[str, Any]], audited: list[dict[str, Any]]) -> list[str]:
    """The audited sample's runs whose hits differ from the same run on the fast engine."""
    fast = {(r["policy"], r["budget"], r["seed"]): r["hits"] for r in raw}
    return [
        f"{r['policy']} {r['budget']} seed {r['seed']}: {fast.get(key)} vs {r['hits']} hits"
        for r in audited
        if fast.get(key := (r["policy"], r["budget"], r["seed"])) != r["hits"]
    ]


def format_audit_table(rows: list[dict[str, Any]]) -> str:
    """The audited sample: one line per policy with its hit rate and its audit cell."""
    lines = [f"{'policy':<16}{'budget':>9}{'hit rate %':>12}{'victims':>10}{'audit':>18}"]
    for r in rows:
        lines.append(
            f"{r['policy']:<16}{r['budget']:>9}{100 * r['hit_rate']:>12.1f}"
            f"{r.get('audited_victims') or 0:>10}{audit_cell(r):>18}"
        )
    return "\n".join(lines)


def _demo_report(
    head: str, table: str, rows: list[dict[str, Any]], wall: float, audit: tuple[str, str, str]
) -> str:
    lines = [
        "# kvcxl demo",
        "",
        head,
        "",
        "```",
        table,
        "```",
        "",
        "![hit rate vs budget](hit_rate.png)",
        "",
    ]
    share = {r["budget"]: r["budget_fraction"] for r in rows}  # the budget as a share of KV
    budgets = sorted(share, key=share.__getitem__)
    lines.append("## Best online policy per budget (vs Belady's optimum)")
    lines.append("")
    for b in budgets:
        at = [r for r in rows if r["budget"] == b]
        opt = next((r for r in at if r["policy"] == "belady"), None)
        online = [r for r in at if r["policy"] != "belady"]
        best = max(online, key=lambda r: r["hit_rate"])
        gap = f"; Belady {100 * opt['hit_rate']:.1f} %" if opt else ""
        lines.append(f"- budget {b}: {best['policy']} {100 * best['hit_rate']:.1f} %{gap}")
    lines += [
        "",
        f"Wall time {wall:.0f} s. Every figure is Simulated (kvcxl simulator, "
        "synthetic attention); hit rate = entry reads served from HBM / all entry reads; "
        "± is the 95 % confidence interval over seeds.",
        "",
        "## The audited sample",
        "",
        audit[0],
        "",
        "```",
        audit[1],
        "```",
        "",
        audit[2],
        "",
    ]
    return "\n".join(lines)


def _trace_validate(args: argparse.Namespace) -> int:
    import numpy as np

    from kvcxl.emu.trace import Trace

    for f in args.files:
        t = Trace.load(f)  # TraceError (a ValueError) → one line, exit 2
        writes = len(t) - int(np.count_nonzero(t.read_mask))
        print(
            f"{f}: valid kvcxl trace v{t.version}, {len(t) - writes:,} read records"
            + (f" and {writes:,} write records" if writes else "")
            + f", {t.n_steps} steps, evidence {t.evidence}"
        )
    return 0


def _trace_info(args: argparse.Namespace) -> int:
    from kvcxl.emu.trace import Trace

    info = Trace.load(args.file).info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for k, v in info.items():
        if k == "extra" and isinstance(v, dict):
            for ek, ev in v.items():
                text = repr(ev)
                print(f"extra.{ek:<12} {text if len(text) <= 100 else text[:97] + '...'}")
            continue
        print(f"{k:<18} {v}")
    return 0


def _trace_export(args: argparse.Namespace) -> int:
    from kvcxl.emu.sim.export import write_csv, write_oracle_general
    from kvcxl.emu.trace import Trace
    from kvcxl.emu.workloads import compile_workload, from_trace, make_workload

    if args.reads_only and args.format != "npz":
        raise ValueError("--reads-only applies to --format npz (csv and oracle-general are reads)")
    if args.trace:
        trace = Trace.load(args.trace)
        stream = from_trace(trace)
    else:
        wl = make_workload(args.workload, _shape(args), seed=args.seed, **dict(args.workload_param))
        stream = compile_workload(wl, args.steps, read=args.read)
        trace = None
    if args.format == "npz":
        if args.reads_only or trace is None:
            trace = stream.to_trace(writes=not args.reads_only)
        trace.save(args.output)
        info = trace.info()
        n = info["records"]
        what = f"{n:,} reads, {info['write_records']:,} writes (npz, version {trace.version})"
    elif args.format == "csv":
        n = write_csv(stream, args.output)
        what = f"{n:,} requests (csv)"
    else:
        n = write_oracle_general(stream, args.output)
        what = f"{n:,} requests (oracle-general)"
    wrote(f"{args.output}: {what}")
    return 0
