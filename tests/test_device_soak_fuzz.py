"""Soak and fuzz: small runs here, the acceptance runs (1 M ops, 100 k cases) marked slow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvcxl.emu.device import fuzz, media, soak


def test_small_soak_is_lossless_and_migrates():
    r = soak.run(soak.SoakConfig(ops=6000, seed=3))
    assert r["mismatched_bytes"] == 0 and r["wrong_victims"] == 0
    assert r["poison_checks"] >= 5 and r["poison_errors"] == 0
    assert r["migrations"] > 500 and r["mem_transactions"] > 100
    assert r["bytes_checked"] > 5 * (4 << 20)  # every set-up's final sweep at least
    assert [(s["ways"], s["granularity"]) for s in r["setups"]] == list(soak.SETUPS)


def test_soak_catches_a_lost_migration(monkeypatch):
    # A migration reads its source with peek (then records the new tier, then drops it).
    real_peek = media.DictStore.peek

    def lossy_peek(self, page):
        data = real_peek(self, page)
        return None if data is not None and page % 7 == 0 else data  # drop some pages

    monkeypatch.setattr(media.DictStore, "peek", lossy_peek)
    r = soak.run(soak.SoakConfig(ops=3000, setups=((1, 4096),), seed=1))
    assert r["mismatched_bytes"] > 0


def test_soak_catches_lost_poison(monkeypatch):
    from kvcxl.emu.device.device import Type3Device

    monkeypatch.setattr(Type3Device, "inject_poison", lambda self, dpa: None)
    r = soak.run(soak.SoakConfig(ops=3000, setups=((2, 256),), seed=2))
    assert r["poison_errors"] > 0


def test_soak_refuses_bad_configuration():
    with pytest.raises(ValueError, match="span"):
        soak.SoakConfig(ops=10, setups=((3, 256),))
    with pytest.raises(ValueError, match="ops"):
        soak.SoakConfig(ops=0)


def test_small_fuzz_has_no_crash_and_covers_every_outcome_family():
    r = fuzz.run(3000, seed=5, hypothesis_fraction=0.1)
    assert r["cases"] == 3000 and r["crashes"] == 0, r["crash_examples"]
    families = {k.split(":")[0] for k in r["return_codes"]}
    assert {"mem", "cci", "error", "hdm", "read", "write"} <= families
    assert r["return_codes"]["cci:INVALID_PAYLOAD_LENGTH"] > 0
    assert r["return_codes"]["mem:MEM_DATA_NXM"] > 0


def test_fuzz_counts_a_handler_bug_as_a_crash(monkeypatch):
    f = fuzz.Fuzzer(0)

    def broken(_payload: bytes) -> bytes:
        raise KeyError("bug")

    from kvcxl.cxl import mailbox as mb

    f.engine.mailbox.handlers[mb.Opcode.GET_HEALTH_INFO] = broken
    f.run_case(0x02, mb.request(mb.Opcode.GET_HEALTH_INFO, b"", 1), 1)
    assert f.outcomes == {"crash:internal_error": 1}


def test_a_device_bug_behind_a_return_code_is_counted(monkeypatch):
    """A plain ValueError from device code is a bug: Internal Error, counted by the device
    and failing the fuzzer; only the device's named refusal (RequestError) is Invalid Input."""
    import numpy as np

    from kvcxl.cxl import mailbox as mb
    from kvcxl.emu.device.device import Type3Device

    f = fuzz.Fuzzer(0)
    report = mb.COMMANDS[mb.Opcode.VENDOR_ATTENTION_REPORT].request
    out_of_range = report.fixed.pack(0, 1) + np.array([(10**6, 0.5)], report.records).tobytes()
    f.run_case(0x02, mb.request(mb.Opcode.VENDOR_ATTENTION_REPORT, out_of_range, 3), 3)
    assert f.outcomes == {"cci:INVALID_INPUT": 1}
    assert f.engine.device.counters["internal_errors"] == 0

    def buggy(self, step, ids, weights):
        raise ValueError("operands could not be broadcast together")

    monkeypatch.setattr(Type3Device, "report_decisions", buggy)
    valid = report.fixed.pack(0, 1) + np.array([(1, 0.5)], report.records).tobytes()
    f.run_case(0x02, mb.request(mb.Opcode.VENDOR_ATTENTION_REPORT, valid, 4), 4)
    assert f.outcomes["crash:internal_error"] == 1
    assert f.engine.device.counters["internal_errors"] == 1
    r = fuzz.run(300, seed=1, hypothesis_fraction=0)
    assert r["device_internal_errors"] > 0 and r["crashes"] > 0


def test_an_hdm_frame_is_refused_by_name_and_a_decoder_bug_is_counted(monkeypatch):
    from kvcxl.cxl.hdm import HdmDecoderSet
    from kvcxl.emu.device.service import HDM

    engine = fuzz.make_engine(0)
    for req in ({"op": "commit"}, {"op": "program", "index": 1}, {"op": "commit", "index": "0"},
                {"op": "uncommit", "index": 0, "base": 0}):  # fmt: skip
        kind, body = engine.handle(HDM, json.dumps(req).encode())
        assert kind == HDM and json.loads(body)["reason"] == "bad_field", req
    assert engine.device.counters["internal_errors"] == 0

    def buggy(self, index):
        raise TypeError("a bug")

    monkeypatch.setattr(HdmDecoderSet, "commit", buggy)
    kind, body = engine.handle(HDM, json.dumps({"op": "commit", "index": 1}).encode())
    assert body.startswith(b"internal:") and engine.device.counters["internal_errors"] == 1


def _cli(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "kvcxl.cli.main", *args], check=False).returncode


@pytest.mark.slow
def test_acceptance_soak_one_million_ops(tmp_path):
    out = tmp_path / "soak.json"
    assert _cli("device", "soak", "--ops", "1000000", "--json", str(out)) == 0
    r = json.loads(out.read_text())
    assert r["ops"] == 1_000_000 and r["mismatched_bytes"] == 0 and r["wrong_victims"] == 0
    assert r["poison_checks"] > 900 and r["poison_errors"] == 0
    assert r["migrations"] > 100_000 and len(r["setups"]) >= 4


@pytest.mark.slow
def test_acceptance_fuzz_one_hundred_thousand_cases(tmp_path):
    out = tmp_path / "fuzz.json"
    assert _cli("device", "fuzz", "--cases", "100000", "--json", str(out)) == 0
    r = json.loads(out.read_text())
    assert r["cases"] == 100_000 and r["crashes"] == 0
    assert sum(r["return_codes"].values()) == 100_000
