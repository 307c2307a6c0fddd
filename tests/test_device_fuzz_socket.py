"""The socket fuzzer (kvcxl.emu.device.fuzz_socket): every case mutated, every answer
predicted by its protocol model; crashes, wrong answers and bytes changed outside the
addressed range all count, and each is seen when planted."""

from __future__ import annotations

import pytest

from kvcxl.emu.device import service as svc
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.fuzz_socket import run

BASE, CAP = 1 << 32, 256 << 20


@pytest.fixture
def served(tmp_path):
    dev = Type3Device(CAP)
    dev.hdm.program(0, base=BASE, size=CAP)
    dev.hdm.commit(0)
    with svc.serving(svc.Engine(dev), tmp_path / "fuzz.sock") as server:
        yield server, dev


def test_the_service_answers_every_mutated_case_as_the_model_predicts(served) -> None:
    server, dev = served
    r = run(server.path, BASE, BASE + CAP, 3000, seed=1, sweep_every=1000)
    assert r["cases"] == 3000 and r["unmodified_cases"] == 0
    assert (r["crashes"], r["wrong_answers"], r["changed_bytes"]) == (0, 0, 0), r["examples"]
    assert dev.counters["internal_errors"] == 0
    assert set(r["mutations"]) == {"flip", "truncate", "extend", "boundary", "kind", "frame_length"}
    for kind in ("READ", "WRITE", "MEM"):  # each kind both answered and refused
        outcomes = {k.split(" -> ")[1] for k in r["coverage"] if k.startswith(kind + " ")}
        assert any(o.startswith("ERROR") for o in outcomes), kind
        assert any(not o.startswith("ERROR") for o in outcomes), kind


def test_a_write_past_its_range_is_counted(served, monkeypatch) -> None:
    server, dev = served
    real = dev.write
    monkeypatch.setattr(
        dev, "write", lambda hpa, data, **kw: real(hpa, bytes(data) + b"\x55", **kw)
    )
    r = run(server.path, BASE, BASE + CAP, 300, seed=2, sweep_every=100)
    assert r["changed_bytes"] + r["wrong_answers"] > 0


def test_a_wrong_return_code_is_counted(served, monkeypatch) -> None:
    server, _ = served
    monkeypatch.setattr(svc, "MAX_IO", 1 << 21)  # the service forgets its 1 MiB limit
    r = run(server.path, BASE, BASE + CAP, 1500, seed=3)
    assert r["wrong_answers"] > 0 and r["crashes"] == 0


def test_an_internal_error_is_a_crash(served, monkeypatch) -> None:
    server, dev = served
    real = dev.read

    def fails(hpa, n, **kw):
        if n == 1:
            raise KeyError("planted")
        return real(hpa, n, **kw)

    monkeypatch.setattr(dev, "read", fails)
    r = run(server.path, BASE, BASE + CAP, 1500, seed=4)
    assert r["crashes"] > 0
