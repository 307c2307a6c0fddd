"""Bounded model checks of the engines (yowasp-sby), and proof that each can fail: every
planted defect must turn its check into a FAIL (a counterexample)."""

from __future__ import annotations

import pytest

from kvcxl.rtl.designs import CHECKS, DEFECTS

pytestmark = [pytest.mark.slow, pytest.mark.hdl]


@pytest.mark.parametrize("check", CHECKS)
def test_bounded_proof_passes(check):
    from kvcxl.rtl.formal import run

    r = run(check)
    assert r.status == "PASS", r.log_tail


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_planted_defect_fails_its_proof(defect):
    from kvcxl.rtl.formal import run

    r = run(DEFECTS[defect], defect=defect)
    assert r.status == "FAIL", r.log_tail


def test_every_check_has_a_defect_to_catch():
    assert set(DEFECTS.values()) == set(CHECKS)


def test_a_defect_runs_only_against_its_own_check():
    from kvcxl.rtl.formal import run

    with pytest.raises(ValueError, match="hdm check takes"):
        run("hdm", defect="drop_on_stall")


def test_cli_formal_writes_json(tmp_path):
    import json

    from kvcxl.cli.main import main

    out = tmp_path / "formal.json"
    assert main(["rtl", "formal", "--check", "hdm", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["checks"][0]["status"] == "PASS"
    # A planted defect is expected to FAIL: the command succeeds when it does.
    assert main(["rtl", "formal", "--defect", "mis_interleave", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["checks"]
    assert [(c["check"], c["status"]) for c in r] == [("hdm", "FAIL")]


def test_cli_refuses_a_defect_for_another_check(capsys):
    from kvcxl.cli.main import main

    assert main(["rtl", "formal", "--check", "scoring", "--defect", "drop_on_stall"]) == 2
    assert "frontend" in capsys.readouterr().err
