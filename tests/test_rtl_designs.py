"""The RTL design registry (rtl/designs.py): each entry is whole and what reads it agrees."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcxl.rtl import designs

TB = Path(__file__).resolve().parents[1] / "tb"


def test_every_bench_and_model_the_registry_names_is_a_testbench_module() -> None:
    for d in designs.DESIGNS.values():
        for mod in (d.bench, d.model):
            if mod is not None:
                assert (TB / f"{mod}.py").is_file(), f"{d.name}: tb/{mod}.py"


@pytest.mark.hdl
def test_every_unit_bench_has_a_model_that_shapes_its_design() -> None:
    """tb/runner.py's run_unit builds a design with its model's params() (core's pyuvm test
    is shaped by run_core's options instead)."""
    import importlib

    for d in designs.DESIGNS.values():
        if d.bench and d.name != "core":
            model = importlib.import_module(f"kvcxl.tb.{d.model}")
            assert callable(getattr(model, "params", None)), f"tb/{d.model}.py: params()"
            assert d.bench_count[1] >= 1, d.name


def test_every_defect_belongs_to_one_check_of_one_design() -> None:
    owners = [(x, c) for d in designs.DESIGNS.values() for c, xs in d.formal.items() for x in xs]
    assert len(owners) == len(designs.DEFECTS) == len({x for x, _ in owners})
    assert set(designs.DEFECTS.values()) == set(designs.CHECKS)


def test_every_rtl_sim_policy_plants_its_designs_replay_defects() -> None:
    from kvcxl.cli.tb import SIM_DEFECTS, SIM_OPTIONS
    from kvcxl.rtl.verilated_records import DRAM_DEFECTS

    rows = [o for o in SIM_OPTIONS if isinstance(o, tuple)]
    policies = next(kw for flags, kw in rows if "--policy" in flags)["choices"]
    assert set(SIM_DEFECTS) == {*policies, "ema --records dram"}
    for d in designs.DESIGNS.values():
        if d.sim_policy:
            assert d.replay and SIM_DEFECTS[d.sim_policy][-len(d.replay) :] == d.replay
    assert SIM_DEFECTS["ema --records dram"][0] in DRAM_DEFECTS  # the DRAM model's own


def test_an_unknown_design_is_refused_with_the_list() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*core, eviction"):
        designs.get("nope")


@pytest.mark.hdl
def test_every_check_has_a_harness() -> None:
    from kvcxl.rtl.formal import HARNESSES

    assert set(HARNESSES) == set(designs.CHECKS)


@pytest.mark.hdl
@pytest.mark.parametrize("name", list(designs.DESIGNS))
def test_every_design_builds_from_its_entry(name: str) -> None:
    """Its factory takes its defaults; its engine module's own defect list holds the ones the
    registry gives its checks; its Verilog module carries the registry's name."""
    from kvcxl.rtl.export import to_verilog, verilog_params

    d = designs.get(name)
    dut = d.factory(**verilog_params(name))
    for defect in (*(x for xs in d.formal.values() for x in xs), *d.replay):
        d.factory(**verilog_params(name), defect=defect)  # refused if the engine lacks it
    if name in ("core", "scoring", "eviction", "hdm"):  # small at their defaults
        assert f"module {d.module}(" in to_verilog(dut, d.module)
