"""16 concurrent clients on the service socket (kvcxl.emu.device.load): every byte each
client wrote reads back as written, no error frame; and the checker sees a planted fault."""

from __future__ import annotations

import pytest

from kvcxl.emu.device import service as svc
from kvcxl.emu.device.device import Type3Device
from kvcxl.emu.device.load import run_load

BASE = 1 << 32


@pytest.fixture
def served(tmp_path):
    dev = Type3Device(256 << 20)
    dev.hdm.program(0, base=BASE, size=256 << 20)
    dev.hdm.commit(0)
    with svc.serving(svc.Engine(dev), tmp_path / "load.sock") as server:
        yield server, dev


def test_sixteen_clients_lose_nothing(served) -> None:
    server, _ = served
    r = run_load(server.path, BASE, clients=16, ops=40, seconds=60)
    assert r["ops"] == 16 * 40 and r["round_trips"] == 2 * r["ops"]
    assert r["errors"] == 0 and r["mismatched_bytes"] == 0, r["first_error"]
    assert 0 < r["latency_p50_us"] <= r["latency_p99_us"]


def test_the_load_checker_sees_a_lost_write(served, monkeypatch) -> None:
    """A device that silently drops one write in 50: the read-back comparison counts it."""
    server, dev = served
    real = dev.write
    calls = [0]

    def lossy(hpa, data, **kw):
        calls[0] += 1
        if calls[0] % 50 == 0:
            return True  # acknowledged, never stored
        return real(hpa, data, **kw)

    monkeypatch.setattr(dev, "write", lossy)
    r = run_load(server.path, BASE, clients=16, ops=40, seconds=60)
    assert r["errors"] == 0 and r["mismatched_bytes"] > 0, r["first_error"]
