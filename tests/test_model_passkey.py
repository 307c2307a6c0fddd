"""The passkey task (model/passkey.py): generator, scorer, and the full-cache invariant.

Short prompts (~300 tokens) on the real model; the documented run is in docs/model.md.
"""

from __future__ import annotations

import json

import pytest

from kvcxl.common.sizes import FRACTION, Budget
from kvcxl.emu.metrics import wilson_ci
from kvcxl.firmware.config import PolicyConfig
from kvcxl.model import passkey as pk
from kvcxl.model.quality import PolicySpec


@pytest.fixture(scope="module")
def model():
    from kvcxl.model.capture import shared_model

    return shared_model(1)


@pytest.fixture(scope="module")
def short(model):
    _, tok = model
    return pk.generate(tok, prompts=2, depths=[0.0, 0.5, 1.0], min_tokens=300, seed=7)


def test_score_is_exact_match_of_the_first_number() -> None:
    assert pk.score(" 40213. It", "40213")
    assert pk.score("The pass key is 40213", "40213")
    assert not pk.score(" 4021", "40213")  # too short
    assert not pk.score(" 402135", "40213")  # a longer number is not the key
    assert not pk.score(" 40 213", "40213")
    assert not pk.score(" 11111 then 40213", "40213")  # the first number counts
    assert not pk.score(" a magical item", "40213")


def test_wilson_interval_against_textbook_values() -> None:
    """Wilson 95 % bounds, written out here from the formula's closed forms at 0 and n."""
    z2 = 1.959964**2
    assert wilson_ci(0, 20)["hi"] == pytest.approx(z2 / (20 + z2), abs=1e-4)  # 0.1611
    assert wilson_ci(20, 20)["lo"] == pytest.approx(20 / (20 + z2), abs=1e-4)  # 0.8389
    assert wilson_ci(0, 20)["lo"] == 0.0 and wilson_ci(20, 20)["hi"] == 1.0
    half = wilson_ci(10, 20)
    assert (half["lo"], half["hi"]) == pytest.approx((0.2993, 0.7007), abs=1e-4)
    with pytest.raises(ValueError, match="successes = 21"):
        wilson_ci(21, 20)


def test_budget_fractions() -> None:
    def fraction(text: str) -> float:
        return Budget.parse(text, FRACTION).resolve()

    assert fraction("25%") == 0.25 and fraction("0.5") == 0.5 and fraction("all") == 1.0
    for bad in ("0", "150%", "x", "nan"):
        with pytest.raises(ValueError, match="accepted"):
            fraction(bad)
    # 25 % of a 300-token prompt's 19 blocks: 4 whole blocks; 'all' covers prompt and answer.
    assert pk.budget_tokens(0.25, 300, 307, 16) == 64
    assert pk.budget_tokens(1.0, 300, 307, 16) == 320
    assert pk.budget_tokens(0.01, 300, 307, 16) == 16  # at least one block


@pytest.mark.slow
@pytest.mark.model
def test_generator_is_seeded_long_enough_and_places_the_needle(model, short) -> None:
    _, tok = model
    assert len(short) == 6
    for q in short:
        text = tok.decode(q.tokens)
        assert len(q.tokens) >= 300 and len(q.passkey) == 5 and q.passkey[0] != "0"
        assert text.count(q.passkey) == 2  # the needle says it twice, nowhere else
        assert text.endswith(pk.QUESTION)
        needle = tok.decode(q.tokens[q.needle_token :])
        assert needle.lstrip().startswith(pk.NEEDLE.format(key=q.passkey)), needle[:60]
    first = {q.depth: q for q in short if q.index == 0}
    # Depth 0: only the instruction comes before the needle; depth 1: only the question after.
    assert tok.decode(first[0.0].tokens[: first[0.0].needle_token]).strip() == pk.INTRO.strip()
    q1 = first[1.0]
    tail = tok.decode(q1.tokens[q1.needle_token :]).strip()
    assert tail == pk.NEEDLE.format(key=q1.passkey) + pk.QUESTION, tail
    assert 0.4 < first[0.5].measured_depth < 0.6, first[0.5].measured_depth
    again = pk.generate(tok, prompts=3, depths=[0.5], min_tokens=300, seed=7)
    mid = [q for q in short if q.depth == 0.5]
    assert [q.tokens for q in again[:2]] == [q.tokens for q in mid]  # more prompts: same first
    other = pk.generate(tok, prompts=2, depths=[0.5], min_tokens=300, seed=8)
    assert {q.passkey for q in other}.isdisjoint({q.passkey for q in mid})
    assert len({q.passkey for q in short}) == len(short)


@pytest.mark.slow
@pytest.mark.model
def test_full_budget_bounded_path_equals_the_unbounded_answer(model, short) -> None:
    """Budget 'all': nothing is evicted, and every answer token equals the full cache's; a
    small recent-only window that drops an early needle cannot answer (the mask is real)."""
    m, tok = model
    specs = [PolicySpec.parse("ema"), PolicySpec.parse("sink-window"), PolicySpec.parse("window")]
    early = [q for q in short if q.depth == 0.0]
    rows = [
        pk.run_prompt(m, tok, q, specs, [0.25, 1.0], config=PolicyConfig(), answer_tokens=7)
        for q in early
    ]
    for row in rows:
        assert row["full"]["correct"], row["full"]  # the model solves the short task
        assert row["capture_agrees"]  # one-row decode = the chunked capture's greedy tokens
        by = {(r["policy"], r["budget"]): r for r in row["runs"]}
        for spec in specs:
            r = by[(spec.label, 1.0)]
            assert r["same_as_full"] and r["evictions"] == 0, r
            assert r["answer"] == row["full"]["answer"] and r["correct"]
            assert r["hit_rate"] == 1.0
        small = by[("window", 0.25)]
        assert small["evictions"] > 0 and not small["correct"], small
    summary = pk.summarize(rows)
    acc = {(s["policy"], s["budget"]): s["accuracy"] for s in summary}
    assert acc[("full", 1.0)] == acc[("ema", 1.0)] == 1.0 and acc[("window", 0.25)] == 0.0


@pytest.mark.slow
@pytest.mark.model
def test_cli_writes_json_and_resumes(model, tmp_path, capsys) -> None:
    from kvcxl.cli.main import main

    js, png = tmp_path / "p.json", tmp_path / "p.png"
    argv = ["trace", "passkey", "--prompts", "1", "--min-tokens", "200", "--depths", "0.9",
            "--budgets", "50%", "--policies", "sink-window", "--json", str(js)]  # fmt: skip
    assert main(argv) == 0
    first = json.loads(js.read_text())
    assert first["evidence"] == {"accuracy": "Measured", "hit_rate": "Simulated"}
    assert [(r["depth"], r["index"]) for r in first["prompts"]] == [(0.9, 0)]
    row = first["prompts"][0]
    # Resuming with one more prompt runs only the new one; the finished row is kept as it was.
    assert main([*argv[:3], "2", *argv[4:], "--plot", str(png)]) == 0
    second = json.loads(js.read_text())
    assert second["prompts"][0] == row and len(second["prompts"]) == 2
    assert png.stat().st_size > 0
    names = {(s["policy"], s["depth"]) for s in second["summary"]}
    assert names == {("full", 0.9), ("sink-window", 0.9)}
    assert all(s["prompts"] == 2 for s in second["summary"])
    capsys.readouterr()
    assert main([*argv[:-2], "--json", str(js), "--seed", "3"]) == 2  # other settings: refused
    assert "other settings" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--depths", "0.5,1.5", "'1.5'"),
        ("--budgets", "0%", "'0%'"),
        ("--policies", "ema,nope", "'nope'"),
        ("--digits", "19", "19"),
        ("--resume", "/nonexistent/p.json", "/nonexistent/p.json"),
    ],
)
def test_cli_refuses_bad_lists(flag, value, named, capsys) -> None:
    from kvcxl.cli.main import main

    try:
        code = main(["trace", "passkey", flag, value])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and named in err[0], err
