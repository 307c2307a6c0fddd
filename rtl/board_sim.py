"""The board top Verilated with a UART model behind a pseudo-terminal (``board_sim.cpp``).

``serve()`` builds it (once per shape and bit time; later calls reuse the binary) and
yields the pty's path: the host driver opens it exactly as it opens ``/dev/ttyUSB0``.
The UART bit time is a few clock cycles (``divisor``), not the board's baud rate.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import toolchain
from .board import BoardTop, EngineShape
from .export import default_decay, to_verilog, write_if_changed

HARNESS = Path(__file__).with_name("board_sim.cpp")
SIM_DIVISOR = 8  # clock cycles per UART bit in simulation


def build_dir() -> Path:
    return Path(os.environ.get("KVCXL_BUILD", Path.cwd() / "build")) / "board_sim"


def build(shape: EngineShape, divisor: int = SIM_DIVISOR, *, root: Path | None = None) -> Path:
    """Verilate the board top with the harness; returns the binary (reused if unchanged)."""
    toolchain.require("verilator")
    text = to_verilog(BoardTop(shape, divisor, decay_init=default_decay()), "board")
    cpp = HARNESS.read_text()
    tag = hashlib.sha256((text + cpp).encode()).hexdigest()[:12]
    d = (root or build_dir()) / f"e{shape.entries}-l{shape.lanes}-b{shape.batch}-d{divisor}"
    exe = d / "obj" / "board_sim"
    stamp = d / "stamp"
    if exe.exists() and stamp.exists() and stamp.read_text() == tag:
        return exe
    write_if_changed(d / "board.v", text)
    write_if_changed(d / "board_sim.cpp", cpp)
    r = subprocess.run(
        [
            "verilator",
            "--cc",
            "--exe",
            "--build",
            "-O2",
            "-Wno-fatal",
            "-Wno-lint",
            "--top-module",
            "board",
            "--Mdir",
            "obj",
            "-o",
            "board_sim",
            "board.v",
            "board_sim.cpp",
        ],
        cwd=d,
        env=toolchain.tool_env(),
        capture_output=True,
        text=True,
    )
    if r.returncode or not exe.exists():
        raise toolchain.ToolError(f"verilator failed: {toolchain.one_line(r.stderr + r.stdout)}")
    stamp.write_text(tag)
    return exe


@contextmanager
def serve(
    shape: EngineShape, divisor: int = SIM_DIVISOR, *, root: Path | None = None
) -> Iterator[str]:
    """Run the Verilated board; yields the path of its pty; stops it on exit."""
    exe = build(shape, divisor, root=root)
    proc = subprocess.Popen(
        [str(exe), str(divisor)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        path = proc.stdout.readline().strip()
        if not path:
            raise toolchain.ToolError(f"board_sim did not start: {proc.stderr.read()[-300:]}")
        yield path
    finally:
        proc.terminate()
        proc.wait(timeout=10)
