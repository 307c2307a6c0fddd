"""Bounded model checks of the engines (yowasp-sby), and proof that they can fail."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.hdl]


@pytest.mark.parametrize("check", ["eviction", "scoring"])
def test_bounded_proof_passes(check):
    from kvcxl.rtl.formal import run

    r = run(check)
    assert r.status == "PASS", r.log_tail


def test_planted_tie_break_defect_fails_the_proof():
    from kvcxl.rtl.formal import run

    r = run("eviction", defect="tie_off_by_one")
    assert r.status == "FAIL", r.log_tail


def test_cli_formal_writes_json(tmp_path):
    import json

    from kvcxl.emu.cli import main

    out = tmp_path / "formal.json"
    assert main(["rtl", "formal", "--check", "scoring", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["checks"][0]["status"] == "PASS"
