"""Build the RTL and run a cocotb + pyuvm testbench on Verilator or Icarus, from Python.

    from kvcxl.tb.runner import run_core
    res = run_core("icarus", entries=16, lanes=4, batch=8, steps=2000, seed=1)

Builds go under ``build/tb/<config>/`` (gitignored) and are reused when the
generated Verilog has not changed.  Returns the testbench's figures (dict).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path

from kvcxl.rtl import designs, toolchain
from kvcxl.rtl.export import build, default_decay, to_verilog, write_if_changed

SIMULATORS = ("verilator", "icarus")
TOPLEVEL = designs.get("core").module


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


def run_frontend(
    sim: str = "verilator", *, messages: int | None = None, seed: int | None = None
) -> dict:
    """The CXL.mem front end on ``sim`` (``tb/cocotb_frontend.py``): ``messages`` random
    M2S messages per HDM setup against the emulator's decoder and a line store."""
    return run_unit("frontend", sim, seed=seed, count=messages)


def run_prefetch(
    sim: str = "verilator", *, touches: int | None = None, seed: int | None = None
) -> dict:
    """The PrefetchEngine on ``sim`` (``tb/cocotb_prefetch.py``): ``touches`` random touches
    under each parameter set of ``prefetch_model.configs`` against the firmware's ranking."""
    return run_unit("prefetch", sim, seed=seed, count=touches)


# The generated Verilog's combinational blocks wait on a trigger register that only its
# declaration sets (`reg \$auto$verilog_backend... = 0;`), and in cocotb's -g2012 mode
# Icarus takes a declaration's value without an event; so a block whose inputs keep their
# declared values (a ready that depends only on a state reset leaves as it was, a copy of a
# register still at its initial value) or has no inputs at all (`always @* x = <constant>;`)
# never runs and its outputs stay X. The trigger is set at time 0 instead (an event), and
# every one-statement block also waits on it, so that each block runs once at the start.
_TRIGGER = re.compile(r"reg (\\\$auto\$verilog_backend\S+ ) = 0;")
_ONE_STATEMENT = re.compile(r"always @\*\n(\s+)([^\n;]+;)")


def icarus_start(verilog: str) -> str:
    """``verilog`` with every combinational block run once at time 0 on Icarus (see above)."""
    return "".join(_icarus_module(m) for m in re.split(r"(?=^module )", verilog, flags=re.M))


def _icarus_module(text: str) -> str:
    m = _TRIGGER.search(text)
    if m is None:
        return text
    trigger = m[1]
    v = _TRIGGER.sub(lambda m: f"reg {m[1]};\n  initial #0 {m[1]} = 1'h0;", text)
    return _ONE_STATEMENT.sub(
        lambda m: f"always @* begin\n{m[1]}if ({trigger}) begin end\n{m[1]}{m[2]}\n  end", v
    )


def run_top(sim: str = "verilator", *, steps: int | None = None, seed: int | None = None) -> dict:
    """The PolicyEngine top on ``sim`` (``tb/cocotb_top.py``): ``steps`` steps of reports,
    CXL.mem reads, an evaluation and an update sweep and a prefetch, against the firmware."""
    return run_unit("top", sim, seed=seed, count=steps)


def run_unit(
    design: str,
    sim: str = "verilator",
    *,
    seed: int | None = None,
    count: int | None = None,
    defect: str | None = None,
) -> dict:
    """Build ``design`` alone with its model's ``params()`` and run its cocotb module, both
    named by its entry in :data:`kvcxl.rtl.designs.DESIGNS`; ``count`` is how long the bench
    runs (its ``bench_count``: steps, messages, touches; default the registry's); ``defect``
    plants one of the design's defects (the bench must then fail)."""
    d = designs.get(design)
    name, default = d.bench_count
    if design == "core":  # the pyuvm test: its shape and defect are run_core's options
        return run_core(sim, steps=count or default, seed=seed)
    if d.bench is None or d.model is None:
        benched = [n for n, x in designs.DESIGNS.items() if x.bench and x.model]
        raise ValueError(f"design = {design!r} has no testbench; these do: {', '.join(benched)}")
    if sim not in SIMULATORS:
        raise ValueError(f"sim = {sim!r}: must be one of {SIMULATORS}")
    toolchain.apply_env()
    toolchain.require(*(("verilator",) if sim == "verilator" else ("iverilog", "vvp")))
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    model = importlib.import_module(f"kvcxl.tb.{d.model}")
    bdir = build_root() / (f"{sim}-{design}" + (f"-{defect}" if defect else ""))
    src = bdir / f"{d.module}.v"
    extra = {"defect": defect} if defect else {}
    text = to_verilog(build(design, **model.params(), **extra), d.module)
    write_if_changed(src, icarus_start(text) if sim == "icarus" else text)
    if count is not None and count < 1:
        raise ValueError(f"{name} = {count}: must be ≥ 1")
    cfg = {name: count or default, "seed": seed, "results": str(bdir / f"results-{seed}.json"),
           "design": design}  # fmt: skip
    print(f"tb: {sim} {design} {cfg} seed={seed}", flush=True)
    res, *_ = _cocotb(sim, src, d.module, bdir, f"kvcxl.tb.{d.bench}", cfg, seed)
    return res
