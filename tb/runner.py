"""Build the RTL and run a cocotb + pyuvm testbench on Verilator or Icarus, from Python.

    from kvcxl.tb.runner import run_core
    res = run_core("icarus", entries=16, lanes=4, batch=8, steps=2000, seed=1)

Builds go under ``build/tb/<config>/`` (gitignored) and are reused when the
generated Verilog has not changed.  Returns the testbench's figures (dict).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from kvcxl.rtl import toolchain
from kvcxl.rtl.export import build, default_decay, to_verilog, write_if_changed

SIMULATORS = ("verilator", "icarus")
TOPLEVEL = "policy_core"


def build_root() -> Path:
    return Path(os.environ.get("KVCXL_BUILD", Path.cwd() / "build")) / "tb"


class TbFailure(RuntimeError):
    """The testbench found a mismatch or produced no results: ``kvcxl`` prints it as one line
    and exits with ``exit_code``."""

    exit_code = 1


def run_core(
    sim: str = "verilator",
    *,
    entries: int = 16,
    lanes: int = 4,
    batch: int = 8,
    steps: int = 1000,
    seed: int | None = None,
    defect: str | None = None,
    waves: bool = False,
    verbose: bool = False,
) -> dict:
    """Run the PolicyCore test; raises :class:`TbFailure` (a RuntimeError) if it failed."""
    if sim not in SIMULATORS:
        raise ValueError(f"sim = {sim!r}: must be one of {SIMULATORS}")
    if steps < 1:
        raise ValueError(f"steps = {steps}: must be ≥ 1")
    toolchain.apply_env()
    toolchain.require(*(("verilator",) if sim == "verilator" else ("iverilog", "vvp")))
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    tag = f"core-e{entries}-l{lanes}-b{batch}" + (f"-{defect}" if defect else "")
    bdir = build_root() / (f"{sim}-{tag}" + ("-waves" if waves else ""))
    src = bdir / f"{TOPLEVEL}.v"
    design = build(
        "core", entries=entries, lanes=lanes, batch=batch, decay_init=default_decay(), defect=defect
    )
    write_if_changed(src, to_verilog(design, TOPLEVEL))

    results = bdir / f"results-{seed}.json"
    cfg = {
        "entries": entries,
        "lanes": lanes,
        "batch": batch,
        "steps": steps,
        "seed": seed,
        "defect": defect,
        "results": str(results),
    }
    print(f"tb: {sim} {tag} steps={steps} seed={seed}", flush=True)
    res, *_ = _cocotb(
        sim, src, TOPLEVEL, bdir, "kvcxl.tb.cocotb_policy_core", cfg, seed, waves, verbose
    )
    if waves:
        wf = "dump.vcd" if sim == "verilator" else f"{TOPLEVEL}.fst"
        res["waves"] = str(bdir / wf)
    return res


def _cocotb(
    sim: str,
    src: Path,
    toplevel: str,
    bdir: Path,
    test_module: str,
    cfg: dict,
    seed: int,
    waves: bool = False,
    verbose: bool = False,
) -> tuple[dict, Path, float, float]:
    """Build ``src`` and run the cocotb module ``test_module`` on it; the results file
    (``cfg["results"]``) as a dict, the results XML, build and run seconds."""
    from cocotb_tools.runner import get_results, get_runner  # lazy: the 'hdl' extra

    runner = get_runner(sim)
    build_args = ["-Wno-fatal", "-O3"] if sim == "verilator" else []
    t0 = time.perf_counter()
    runner.build(
        sources=[src],
        hdl_toplevel=toplevel,
        build_dir=bdir,
        build_args=build_args,
        waves=waves,
        timescale=("1ns", "1ps"),
    )
    build_s = time.perf_counter() - t0
    results = Path(cfg["results"])
    results.unlink(missing_ok=True)
    tb_dir = str(Path(__file__).parent)
    if tb_dir not in sys.path:  # the runner hands sys.path on as PYTHONPATH
        sys.path.insert(0, tb_dir)
    os.environ["KVCXL_TB_CONFIG"] = json.dumps(cfg)
    t1 = time.perf_counter()
    try:
        xml = runner.test(
            test_module=test_module,
            hdl_toplevel=toplevel,
            build_dir=bdir,
            test_dir=bdir,
            seed=seed,
            waves=waves,
            extra_env={"KVCXL_TB_CONFIG": json.dumps(cfg)},
            verbose=verbose,
        )
    except SystemExit as exc:
        # cocotb's runner exits (under pytest on a failed test, or when the simulator fails)
        # instead of raising: say what the test saw, on one line.
        if results.exists():
            res = json.loads(results.read_text())
            raise TbFailure(
                f"{sim}: testbench failed (seed {seed}): {res.get('examples', [])[:3]}"
            ) from None
        raise TbFailure(
            f"{sim}: the simulator exited with status {exc.code} (seed {seed})"
        ) from None
    run_s = time.perf_counter() - t1
    if not results.exists():
        raise TbFailure(f"testbench produced no results (see {xml})")
    res = json.loads(results.read_text())
    res["build_s"] = round(build_s, 2)
    res["run_s"] = round(run_s, 2)
    res["results_xml"] = str(xml)
    tests, fails = get_results(xml)
    res["cocotb_tests"], res["cocotb_failures"] = tests, fails
    if fails:
        raise TbFailure(
            f"{sim}: testbench failed (seed {seed}): {res.get('examples', [])[:3]}; see {xml}"
        )
    return res, xml, build_s, run_s


FRONTEND = {"lines": 16, "entry_shift": 8, "entries": 64}
FRONTEND_SETUPS = ((1, 256, 0), (2, 1024, 1), (4, 256, 3))  # HDM ways, granularity, position


def run_frontend(sim: str = "verilator", *, messages: int = 150, seed: int | None = None) -> dict:
    """The CXL.mem front end on ``sim`` (``tb/cocotb_frontend.py``): ``messages`` random
    M2S messages per HDM setup against the emulator's decoder and a line store."""
    if sim not in SIMULATORS:
        raise ValueError(f"sim = {sim!r}: must be one of {SIMULATORS}")
    toolchain.apply_env()
    toolchain.require(*(("verilator",) if sim == "verilator" else ("iverilog", "vvp")))
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    top = "cxl_mem_front_end"
    bdir = build_root() / f"{sim}-frontend"
    src = bdir / f"{top}.v"
    write_if_changed(src, to_verilog(build("frontend", **FRONTEND), top))
    cfg = {
        "seed": seed,
        "messages": messages,
        "lines": FRONTEND["lines"],
        "entry_shift": FRONTEND["entry_shift"],
        "setups": FRONTEND_SETUPS,
        "results": str(bdir / f"results-{seed}.json"),
    }
    print(f"tb: {sim} frontend messages={messages} seed={seed}", flush=True)
    res, *_ = _cocotb(sim, src, top, bdir, "kvcxl.tb.cocotb_frontend", cfg, seed)
    return res
