"""``make test``'s scheduling units (tests/conftest.py): what one xdist worker runs whole."""

from __future__ import annotations

from conftest import _work_unit


def test_a_file_is_one_unit() -> None:
    a = _work_unit("tests/test_sim_fast.py::test_a[lru]")
    assert a == _work_unit("tests/test_sim_fast.py::test_b") == "tests/test_sim_fast.py"


def test_every_guest_file_is_one_unit() -> None:
    boots = {_work_unit(f"tests/{f}::t") for f in ("test_qemu_boot.py", "test_qemu_kvm.py")}
    assert boots == {"qemu guests"}


def test_each_proof_is_its_own_unit() -> None:
    clock = _work_unit("tests/test_rtl_formal.py::test_bounded_proof_passes[clock]")
    sieve = _work_unit("tests/test_rtl_formal.py::test_bounded_proof_passes[sieve]")
    assert clock != sieve
    assert clock.endswith("[clock]")
